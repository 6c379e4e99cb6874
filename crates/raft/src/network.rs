//! Raft messages between members: one TCP connection per peer and direction, each request a
//! frame (`u32` length, postcard body) answered by one frame. openraft sends one request at a
//! time per peer and batches entries into it, so a connection never has two in flight.
//!
//! The same port answers the admin requests of `haven admin cluster` (`admin.rs`).

use crate::admin::{AdminRequest, AdminResponse};
use crate::types::{NodeId, Raft, TypeConfig};
use crate::witness::Gate;
use openraft::error::{
    InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable,
};
use openraft::network::{RPCOption, RaftNetwork, RaftNetworkFactory};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest, InstallSnapshotResponse,
    VoteRequest, VoteResponse,
};
use serde::{Deserialize, Serialize};
use std::io;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

/// Largest frame either side accepts: an AppendEntries is cut at `APPEND_BYTES_MAX` of records
/// plus one entry, a snapshot chunk is `snapshot_max_chunk_size`; a frame limit above both,
/// with room.
pub const FRAME_BYTES_MAX: u32 = 64 << 20;
/// Records one AppendEntries carries beyond its first entry: 4 MiB. openraft caps an append by
/// entries only (`max_payload_entries`), and an entry is a whole batch of journal records:
/// with 64 KiB messages an append grew to tens of MiB, a follower's answer missed its
/// deadline, heartbeats waited behind it, and the group lost its leader under load. The rest
/// goes in the next append (`PartialSuccess`).
const APPEND_BYTES_MAX: usize = 4 << 20;
const CONNECT_TIMEOUT_MS: u64 = 1_000;
/// A connection keeps its frame buffer between frames up to this size (a snapshot chunk may
/// grow it beyond; it is then let go).
const FRAME_BUF_KEPT_BYTES_MAX: usize = 8 << 20;

type Member = crate::types::Member;

#[derive(Serialize, Deserialize)]
pub enum Request {
    Append(AppendEntriesRequest<TypeConfig>),
    Vote(VoteRequest<NodeId>),
    Snapshot(InstallSnapshotRequest<TypeConfig>),
    Admin(AdminRequest),
}

#[derive(Serialize, Deserialize)]
pub enum Response {
    Append(Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>),
    Vote(Result<VoteResponse<NodeId>, RaftError<NodeId>>),
    Snapshot(Result<InstallSnapshotResponse<NodeId>, RaftError<NodeId, InstallSnapshotError>>),
    Admin(AdminResponse),
}

/// Encodes `value` into `buf` (a connection's, reused: see `FrameBuf`) and writes it as one
/// frame.
pub async fn write_frame<T: Serialize>(
    w: &mut OwnedWriteHalf,
    value: &T,
    buf: &mut FrameBuf,
) -> io::Result<()> {
    let buf = buf.take();
    buf.extend_from_slice(&[0; 4]);
    postcard::to_io(value, &mut *buf).map_err(|e| io::Error::other(e.to_string()))?;
    let len = u32::try_from(buf.len() - 4).map_err(|_| io::Error::other("frame over 4 GiB"))?;
    if len > FRAME_BYTES_MAX {
        return Err(io::Error::other(format!(
            "frame of {len} bytes over {FRAME_BYTES_MAX}"
        )));
    }
    buf[..4].copy_from_slice(&len.to_le_bytes());
    w.write_all(buf).await
}

/// Reads one frame into `buf` (a connection's, reused) and decodes it.
pub async fn read_frame<T: for<'de> Deserialize<'de>>(
    r: &mut BufReader<OwnedReadHalf>,
    buf: &mut FrameBuf,
) -> io::Result<T> {
    let len = r.read_u32_le().await?;
    if len > FRAME_BYTES_MAX {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame of {len} bytes over {FRAME_BYTES_MAX}"),
        ));
    }
    let buf = buf.take();
    buf.resize(len as usize, 0);
    r.read_exact(buf).await?;
    postcard::from_bytes(buf).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e.to_string()))
}

