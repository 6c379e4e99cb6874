//! Snapshots: the state journal's segment files, packed into one file.
//!
//! A snapshot is what a member needs instead of the log entries a snapshot lets the log purge:
//! the live part of the state journal. Building one hard-links the journal's segments (cheap,
//! and safe from the deletions later entries apply) and copies their used bytes into
//! `snapshots/current.snap` off the state machine's task. A lagging follower is sent that file in
//! chunks and installs it by writing the segments into a fresh journal directory and swapping
//! it in, so a backlog of millions of messages is streamed from disk to disk, never held in
//! memory.
//!
//! File layout: `HVNSNAP1`, then a `u32` length and the postcard-encoded `SnapshotMeta`, then a
//! `u32` segment count and, per segment, its base LSN and length (`u64` each) and its bytes.

use crate::state::Shared;
use crate::types::{SnapshotMeta, TypeConfig};
use haven_journal::{segment_file_name, Journal, Lsn};
use openraft::storage::Snapshot;
use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

const MAGIC: &[u8; 8] = b"HVNSNAP1";
/// A snapshot's meta is a membership and a few ids: anything larger is damage.
const META_BYTES_MAX: u32 = 1 << 20;
/// Segments in one snapshot: the journal's disk limit divided by the smallest segment.
const SEGMENTS_MAX: u32 = 1 << 20;

pub(crate) struct SnapshotFiles {
    data_dir: PathBuf,
    /// Serialises replacing `current.snap` (a build finishing against an install).
    replace: Mutex<()>,
}

fn bad(reason: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, reason.into())
}

impl SnapshotFiles {
    pub fn new(data_dir: &Path) -> SnapshotFiles {
        SnapshotFiles {
            data_dir: data_dir.to_path_buf(),
            replace: Mutex::new(()),
        }
    }

    pub fn state_dir(&self) -> PathBuf {
        self.data_dir.join("state")
    }
    fn dir(&self) -> PathBuf {
        self.data_dir.join("snapshots")
    }
    fn current_path(&self) -> PathBuf {
        self.dir().join("current.snap")
    }
    fn receiving_path(&self) -> PathBuf {
        self.dir().join("receiving.snap")
    }

    /// Completes or discards what a crash interrupted: a journal swap, a build, a receive.
    pub fn finish_interrupted_install(&self) -> io::Result<()> {
        std::fs::create_dir_all(self.dir())?;
        let state = self.state_dir();
        let new = self.data_dir.join("state.new");
        let old = self.data_dir.join("state.old");
        if !state.exists() && new.exists() {
            // `state.new` is complete and synced before the old journal is moved aside.
            std::fs::rename(&new, &state)?;
            crate::files::sync_dir(&self.data_dir)?;
        }
        for leftover in [new, old] {
            if leftover.exists() {
                std::fs::remove_dir_all(leftover)?;
            }
        }
        for entry in std::fs::read_dir(self.dir())? {
            let path = entry?.path();
            if path != self.current_path() {
                if path.is_dir() {
                    std::fs::remove_dir_all(&path)?;
                } else {
                    std::fs::remove_file(&path)?;
                }
            }
        }
        Ok(())
    }

    /// The meta of the current snapshot, if there is one.
    pub fn current_meta(&self) -> io::Result<Option<SnapshotMeta>> {
        match File::open(self.current_path()) {
            Ok(f) => Ok(Some(read_meta(&mut BufReader::new(f))?)),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The current snapshot: its meta and its file, read through one handle. Opening the path
    /// twice (once for the meta, once for the data) let a build that finished in between
    /// pair one snapshot's meta with the next one's bytes, and the follower sent them could
    /// only fail the install (`install` checks the two agree), which stops its Raft.
    pub async fn current(&self) -> io::Result<Option<Snapshot<TypeConfig>>> {
        let mut file = match File::open(self.current_path()) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let meta = read_meta(&mut BufReader::new(&mut file))?;
        // The whole file is the snapshot: it is sent from its first byte, header included.
        file.seek(io::SeekFrom::Start(0))?;
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(tokio::fs::File::from_std(file)),
        }))
    }

    /// A new, empty file to receive a snapshot into. The previous one is unlinked first,
    /// not truncated: a transfer given up for a newer one can still have a chunk's write in
    /// flight (tokio writes files on its blocking pool and returns before the write is
    /// done), and that write must land in the old file, not in the middle of the new one.
    pub async fn receiving_file(&self) -> io::Result<tokio::fs::File> {
        match tokio::fs::remove_file(self.receiving_path()).await {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        tokio::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(self.receiving_path())
            .await
    }

    /// Makes `path` the current snapshot unless the current one is newer.
    fn replace_current(&self, path: &Path, meta: &SnapshotMeta) -> io::Result<()> {
        let _guard = self.replace.lock().unwrap();
        if let Some(current) = self.current_meta()? {
            if current.last_log_id > meta.last_log_id {
                return std::fs::remove_file(path);
            }
        }
        std::fs::rename(path, self.current_path())?;
        crate::files::sync_dir(&self.dir())
    }
}

