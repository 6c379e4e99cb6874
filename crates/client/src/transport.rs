//! How a connection reaches a broker, behind a trait.
//!
//! Production dials TCP. The deterministic simulation (`crates/sim`) dials the simulator's
//! network, so the client code under test — failover, restore, duplicate filtering — is the
//! code applications run. A socket is handed over as two boxed halves, one per task (the
//! reader and the writer each own one).

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;
pub type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
pub type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;

/// Opens a byte stream to `host:port`.
pub trait Dial: Send + Sync {
    fn dial<'a>(&'a self, authority: &'a str) -> BoxFuture<'a, io::Result<(ReadHalf, WriteHalf)>>;
}

/// The dialer a connection uses: TCP unless another was given.
#[derive(Clone, Default)]
pub struct Dialer(Option<Arc<dyn Dial>>);

impl Dialer {
    pub fn new(dial: impl Dial + 'static) -> Dialer {
        Dialer(Some(Arc::new(dial)))
    }

    pub(crate) async fn dial(&self, authority: &str) -> io::Result<(ReadHalf, WriteHalf)> {
        match &self.0 {
            Some(d) => d.dial(authority).await,
            None => {
                let stream = tokio::net::TcpStream::connect(authority).await?;
                // Small frames (SEND with receipt, ACK) must not wait for Nagle.
                stream.set_nodelay(true)?;
                let (r, w) = stream.into_split();
                Ok((Box::new(r), Box::new(w)))
            }
        }
    }
}

impl fmt::Debug for Dialer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(if self.0.is_some() {
            "Dialer(custom)"
        } else {
            "Dialer(tcp)"
        })
    }
}