/// One connection's buffer for the frames it writes and reads, kept between frames.
///
/// An append carries up to `APPEND_BYTES_MAX` of records. Encoded into a new `Vec` each time,
/// it was grown by doubling (each growth a copy) into fresh pages the kernel had to fault in
/// and zero: a profile of the leader under scenario (c) put about 8% of its worker's time
/// there (BENCHMARKS.md, shared-nothing replication). Reused, the buffer settles at the
/// largest frame, within `FRAME_BUF_KEPT_BYTES_MAX`.
#[derive(Default)]
pub struct FrameBuf(Vec<u8>);

impl FrameBuf {
    /// The buffer, emptied; one that a large frame (a snapshot chunk) grew beyond what is
    /// kept is let go first.
    fn take(&mut self) -> &mut Vec<u8> {
        if self.0.capacity() > FRAME_BUF_KEPT_BYTES_MAX {
            self.0 = Vec::new();
        }
        self.0.clear();
        &mut self.0
    }
}

/// A connection to one address, re-dialled after any failure.
pub struct Conn {
    addr: String,
    stream: Option<(BufReader<OwnedReadHalf>, OwnedWriteHalf)>,
    buf: FrameBuf,
}

impl Conn {
    pub fn new(addr: String) -> Conn {
        Conn {
            addr,
            stream: None,
            buf: FrameBuf::default(),
        }
    }

    /// Sends `req` and waits for its answer, at most `timeout`. `Err(true)` if the peer could
    /// not be reached at all (openraft backs off then), `Err(false)` for a failure mid-call.
    pub async fn call(
        &mut self,
        req: &Request,
        timeout: Duration,
    ) -> Result<Response, (bool, io::Error)> {
        if self.stream.is_none() {
            let dial = tokio::time::timeout(
                Duration::from_millis(CONNECT_TIMEOUT_MS),
                TcpStream::connect(self.addr.as_str()),
            )
            .await;
            let stream = match dial {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => return Err((true, e)),
                Err(_) => {
                    return Err((
                        true,
                        io::Error::new(io::ErrorKind::TimedOut, "connect timed out"),
                    ))
                }
            };
            let _ = stream.set_nodelay(true);
            let (r, w) = stream.into_split();
            self.stream = Some((BufReader::with_capacity(256 << 10, r), w));
        }
        // Taken out for the exchange and put back only once the answer is read: a call that
        // is dropped half-way (openraft times its requests out itself) closes the connection,
        // so its late answer can never be read as the answer to the next request.
        let (mut r, mut w) = self.stream.take().expect("connected above");
        let buf = &mut self.buf;
        let exchange = async {
            write_frame(&mut w, req, buf).await?;
            read_frame::<Response>(&mut r, buf).await
        };
        match tokio::time::timeout(timeout, exchange).await {
            Ok(Ok(resp)) => {
                self.stream = Some((r, w));
                Ok(resp)
            }
            Ok(Err(e)) => Err((false, e)),
            Err(_) => Err((
                false,
                io::Error::new(io::ErrorKind::TimedOut, "no answer in time"),
            )),
        }
    }
}

/// Makes one `PeerNetwork` per replication target.
#[derive(Clone)]
pub struct NetworkFactory {
    /// Snapshot chunks are paced to at most this many bytes per second, so a catch-up does
    /// not take the disk and network from the leader's clients.
    pub catchup_bytes_per_sec: u64,
    /// This member's metrics once Raft runs, for the witness gate (`witness.rs`).
    pub metrics: Arc<OnceLock<crate::witness::Metrics>>,
    pub election_timeout_ms: u64,
}

impl RaftNetworkFactory<TypeConfig> for NetworkFactory {
    type Network = PeerNetwork;

    async fn new_client(&mut self, target: NodeId, node: &Member) -> PeerNetwork {
        PeerNetwork {
            target,
            conn: Conn::new(node.raft.clone()),
            catchup_bytes_per_sec: self.catchup_bytes_per_sec,
            sent: None,
            gate: node
                .witness
                .then(|| Gate::new(self.metrics.clone(), self.election_timeout_ms)),
        }
    }
}

