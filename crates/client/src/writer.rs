//! The writer task: the only owner of the socket's write half.
//!
//! Callers encode frames in their own task (so an unencodable frame is their error, returned
//! at once) and queue the bytes here. The writer batches whatever is queued into one
//! `write_all` — many producers, one syscall — and sends a heart-beat EOL when it has been idle
//! for the negotiated interval. It exits when every sender is gone (after flushing what was
//! queued, then shutting down the write side) or on a write error (which closes the connection).

use std::sync::Arc;
use std::time::Duration;

use crate::transport::WriteHalf;
use bytes::{Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::sync::mpsc;

use crate::shared::Shared;

/// Bytes gathered into one write before it is issued.
const WRITE_BATCH_BYTES_MAX: usize = 256 * 1024;

/// Queued bytes this large are written as they are rather than copied into a batch.
const DIRECT_WRITE_BYTES_MIN: usize = 64 * 1024;

pub(crate) async fn run(
    mut socket: WriteHalf,
    mut queue: mpsc::Receiver<Bytes>,
    heartbeat_send_ms: u64,
    shared: Arc<Shared>,
) {
    let mut batch = BytesMut::with_capacity(64 * 1024);
    loop {
        let first = if heartbeat_send_ms > 0 {
            match tokio::time::timeout(Duration::from_millis(heartbeat_send_ms), queue.recv()).await
            {
                Ok(Some(bytes)) => bytes,
                Ok(None) => break,
                Err(_idle) => Bytes::from_static(b"\n"),
            }
        } else {
            match queue.recv().await {
                Some(bytes) => bytes,
                None => break,
            }
        };
        if first.len() >= DIRECT_WRITE_BYTES_MIN {
            // Already one big write (a caller's batch of frames): no copy.
            if let Err(e) = socket.write_all(&first).await {
                tracing::debug!(error = %e, "stomp client write failed");
                shared.close(e.into());
                return;
            }
            continue;
        }
        batch.extend_from_slice(&first);
        while batch.len() < WRITE_BATCH_BYTES_MAX {
            match queue.try_recv() {
                Ok(bytes) => batch.extend_from_slice(&bytes),
                Err(_) => break,
            }
        }
        if let Err(e) = socket.write_all(&batch).await {
            tracing::debug!(error = %e, "stomp client write failed");
            shared.close(e.into());
            return;
        }
        batch.clear();
    }
    let _ = socket.shutdown().await;
}
