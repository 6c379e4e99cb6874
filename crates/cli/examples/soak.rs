//! The long chaos soak (issue 5): real `haven` brokers, failover clients and seeded random
//! faults for `--duration`, then healing and the no-loss / no-duplicate check.
//!
//! ```text
//! cargo build --release -p haven-cli --examples --bins
//! cargo run --release -p haven-cli --example soak -- --duration 30m --mode exactly-once
//! cargo run --release -p haven-cli --example soak -- --duration 30m --mode standalone --seed 7
//! cargo run --release -p haven-cli --example soak -- --duration 30m --mode replicated
//! ```
//!
//! The logic is `tests/support/soak.rs`, shared with the bounded CI run
//! (`tests/chaos_bounded.rs`). Exit status: 0 when the checker found nothing, 1 on any loss,
//! forbidden duplicate, order violation, client error or stuck client (the seed is printed to
//! replay the fault schedule), 2 when the run could not be set up. Broker data and logs are
//! kept (and their directory printed) when the run fails.

#[path = "../tests/support/soak.rs"]
mod soak;

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;

#[derive(Parser, Debug)]
#[command(about = "Chaos soak of Haven brokers and failover clients")]
struct Args {
    /// Length of the fault phase: `90s`, `30m`, `2h` (healing and the check come after it).
    #[arg(long, default_value = "10m", value_parser = parse_duration)]
    duration: Duration,
    /// Seed of the fault schedule (random when absent; printed either way).
    #[arg(long)]
    seed: Option<u64>,
    /// `exactly-once`: one broker restarted on its store; `standalone`: three separate stores.
    #[arg(long, default_value = "exactly-once", value_parser = parse_mode)]
    mode: soak::Mode,
    /// The `haven` binary (default: $HAVEN_BIN, else `haven` next to this example's directory).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Directory for broker data and logs (default: a new temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    soak::parse_duration(s).ok_or_else(|| format!("'{s}': expected e.g. 90s, 30m, 2h"))
}

fn parse_mode(s: &str) -> Result<soak::Mode, String> {
    soak::Mode::parse(s)
        .ok_or_else(|| format!("'{s}': expected exactly-once, standalone or replicated"))
}

/// `target/<profile>/examples/soak` -> `target/<profile>/haven`.
fn default_bin() -> Option<PathBuf> {
    if let Some(bin) = std::env::var_os("HAVEN_BIN") {
        return Some(PathBuf::from(bin));
    }
    let exe = std::env::current_exe().ok()?;
    let examples = exe.parent()?;
    [examples.join("haven"), examples.parent()?.join("haven")]
        .into_iter()
        .find(|p| p.is_file())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let args = Args::parse();
    let Some(bin) = args.bin.or_else(default_bin) else {
        eprintln!("no haven binary: build it (cargo build --release -p haven-cli --bins) or pass --bin / HAVEN_BIN");
        std::process::exit(2);
    };
    let seed = args.seed.unwrap_or_else(rand::random);
    let (dir, temp) = match args.dir {
        Some(dir) => (dir, None),
        None => {
            let temp = tempfile::Builder::new()
                .prefix("haven-soak-")
                .tempdir()
                .expect("create a temporary directory");
            (temp.path().to_path_buf(), Some(temp))
        }
    };
    eprintln!(
        "soak: mode {:?}, fault phase {:?}, seed {seed}, binary {}, data {}",
        args.mode,
        args.duration,
        bin.display(),
        dir.display()
    );
    let cfg = soak::SoakConfig {
        bin,
        dir: dir.clone(),
        mode: args.mode,
        duration: args.duration,
        seed,
    };
    match soak::run(&cfg).await {
        Ok(summary) => {
            println!("{summary}");
            if !summary.ok() {
                if let Some(temp) = temp {
                    let kept = temp.keep();
                    eprintln!("broker data and logs kept in {}", kept.display());
                }
                std::process::exit(1);
            }
        }
        Err(e) => {
            eprintln!("soak could not run (seed {seed}): {e}");
            if let Some(temp) = temp {
                eprintln!("broker data and logs kept in {}", temp.keep().display());
            }
            std::process::exit(2);
        }
    }
}