pub struct PeerNetwork {
    target: NodeId,
    conn: Conn,
    catchup_bytes_per_sec: u64,
    /// When the current snapshot transfer started and how much of it has been sent.
    sent: Option<(Instant, u64)>,
    /// For a witness: appends wait for the data members (`witness.rs`).
    gate: Option<Gate>,
}

impl PeerNetwork {
    async fn rpc<E: std::error::Error>(
        &mut self,
        req: Request,
        option: &RPCOption,
    ) -> Result<Response, RPCError<NodeId, Member, E>> {
        self.conn
            .call(&req, crate::runtime::rpc_timeout(option.hard_ttl()))
            .await
            .map_err(|(unreachable, e)| {
                if unreachable {
                    RPCError::Unreachable(Unreachable::new(&e))
                } else {
                    RPCError::Network(NetworkError::new(&e))
                }
            })
    }
}

/// Bytes an entry adds to an append (its records; other entries are small).
fn entry_bytes(entry: &openraft::Entry<TypeConfig>) -> usize {
    match &entry.payload {
        openraft::EntryPayload::Normal(crate::types::Command::Records { records, .. }) => {
            records.0.len()
        }
        _ => 0,
    }
}

/// How many entries, of these sizes in order, one append carries: the first always (however
/// large: it must get through), then as many more as fit in `bytes_max` together with it.
fn entries_within(sizes: impl Iterator<Item = usize>, bytes_max: usize) -> usize {
    let mut total = 0;
    let mut n = 0;
    for size in sizes {
        total += size;
        if n > 0 && total > bytes_max {
            break;
        }
        n += 1;
    }
    n
}

fn remote<E: std::error::Error>(target: NodeId, e: E) -> RPCError<NodeId, Member, E> {
    RPCError::RemoteError(RemoteError::new(target, e))
}

fn mismatch<E: std::error::Error>() -> RPCError<NodeId, Member, E> {
    RPCError::Network(NetworkError::new(&io::Error::other(
        "answer of the wrong kind",
    )))
}

impl RaftNetwork<TypeConfig> for PeerNetwork {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        let mut rpc = rpc;
        let sent = entries_within(rpc.entries.iter().map(entry_bytes), APPEND_BYTES_MAX);
        let cut = sent < rpc.entries.len();
        rpc.entries.truncate(sent);
        let last_sent = rpc.entries.last().map(|e| e.log_id);
        if let (Some(gate), Some(last)) = (&mut self.gate, last_sent) {
            gate.admit(last.index).await;
        }
        match self.rpc(Request::Append(rpc), &option).await? {
            Response::Append(Ok(AppendEntriesResponse::Success)) if cut => {
                Ok(AppendEntriesResponse::PartialSuccess(last_sent))
            }
            Response::Append(Ok(r)) => Ok(r),
            Response::Append(Err(e)) => Err(remote(self.target, e)),
            _ => Err(mismatch()),
        }
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Member, RaftError<NodeId, InstallSnapshotError>>,
    > {
        // Pace the transfer: wait until the bytes already sent fit the rate.
        let now = Instant::now();
        let (started, sent) = match self.sent {
            Some((started, sent)) if rpc.offset > 0 => (started, sent),
            _ => (now, 0),
        };
        if self.catchup_bytes_per_sec > 0 {
            let due = Duration::from_secs_f64(sent as f64 / self.catchup_bytes_per_sec as f64);
            let elapsed = now.duration_since(started);
            if due > elapsed {
                tokio::time::sleep(due - elapsed).await;
            }
        }
        let len = rpc.data.len() as u64;
        let done = rpc.done;
        let resp = match self.rpc(Request::Snapshot(rpc), &option).await? {
            Response::Snapshot(Ok(r)) => r,
            Response::Snapshot(Err(e)) => return Err(remote(self.target, e)),
            _ => return Err(mismatch()),
        };
        self.sent = if done {
            None
        } else {
            Some((started, sent + len))
        };
        Ok(resp)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Member, RaftError<NodeId>>> {
        match self.rpc(Request::Vote(rpc), &option).await? {
            Response::Vote(Ok(r)) => Ok(r),
            Response::Vote(Err(e)) => Err(remote(self.target, e)),
            _ => Err(mismatch()),
        }
    }
}

/// Answers peers and admin commands on the Raft port until the listener fails.
pub async fn serve(listener: tokio::net::TcpListener, raft: Raft, admin: Arc<crate::admin::Admin>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!("raft port: accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let raft = raft.clone();
        let admin = admin.clone();
        tokio::spawn(async move {
            if let Err(e) = answer(stream, raft, admin).await {
                if e.kind() != io::ErrorKind::UnexpectedEof {
                    tracing::debug!(%peer, "raft connection ended: {e}");
                }
            }
        });
    }
}

async fn answer(stream: TcpStream, raft: Raft, admin: Arc<crate::admin::Admin>) -> io::Result<()> {
    let (r, mut w) = stream.into_split();
    let mut r = BufReader::with_capacity(256 << 10, r);
    let mut buf = FrameBuf::default();
    loop {
        let req: Request = read_frame(&mut r, &mut buf).await?;
        let resp = match req {
            Request::Append(rpc) => Response::Append(raft.append_entries(rpc).await),
            Request::Vote(_) if admin.repair.active() => {
                Response::Vote(Ok(crate::repair::refusal(&raft)))
            }
            Request::Vote(rpc) => Response::Vote(raft.vote(rpc).await),
            Request::Snapshot(rpc) => Response::Snapshot(raft.install_snapshot(rpc).await),
            Request::Admin(req) => Response::Admin(admin.handle(req).await),
        };
        write_frame(&mut w, &resp, &mut buf).await?;
    }
}

#[cfg(test)]
mod tests {
    use super::entries_within;

