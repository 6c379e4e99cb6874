//! The Raft type configuration: what a log entry carries and what a member is.

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Members are numbered by the operator (`[[ha.members]] id = 1`); the number never changes.
pub type NodeId = u64;

openraft::declare_raft_types!(
    /// Haven's Raft: entries carry the broker's journal records.
    pub TypeConfig:
        D = Command,
        R = (),
        NodeId = NodeId,
        Node = Member,
        SnapshotData = tokio::fs::File,
        AsyncRuntime = crate::runtime::HavenRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Member>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Member>;

/// Where a member listens: its Raft port, and its STOMP port (announced to failover clients
/// once it leads; empty for a witness).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    pub raft: String,
    pub stomp: String,
    /// Votes and acknowledges entries, stores no message bodies, never leads (`witness.rs`).
    pub witness: bool,
}

impl Member {
    pub fn data(raft: String, stomp: String) -> Member {
        Member {
            raft,
            stomp,
            witness: false,
        }
    }
}

impl fmt::Display for Member {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.witness {
            write!(f, "raft={} witness", self.raft)
        } else {
            write!(f, "raft={} stomp={}", self.raft, self.stomp)
        }
    }
}

/// What one Raft entry asks every replica to do to its state journal.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Append these journal records, the first at `first_lsn`, the rest numbered after it.
    /// The leader numbered them; every replica's journal gets the same numbers, so a message's
    /// LSN means the same thing on every member.
    Records { first_lsn: u64, records: Blob },
    /// Delete the sealed journal segments wholly below this LSN: the leader's engine has no
    /// live record there (a journal checkpoint, replicated before this, keeps the numbering).
    Release { before_lsn: u64 },
}

/// Journal records packed back to back, each as a little-endian `u32` length then the payload.
/// Serialised as one byte string (one copy, not one call per byte); shared, not copied, by the
/// log cache and the replication streams.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Blob(pub Bytes);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

/// Packs records into a `Blob`.
pub fn pack_record(buf: &mut Vec<u8>, payload: &[u8]) {
    let len = u32::try_from(payload.len()).expect("a journal record is far below 4 GiB");
    buf.extend_from_slice(&len.to_le_bytes());
    buf.extend_from_slice(payload);
}

impl Blob {
    /// The records, in order. `Err` if the blob is malformed (a peer's bug or a damaged frame).
    pub fn records(&self) -> Result<Vec<&[u8]>, String> {
        let mut out = Vec::new();
        let mut rest = &self.0[..];
        while !rest.is_empty() {
            if rest.len() < 4 {
                return Err(format!(
                    "{} trailing bytes after the last record",
                    rest.len()
                ));
            }
            let len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
            rest = &rest[4..];
            if rest.len() < len {
                return Err(format!("a record of {len} bytes but {} left", rest.len()));
            }
            out.push(&rest[..len]);
            rest = &rest[len..];
        }
        Ok(out)
    }
}

impl Serialize for Blob {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Blob, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Blob;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a byte string")
            }
            fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
                Ok(Blob(Bytes::copy_from_slice(v)))
            }
            fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
                Ok(Blob(Bytes::from(v)))
            }
        }
        d.deserialize_bytes(V)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_round_trips_through_postcard_and_splits_back_into_records() {
        let mut v = Vec::new();
        pack_record(&mut v, b"one");
        pack_record(&mut v, b"");
        pack_record(&mut v, &[7u8; 300]);
        let b = Blob(v.into());
        let c = Command::Records {
            first_lsn: 9,
            records: b,
        };
        let bytes = postcard::to_allocvec(&c).unwrap();
        let back: Command = postcard::from_bytes(&bytes).unwrap();
        assert_eq!(back, c);
        let Command::Records { records, .. } = back else {
            unreachable!()
        };
        let r = records.records().unwrap();
        assert_eq!(r.len(), 3);
        assert_eq!(r[0], b"one");
        assert!(r[1].is_empty());
        assert_eq!(r[2], &[7u8; 300][..]);
    }

    #[test]
    fn a_truncated_blob_is_refused() {
        let mut v = Vec::new();
        pack_record(&mut v, b"hello");
        v.pop();
        assert!(Blob(v.into()).records().is_err());
        assert!(Blob(vec![1, 0].into()).records().is_err());
    }
}
