//! The broker's and the client's edges over turmoil: its network and its clock.

use haven_client::{BoxFuture as ClientFuture, Dial, ReadHalf, WriteHalf};
use haven_server::net::BoxFuture;
use haven_server::{Accepted, Clock, Listener, Network};
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;

/// Binds the simulator's TCP.
pub struct SimNetwork;

impl Network for SimNetwork {
    fn bind(&self, addr: SocketAddr) -> BoxFuture<'_, io::Result<Box<dyn Listener>>> {
        Box::pin(async move {
            let l = turmoil::net::TcpListener::bind(addr).await?;
            Ok(Box::new(SimListener(l)) as Box<dyn Listener>)
        })
    }
}

struct SimListener(turmoil::net::TcpListener);

impl Listener for SimListener {
    fn accept(&mut self) -> BoxFuture<'_, io::Result<Accepted>> {
        Box::pin(async move {
            let (stream, peer) = self.0.accept().await?;
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

/// Dials the simulator's TCP (host names are the simulation's host names).
pub struct SimDialer;

impl Dial for SimDialer {
    fn dial<'a>(
        &'a self,
        authority: &'a str,
    ) -> ClientFuture<'a, io::Result<(ReadHalf, WriteHalf)>> {
        Box::pin(async move {
            let stream = turmoil::net::TcpStream::connect(authority).await?;
            let (r, w) = stream.into_split();
            Ok((Box::new(r) as ReadHalf, Box::new(w) as WriteHalf))
        })
    }
}

/// The simulation's wall clock plus an offset a fault can move (a clock jump).
#[derive(Clone, Default)]
pub struct SimClock {
    offset_ms: Arc<AtomicI64>,
}

impl SimClock {
    pub fn jump(&self, delta_ms: i64) {
        self.offset_ms.fetch_add(delta_ms, Ordering::Relaxed);
    }
}

impl Clock for SimClock {
    fn now_ms(&self) -> u64 {
        let base = turmoil::since_epoch()
            .expect("SimClock used outside a simulation")
            .as_millis() as i64;
        (base + self.offset_ms.load(Ordering::Relaxed)).max(0) as u64
    }
}
