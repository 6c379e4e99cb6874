//! Listening sockets, behind a trait.
//!
//! Production binds TCP. The deterministic simulation (`crates/sim`) binds the simulator's
//! network instead, so the connection code under test is the code that runs in production.
//! A connection is handed over as two boxed halves: one virtual call per poll is nothing next
//! to a system call, and it keeps the connection code free of type parameters.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use tokio::io::{AsyncRead, AsyncWrite};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// One accepted connection.
pub struct Accepted {
    pub read: ReadHalf,
    pub write: WriteHalf,
    pub peer: SocketAddr,
}

pub trait Listener: Send {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Accepted>>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
}

/// Where listeners come from.
pub trait Network: Send + Sync {
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>>;
}

/// The operating system's TCP.
pub struct TcpNetwork;

impl Network for TcpNetwork {
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let l = tokio::net::TcpListener::bind(addr).await?;
            Ok(Box::new(TcpListener(l)) as Box<dyn Listener>)
        })
    }
}

struct TcpListener(tokio::net::TcpListener);

impl Listener for TcpListener {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Accepted>> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
            // Small frames (RECEIPTs, ACKs) must not wait for Nagle.
            let _ = stream.set_nodelay(true);
            let (read, write) = stream.into_split();
            Ok(Accepted {
                read: Box::new(read),
                write: Box::new(write),
                peer,
            })
        })
    }
    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.0.local_addr()
    }
}