fn read_u32(r: &mut impl Read) -> io::Result<u32> {
    let mut b = [0u8; 4];
    r.read_exact(&mut b)?;
    Ok(u32::from_le_bytes(b))
}

fn read_u64(r: &mut impl Read) -> io::Result<u64> {
    let mut b = [0u8; 8];
    r.read_exact(&mut b)?;
    Ok(u64::from_le_bytes(b))
}

fn read_meta(r: &mut impl Read) -> io::Result<SnapshotMeta> {
    let mut magic = [0u8; 8];
    r.read_exact(&mut magic)?;
    if &magic != MAGIC {
        return Err(bad("not a Haven snapshot (bad magic)"));
    }
    let len = read_u32(r)?;
    if len > META_BYTES_MAX {
        return Err(bad(format!("snapshot meta of {len} bytes")));
    }
    let mut buf = vec![0u8; len as usize];
    r.read_exact(&mut buf)?;
    postcard::from_bytes(&buf).map_err(|e| bad(format!("snapshot meta: {e}")))
}

/// A snapshot being built: the state as of `meta`, hard-linked segment files.
pub struct Builder {
    shared: Arc<Shared>,
    meta: SnapshotMeta,
    /// `(base LSN, used bytes, hard link)`.
    segments: Vec<(Lsn, u64, PathBuf)>,
    links: PathBuf,
}

impl Builder {
    /// Captures the state as applied now. Runs on the state machine's task, so nothing is
    /// applied meanwhile.
    pub(crate) async fn capture(shared: Arc<Shared>) -> Builder {
        let (durable, target) = {
            let mut inner = shared.inner.lock().unwrap();
            let j = inner.journal();
            j.flush();
            (j.durable(), j.next_lsn() - 1)
        };
        let mut durable = durable;
        // A failed journal stops the broker; the build then fails below on the missing files.
        let _ = durable
            .wait_for(|d| d.as_ref().map_or(true, |d| *d >= target))
            .await;
        let mut inner = shared.inner.lock().unwrap();
        inner.snapshot_seq += 1;
        let seq = inner.snapshot_seq;
        let meta = SnapshotMeta {
            last_log_id: inner.last_applied,
            last_membership: inner.membership.clone(),
            snapshot_id: format!(
                "{}-{}-{seq}",
                inner.last_applied.map_or(0, |l| l.leader_id.term),
                inner.last_applied.map_or(0, |l| l.index)
            ),
        };
        let links = shared.files.dir().join(format!("building-{seq}"));
        let state_dir = shared.files.state_dir();
        let segments = inner.journal().segments();
        let mut linked = Vec::new();
        let mut link_all = || -> io::Result<()> {
            std::fs::create_dir_all(&links)?;
            for s in &segments {
                let name = segment_file_name(s.base_lsn);
                let link = links.join(&name);
                std::fs::hard_link(state_dir.join(&name), &link)?;
                linked.push((s.base_lsn, s.bytes, link));
            }
            Ok(())
        };
        if let Err(e) = link_all() {
            tracing::error!(
                "snapshot {}: cannot link the state journal's segments: {e}",
                meta.snapshot_id
            );
            linked.clear();
        }
        Builder {
            shared: shared.clone(),
            meta,
            segments: linked,
            links,
        }
    }

    pub(crate) async fn build(&mut self) -> io::Result<Snapshot<TypeConfig>> {
        let shared = self.shared.clone();
        let meta = self.meta.clone();
        let segments = std::mem::take(&mut self.segments);
        let links = self.links.clone();
        tokio::task::spawn_blocking(move || {
            let result = write_snapshot(&shared, &meta, &segments, &links);
            let _ = std::fs::remove_dir_all(&links);
            result
        })
        .await
        .expect("the snapshot writer does not panic")?;
        tracing::info!(snapshot = %self.meta.snapshot_id, "snapshot built");
        // The current snapshot: this one, or a newer one installed meanwhile.
        self.shared
            .files
            .current()
            .await?
            .ok_or_else(|| io::Error::other("no current snapshot after building one"))
    }
}

