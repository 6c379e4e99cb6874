//! The reader task: the only owner of the socket's read half.
//!
//! It decodes every complete frame already buffered before reading again, routes MESSAGE to
//! its subscription (awaiting buffer space: a full subscription back-pressures the socket),
//! RECEIPT to its waiter, and ends the connection on ERROR, EOF, a decode error or — when
//! heart-beats were negotiated — a silent broker. Whatever ends it, `Shared::close` runs with
//! the cause, so every waiter learns it.

use std::sync::Arc;
use std::time::Duration;

use crate::transport::ReadHalf;
use bytes::BytesMut;
use haven_stomp::{release_large_read_buffer, Command, Frame, Item, StompCodec};
use tokio::io::AsyncReadExt;
use tokio::task::AbortHandle;
use tokio_util::codec::Decoder;

use crate::shared::Shared;
use crate::{ClientError, Message};

/// How long the broker may stay silent, given the negotiated interval it promised to send at:
/// twice the interval, and at least one second more than it (scheduling and network slack).
pub(crate) fn silence_ms_max(heartbeat_recv_ms: u64) -> u64 {
    heartbeat_recv_ms
        .saturating_mul(2)
        .max(heartbeat_recv_ms.saturating_add(1000))
}

pub(crate) async fn run(
    socket: ReadHalf,
    buffered: BytesMut,
    codec: StompCodec,
    heartbeat_recv_ms: u64,
    shared: Arc<Shared>,
    writer: AbortHandle,
) {
    let reason = read_loop(socket, buffered, codec, heartbeat_recv_ms, &shared).await;
    tracing::debug!(reason = %reason, "stomp client connection ended");
    shared.close(reason);
    writer.abort();
}

async fn read_loop(
    mut socket: ReadHalf,
    mut buf: BytesMut,
    mut codec: StompCodec,
    heartbeat_recv_ms: u64,
    shared: &Shared,
) -> ClientError {
    let silence_ms = silence_ms_max(heartbeat_recv_ms);
    loop {
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(Item::Frame(frame))) => {
                    if let Err(reason) = dispatch(frame, shared).await {
                        return reason;
                    }
                }
                Ok(Some(Item::Heartbeat)) => {}
                Ok(None) => break,
                Err(e) => {
                    return ClientError::Protocol(format!("undecodable frame from broker: {e}"))
                }
            }
        }
        release_large_read_buffer(&mut buf);
        let read = if heartbeat_recv_ms > 0 {
            match tokio::time::timeout(Duration::from_millis(silence_ms), socket.read_buf(&mut buf))
                .await
            {
                Ok(read) => read,
                Err(_) => {
                    return ClientError::HeartbeatTimeout {
                        silent_ms: silence_ms,
                    }
                }
            }
        } else {
            socket.read_buf(&mut buf).await
        };
        match read {
            Ok(0) => return ClientError::Closed,
            Ok(_) => {}
            Err(e) => return e.into(),
        }
    }
}

/// Routes one frame. `Err` ends the connection with that reason.
async fn dispatch(frame: Frame, shared: &Shared) -> Result<(), ClientError> {
    match frame.command {
        Command::Message => {
            let mut message = Message::from_headers(frame.headers, frame.body);
            message.generation = shared.generation();
            match shared.subscription_sender(&message.subscription) {
                Some(tx) => {
                    let id = message.subscription.clone();
                    if tx.send(message).await.is_err() {
                        // The application dropped the Subscription: stop routing to it.
                        shared.remove_subscription(&id);
                    }
                }
                None => tracing::debug!(
                    subscription = %message.subscription,
                    "MESSAGE for a subscription this client does not hold; dropped"
                ),
            }
            Ok(())
        }
        Command::Receipt => {
            let id = frame.header("receipt-id").unwrap_or("");
            if !shared.complete_receipt(id) && !shared.forward_receipt(id) {
                tracing::debug!(receipt_id = id, "RECEIPT nobody waits for");
            }
            Ok(())
        }
        Command::Error => {
            let body = String::from_utf8_lossy(&frame.body).into_owned();
            let message = frame
                .header("message")
                .map(str::to_string)
                .unwrap_or_else(|| body.lines().next().unwrap_or("").to_string());
            let receipt_id = frame.header("receipt-id").map(str::to_string);
            Err(ClientError::Server {
                message,
                body,
                receipt_id,
            })
        }
        other => Err(ClientError::Protocol(format!(
            "unexpected {other:?} frame from broker"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_window_has_slack() {
        assert_eq!(silence_ms_max(100), 1100);
        assert_eq!(silence_ms_max(5000), 10_000);
        assert_eq!(silence_ms_max(u64::MAX), u64::MAX);
    }
}
