//! SIGHUP: `haven run --config FILE` re-reads FILE and applies its `[cluster]` table through
//! the server's [`ClusterHandle`], which announces the change to clients that asked for it.
//!
//! Only `[cluster]` takes effect without a restart. Every other table is compared with the file
//! as it was at start-up (not with the running settings, which `--stomp`/`--data` may
//! override): a difference is logged as needing a restart and otherwise ignored, on every
//! reload until the broker restarts. A file that cannot be read or does not validate is logged
//! and changes nothing.

use haven_server::config::{tables_changed, ConfigError};
use haven_server::{ClusterChange, ClusterHandle, Config};
use std::path::{Path, PathBuf};
use tokio::signal::unix::Signal;

/// Reads and validates a config file, keeping its text for later comparison.
pub(crate) fn load(path: &Path) -> Result<(Config, String), ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        file: path.to_path_buf(),
        source,
    })?;
    let config = Config::parse(&text, path)?;
    Ok((config, text))
}

/// Applies `path`'s `[cluster]` on every SIGHUP until the signal stream ends. `started_text`
/// is the file the broker started with.
pub(crate) async fn on_sighup(
    mut hup: Signal,
    path: PathBuf,
    started_text: String,
    cluster: ClusterHandle,
) {
    while hup.recv().await.is_some() {
        reload(&path, &started_text, &cluster);
    }
}

fn reload(path: &Path, started_text: &str, cluster: &ClusterHandle) {
    let file = path.display();
    let (config, text) = match load(path) {
        Ok(loaded) => loaded,
        Err(e) => {
            tracing::warn!(%file, error = %e, "SIGHUP: config not reloaded; running settings kept");
            return;
        }
    };
    let ignored: Vec<String> = tables_changed(started_text, &text)
        .into_iter()
        .filter(|table| table != "cluster")
        .collect();
    if !ignored.is_empty() {
        tracing::warn!(
            %file,
            tables = %ignored.join(", "),
            "SIGHUP: a change outside [cluster] needs a restart; ignored"
        );
    }
    match cluster.set_cluster(config.cluster) {
        // `set_cluster` logs what changed.
        Ok(ClusterChange::Applied | ClusterChange::Announced { .. }) => {}
        Ok(ClusterChange::Unchanged) => {
            tracing::info!(%file, "SIGHUP: config reloaded; [cluster] unchanged")
        }
        // `load` validated the same rules; kept as an error, not a panic, should they drift.
        Err(e) => {
            tracing::warn!(%file, error = %e, "SIGHUP: [cluster] refused; running settings kept")
        }
    }
}