fn write_snapshot(
    shared: &Shared,
    meta: &SnapshotMeta,
    segments: &[(Lsn, u64, PathBuf)],
    links: &Path,
) -> io::Result<()> {
    if segments.is_empty() {
        return Err(io::Error::other("no segments captured"));
    }
    let tmp = links.with_extension("snap");
    let mut out = BufWriter::with_capacity(1 << 20, File::create(&tmp)?);
    out.write_all(MAGIC)?;
    let meta_bytes = postcard::to_allocvec(meta).expect("encoding to a Vec cannot fail");
    out.write_all(&(meta_bytes.len() as u32).to_le_bytes())?;
    out.write_all(&meta_bytes)?;
    out.write_all(&(segments.len() as u32).to_le_bytes())?;
    for (base, bytes, link) in segments {
        out.write_all(&base.to_le_bytes())?;
        out.write_all(&bytes.to_le_bytes())?;
        let mut f = File::open(link)?.take(*bytes);
        let copied = io::copy(&mut f, &mut out)?;
        if copied != *bytes {
            return Err(bad(format!(
                "segment {base} ended after {copied} of {bytes} bytes"
            )));
        }
    }
    let file = out.into_inner().map_err(|e| e.into_error())?;
    file.sync_all()?;
    shared.files.replace_current(&tmp, meta)
}

/// Writes the segments of the snapshot file at `path` into the directory `new` (created
/// empty), synced. Returns the snapshot's meta.
fn unpack(path: &Path, new: &Path) -> io::Result<SnapshotMeta> {
    let mut r = BufReader::with_capacity(1 << 20, File::open(path)?);
    let meta = read_meta(&mut r)?;
    if new.exists() {
        std::fs::remove_dir_all(new)?;
    }
    std::fs::create_dir_all(new)?;
    let count = read_u32(&mut r)?;
    // No segments: a witness's snapshot (an empty state journal).
    if count > SEGMENTS_MAX {
        return Err(bad(format!("snapshot with {count} segments")));
    }
    for _ in 0..count {
        let base = read_u64(&mut r)?;
        let bytes = read_u64(&mut r)?;
        let mut f = File::create(new.join(segment_file_name(base)))?;
        let copied = io::copy(&mut (&mut r).take(bytes), &mut f)?;
        if copied != bytes {
            return Err(bad(format!(
                "snapshot segment {base} ended after {copied} of {bytes} bytes"
            )));
        }
        f.sync_all()?;
    }
    if r.stream_position()? != std::fs::metadata(path)?.len() {
        return Err(bad("bytes after the last snapshot segment"));
    }
    crate::files::sync_dir(new)?;
    Ok(meta)
}

/// Makes the complete, synced directory `state.new` the state journal.
fn swap_in(files: &SnapshotFiles) -> io::Result<()> {
    let state = files.state_dir();
    let new = files.data_dir.join("state.new");
    let old = files.data_dir.join("state.old");
    if state.exists() {
        std::fs::rename(&state, &old)?;
    }
    std::fs::rename(&new, &state)?;
    crate::files::sync_dir(&files.data_dir)?;
    if old.exists() {
        std::fs::remove_dir_all(&old)?;
    }
    Ok(())
}

/// Rebuilds a damaged state journal from this member's current snapshot (or empty, if it has
/// none: then its Raft log was never purged and holds every entry). The entries after the
/// snapshot are applied again from the Raft log.
pub(crate) fn rebuild_state(files: &SnapshotFiles) -> io::Result<()> {
    let new = files.data_dir.join("state.new");
    if files.current_path().exists() {
        unpack(&files.current_path(), &new)?;
    } else {
        if new.exists() {
            std::fs::remove_dir_all(&new)?;
        }
        std::fs::create_dir_all(&new)?;
    }
    swap_in(files)
}

/// A witness "installs" a snapshot by keeping its meta alone, as a snapshot of no segments:
/// its state journal stays empty, and nothing of the data was written (`witness.rs`).
pub(crate) fn install_meta(shared: &Shared, meta: &SnapshotMeta) -> io::Result<()> {
    let files = &shared.files;
    let tmp = files.receiving_path();
    write_without_segments(&tmp, meta)?;
    {
        let mut inner = shared.inner.lock().unwrap();
        inner.last_applied = meta.last_log_id;
        inner.membership = meta.last_membership.clone();
    }
    files.replace_current(&tmp, meta)?;
    tracing::info!(snapshot = %meta.snapshot_id, "snapshot meta kept (witness)");
    Ok(())
}