    #[test]
    fn an_append_is_cut_by_bytes_but_always_carries_one_entry() {
        let cut = |sizes: &[usize], max| entries_within(sizes.iter().copied(), max);
        assert_eq!(cut(&[], 10), 0);
        assert_eq!(cut(&[100], 10), 1, "a large first entry still goes");
        assert_eq!(cut(&[4, 4, 2, 1], 10), 3, "up to the limit, inclusive");
        assert_eq!(cut(&[4, 4, 3], 10), 2);
        assert_eq!(cut(&[0; 5000], 10), 5000, "small entries are not cut");
        assert_eq!(cut(&[6, 6, 6], 10), 1);
    }

    /// Frames of every size go through one reused buffer on each side, a small one after a
    /// large one included; a buffer grown past what is kept is let go.
    #[tokio::test]
    async fn frames_round_trip_through_reused_buffers() {
        use super::{read_frame, write_frame, FrameBuf, FRAME_BUF_KEPT_BYTES_MAX};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let sizes = [3, 4 << 20, 10, FRAME_BUF_KEPT_BYTES_MAX + 1, 0, 5];
        let sender = tokio::spawn(async move {
            let (_r, mut w) = tokio::net::TcpStream::connect(addr)
                .await
                .unwrap()
                .into_split();
            let mut buf = FrameBuf::default();
            for (i, n) in sizes.into_iter().enumerate() {
                write_frame(&mut w, &vec![i as u8; n], &mut buf)
                    .await
                    .unwrap();
                let kept = buf.0.capacity();
                assert!(kept >= n, "the buffer holds the frame just written");
            }
            assert!(buf.take().capacity() <= FRAME_BUF_KEPT_BYTES_MAX);
        });
        let (stream, _) = listener.accept().await.unwrap();
        let (r, _w) = stream.into_split();
        let mut r = tokio::io::BufReader::new(r);
        let mut buf = FrameBuf::default();
        for (i, n) in sizes.into_iter().enumerate() {
            let got: Vec<u8> = read_frame(&mut r, &mut buf).await.unwrap();
            assert_eq!(got, vec![i as u8; n], "frame {i}");
        }
        sender.await.unwrap();
    }
}
