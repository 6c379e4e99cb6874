//! The store's identity: a random id created with the data directory and kept in
//! `<dir>/store-id`, announced to clients as `haven-store` in CONNECTED.
//!
//! Message ids (`ID:haven-<seq>`) are only unique within one store, so a failover client keys
//! its duplicate filter by `(store, message-id)`: after a failover to a broker with the *same*
//! store (the same broker restarted; later a shared-store or replicated group) a redelivery
//! is recognised, and after one to a broker with a different store an equal id is not mistaken
//! for one.

use std::io::Write;
use std::path::Path;

use crate::error::ServerError;

const FILE: &str = "store-id";
/// Hex digits of an id (128 random bits).
const ID_HEX_LEN: usize = 32;

/// Reads the store id, creating it (durably: temp file, fsync, rename, fsync of the directory)
/// on first start.
pub(crate) fn load_or_create(dir: &Path) -> Result<String, ServerError> {
    let path = dir.join(FILE);
    let bad = |reason: String| ServerError::DataDir {
        dir: dir.to_path_buf(),
        reason,
    };
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let id = text.trim();
            if id.len() != ID_HEX_LEN || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(bad(format!(
                    "{} is damaged: expected {ID_HEX_LEN} hex digits, found {id:?}",
                    path.display()
                )));
            }
            Ok(id.to_string())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let id = random_id().map_err(|e| bad(format!("cannot read /dev/urandom: {e}")))?;
            let tmp = dir.join(format!("{FILE}.tmp"));
            let write = || -> std::io::Result<()> {
                let mut f = std::fs::File::create(&tmp)?;
                writeln!(f, "{id}")?;
                f.sync_all()?;
                std::fs::rename(&tmp, &path)?;
                std::fs::File::open(dir)?.sync_all()
            };
            write().map_err(|e| bad(format!("cannot create {}: {e}", path.display())))?;
            Ok(id)
        }
        Err(e) => Err(bad(format!("cannot read {}: {e}", path.display()))),
    }
}

/// 128 bits from the kernel's random source, as hex.
fn random_id() -> std::io::Result<String> {
    use std::io::Read;
    let mut bytes = [0u8; ID_HEX_LEN / 2];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn created_once_then_read_back_and_damage_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let id = load_or_create(dir.path()).unwrap();
        assert_eq!(id.len(), ID_HEX_LEN);
        assert_eq!(load_or_create(dir.path()).unwrap(), id);
        let other = tempfile::tempdir().unwrap();
        assert_ne!(load_or_create(other.path()).unwrap(), id);
        std::fs::write(dir.path().join(FILE), "not-an-id\n").unwrap();
        assert!(matches!(
            load_or_create(dir.path()),
            Err(ServerError::DataDir { .. })
        ));
    }
}
