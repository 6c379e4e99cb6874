//! The admin side of the Raft port, for `haven admin cluster` and tests.

use crate::admin::{AdminRequest, AdminResponse, Status};
use crate::network::{Conn, Request, Response};
use std::io;
use std::time::Duration;

/// How long one admin request may take. Adding a member waits for it to catch up, which with
/// a deep backlog takes a while.
pub const ADMIN_TIMEOUT_MS: u64 = 600_000;
const STATUS_TIMEOUT_MS: u64 = 2_000;
/// Redirects followed to reach the leader.
const REDIRECTS_MAX: usize = 3;

async fn call(addr: &str, req: AdminRequest, timeout_ms: u64) -> io::Result<AdminResponse> {
    let mut conn = Conn::new(addr.to_string());
    match conn
        .call(&Request::Admin(req), Duration::from_millis(timeout_ms))
        .await
    {
        Ok(Response::Admin(r)) => Ok(r),
        Ok(_) => Err(io::Error::other("answer of the wrong kind")),
        Err((_, e)) => Err(e),
    }
}

/// The member's view of the cluster.
pub async fn status(addr: &str) -> io::Result<Status> {
    match call(addr, AdminRequest::Status, STATUS_TIMEOUT_MS).await? {
        AdminResponse::Status(s) => Ok(s),
        other => Err(io::Error::other(format!("unexpected answer {other:?}"))),
    }
}

/// Tells member `addr` to stand for election now if it is still in `term` (a leader handing
/// over to it). Not redirected: it is meant for that member.
pub async fn elect(addr: &str, term: u64) -> io::Result<()> {
    match call(addr, AdminRequest::Elect { term }, STATUS_TIMEOUT_MS).await? {
        AdminResponse::Done(_) => Ok(()),
        AdminResponse::Failed(s) => Err(io::Error::other(s)),
        other => Err(io::Error::other(format!("unexpected answer {other:?}"))),
    }
}

/// Tells member `addr`, found empty as incarnation `incarnation`, that the group it belongs
/// to was just initialised (`AdminRequest::NewGroup`).
pub async fn new_group(addr: &str, incarnation: u64) -> io::Result<()> {
    match call(
        addr,
        AdminRequest::NewGroup { incarnation },
        STATUS_TIMEOUT_MS,
    )
    .await?
    {
        AdminResponse::Done(_) => Ok(()),
        AdminResponse::Failed(s) => Err(io::Error::other(s)),
        other => Err(io::Error::other(format!("unexpected answer {other:?}"))),
    }
}

/// Sends a membership change (or a leadership transfer) to `addr`, following the answer to the leader.
pub async fn change(addr: &str, req: AdminRequest) -> io::Result<String> {
    let mut addr = addr.to_string();
    for _ in 0..=REDIRECTS_MAX {
        match call(&addr, req.clone(), ADMIN_TIMEOUT_MS).await? {
            AdminResponse::Done(s) => return Ok(s),
            AdminResponse::Failed(s) => return Err(io::Error::other(s)),
            AdminResponse::NotLeader {
                leader: Some((_, m)),
            } => addr = m.raft,
            AdminResponse::NotLeader { leader: None } => {
                return Err(io::Error::other("no leader right now; try again"))
            }
            AdminResponse::Status(_) => return Err(io::Error::other("unexpected status answer")),
        }
    }
    Err(io::Error::other("the leader kept moving; try again"))
}