/// Writes a snapshot of `meta` and no segments at `path`, synced.
fn write_without_segments(path: &Path, meta: &SnapshotMeta) -> io::Result<()> {
    let mut out = File::create(path)?;
    out.write_all(MAGIC)?;
    let meta_bytes = postcard::to_allocvec(meta).expect("encoding to a Vec cannot fail");
    out.write_all(&(meta_bytes.len() as u32).to_le_bytes())?;
    out.write_all(&meta_bytes)?;
    out.write_all(&0u32.to_le_bytes())?;
    out.sync_all()
}

/// Installs the snapshot just received: its segments become the state journal.
pub(crate) fn install(shared: &Shared, meta: &SnapshotMeta) -> io::Result<()> {
    let files = &shared.files;
    let received = files.receiving_path();
    let new = files.data_dir.join("state.new");
    let file_meta = unpack(&received, &new)?;
    if file_meta.last_log_id != meta.last_log_id {
        return Err(bad(format!(
            "received snapshot is of {:?}, expected {:?}",
            file_meta.last_log_id, meta.last_log_id
        )));
    }
    let mut inner = shared.inner.lock().unwrap();
    assert!(inner.tap.is_none(), "a leader is never sent a snapshot");
    if let Some(journal) = inner.journal.take() {
        // Whatever it held is replaced; a failure to close only matters for that content.
        if let Err(e) = journal.close() {
            tracing::warn!("closing the replaced state journal: {e}");
        }
    }
    swap_in(files)?;
    let journal = Journal::open(inner.journal_config.clone(), |_, _| Ok(()))
        .map_err(|e| io::Error::other(format!("the installed state journal: {e}")))?;
    inner.journal = Some(journal);
    inner.last_applied = meta.last_log_id;
    inner.membership = meta.last_membership.clone();
    drop(inner);
    files.replace_current(&received, meta)?;
    tracing::info!(snapshot = %meta.snapshot_id, "snapshot installed");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn meta(index: u64) -> SnapshotMeta {
        SnapshotMeta {
            last_log_id: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                index,
            )),
            last_membership: Default::default(),
            snapshot_id: format!("1-{index}-{index}"),
        }
    }

    fn make_current(files: &SnapshotFiles, meta: &SnapshotMeta) {
        let tmp = files.dir().join("test.snap");
        write_without_segments(&tmp, meta).unwrap();
        files.replace_current(&tmp, meta).unwrap();
    }

    /// The meta a snapshot is sent with is the meta its bytes start with, and the bytes are
    /// the whole file, even when a newer snapshot replaces it while it is being sent.
    #[tokio::test]
    async fn the_current_snapshot_is_one_file_from_its_first_byte() {
        let dir = tempfile::tempdir().unwrap();
        let files = SnapshotFiles::new(dir.path());
        files.finish_interrupted_install().unwrap();
        assert!(files.current().await.unwrap().is_none());
        make_current(&files, &meta(10));
        let mut sent = files.current().await.unwrap().unwrap();
        assert_eq!(sent.meta, meta(10));
        make_current(&files, &meta(20));
        let mut bytes = Vec::new();
        sent.snapshot.read_to_end(&mut bytes).await.unwrap();
        assert_eq!(read_meta(&mut &bytes[..]).unwrap(), meta(10));
        let newer = files.current().await.unwrap().unwrap();
        assert_eq!(newer.meta, meta(20));
    }

    /// A write through the file of a transfer given up lands outside the next transfer's file.
    #[tokio::test]
    async fn a_new_receiving_file_is_not_written_through_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        let files = SnapshotFiles::new(dir.path());
        files.finish_interrupted_install().unwrap();
        let mut old = files.receiving_file().await.unwrap();
        old.write_all(b"first transfer").await.unwrap();
        old.flush().await.unwrap();
        let mut new = files.receiving_file().await.unwrap();
        old.write_all(b", a late chunk").await.unwrap();
        old.flush().await.unwrap();
        new.write_all(b"second").await.unwrap();
        new.shutdown().await.unwrap();
        assert_eq!(std::fs::read(files.receiving_path()).unwrap(), b"second");
    }
}
