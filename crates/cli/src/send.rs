//! `haven send`: send `--count` copies of one body to a destination (ActiveMQ's
//! `activemq producer`), then say how many the broker confirmed.
//!
//! Every SEND goes through the failover client, which asks a RECEIPT for each and sends the
//! unconfirmed ones again after a reconnect (a Haven broker stores each once). So "confirmed"
//! means the broker has the message (on disk, for a persistent one) whether or not
//! `--receipt` is given; `--receipt` only makes each SEND wait for its RECEIPT before the next
//! one goes (latency-bound, like a careful application), where the default pipelines them and
//! waits for all at the end. With `--transaction-size N`, messages are confirmed by their
//! COMMIT instead.
//!
//! Each message carries `haven-send-seq` (1..=count) so a receiver can check order and
//! completeness.

use std::io::{IsTerminal, Read};
use std::path::PathBuf;
use std::time::Duration;

use bytes::Bytes;
use haven_client::{Client, ConnectionEvent};
use serde_json::json;
use tokio::sync::broadcast;

use crate::client_cmd::{self, ClientArgs, CmdError, EventLog, Progress, Result};

/// Header numbering the messages of one run, 1..=count.
pub const SEQ_HEADER: &str = "haven-send-seq";
/// A body read from a file or stdin is held in memory and sent `count` times; this bounds it.
/// (A broker's own frame limit is usually far lower and answers with an ERROR naming it.)
const BODY_BYTES_MAX: u64 = 64 * 1024 * 1024;
/// How often the final wait for RECEIPTs looks at the client's unconfirmed count.
const CONFIRM_POLL_MS: u64 = 5;
/// Headers the command sets itself; `--header` may not override them.
const RESERVED_HEADERS: &[&str] = &[
    "destination",
    "transaction",
    "receipt",
    "content-length",
    "persistent",
    SEQ_HEADER,
    "haven-producer",
    "haven-seq",
];
/// Bytes the `--size` payload repeats (readable, so `receive --print body` shows something).
const GENERATED_PATTERN: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyz";

#[derive(clap::Args, Debug, Clone)]
pub struct SendArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Messages to send.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: u64,
    /// The whole run (connect, send, confirm) may take at most this many milliseconds;
    /// otherwise it fails saying how far it got.
    #[arg(long = "timeout", value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// The body text; `-` reads it from stdin.
    #[arg(long, group = "body_source")]
    pub body: Option<String>,
    /// A generated body of this many bytes.
    #[arg(long = "size", value_name = "BYTES", group = "body_source")]
    pub size_bytes: Option<u64>,
    /// The body is this file's content.
    #[arg(long, group = "body_source")]
    pub file: Option<PathBuf>,
    /// Sent as the `persistent` header.
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set, num_args = 0..=1,
          default_missing_value = "true", value_name = "BOOL")]
    pub persistent: bool,
    /// Wait for each message's RECEIPT before sending the next.
    #[arg(long)]
    pub receipt: bool,
    /// Extra header on every message, NAME=VALUE (repeatable).
    #[arg(long = "header", value_name = "NAME=VALUE", value_parser = client_cmd::parse_header)]
    pub headers: Vec<(String, String)>,
    /// Send in transactions of this many messages (BEGIN ... COMMIT); the last may be smaller.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub transaction_size: Option<u64>,
    /// Pause between two sends, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 0)]
    pub delay_ms: u64,
}

/// Where the body comes from.
#[derive(Debug)]
enum BodySource {
    Text(String),
    Generated(u64),
    File(PathBuf),
    Stdin,
}

impl SendArgs {
    fn body_source(&self) -> Result<BodySource> {
        Ok(match (&self.body, self.size_bytes, &self.file) {
            (Some(b), _, _) if b == "-" => BodySource::Stdin,
            (Some(b), _, _) => BodySource::Text(b.clone()),
            (_, Some(n), _) => BodySource::Generated(n),
            (_, _, Some(path)) => BodySource::File(path.clone()),
            (None, None, None) if !std::io::stdin().is_terminal() => BodySource::Stdin,
            (None, None, None) => {
                return Err(CmdError::Args(
                    "no body: give --body TEXT, --size BYTES or --file PATH, or pipe it into stdin"
                        .into(),
                ))
            }
        })
    }

    fn validate(&self) -> Result<()> {
        for (name, _) in &self.headers {
            if RESERVED_HEADERS.contains(&name.to_ascii_lowercase().as_str()) {
                let hint = if name.eq_ignore_ascii_case("persistent") {
                    " (use --persistent true|false)"
                } else {
                    ""
                };
                return Err(CmdError::Args(format!(
                    "--header {name}=...: haven send sets this header itself{hint}"
                )));
            }
        }
        Ok(())
    }
}

fn load_body(source: BodySource) -> Result<Bytes> {
    let read_bounded = |from: String, reader: &mut dyn Read| -> Result<Bytes> {
        let mut buf = Vec::new();
        reader
            .take(BODY_BYTES_MAX + 1)
            .read_to_end(&mut buf)
            .map_err(|source| CmdError::Body {
                from: from.clone(),
                source,
            })?;
        if buf.len() as u64 > BODY_BYTES_MAX {
            return Err(CmdError::BodyTooLarge {
                from,
                bytes_max: BODY_BYTES_MAX,
            });
        }
        Ok(Bytes::from(buf))
    };
    match source {
        BodySource::Text(text) => Ok(Bytes::from(text)),
        BodySource::Generated(n) => {
            if n > BODY_BYTES_MAX {
                return Err(CmdError::BodyTooLarge {
                    from: "--size".into(),
                    bytes_max: BODY_BYTES_MAX,
                });
            }
            Ok(GENERATED_PATTERN
                .iter()
                .copied()
                .cycle()
                .take(n as usize)
                .collect::<Vec<u8>>()
                .into())
        }
        BodySource::File(path) => {
            let from = path.display().to_string();
            let mut file = std::fs::File::open(&path).map_err(|source| CmdError::Body {
                from: from.clone(),
                source,
            })?;
            read_bounded(from, &mut file)
        }
        BodySource::Stdin => read_bounded("stdin".into(), &mut std::io::stdin().lock()),
    }
}

/// How far a run got; read after a timeout dropped the work in progress.
#[derive(Default)]
struct Tally {
    sent: u64,
    confirmed: u64,
    client: Option<Client>,
}

/// Runs `haven send`; prints the summary (also on failure) and returns the error for the exit
/// code.
pub async fn run(args: SendArgs) -> Result<()> {
    args.validate()?;
    let source = args.body_source()?;
    let body = tokio::task::spawn_blocking(move || load_body(source))
        .await
        .expect("reading the body does not panic")?;
    let mut progress = Progress::new(&args.client, Some(args.count), "sent");
    let mut tally = Tally::default();
    let mut log = EventLog::default();
    let work = send_all(&args, body, &mut tally, &mut log, &mut progress);
    let outcome = match args.timeout_ms {
        Some(ms) => match tokio::time::timeout(Duration::from_millis(ms), work).await {
            Ok(r) => r,
            Err(_) => Err(CmdError::SendTimeout {
                timeout_ms: ms,
                count: args.count,
                sent: tally.sent,
                confirmed: tally.confirmed,
            }),
        },
        None => work.await,
    };
    progress.finish();
    let elapsed = progress.elapsed();
    let reconnects = tally.client.as_ref().map_or(0, Client::reconnects);
    let rate = client_cmd::rate_per_s(tally.sent, elapsed);
    let json = json!({
        "command": "send",
        "destination": args.client.destination,
        "sent": tally.sent,
        "confirmed": tally.confirmed,
        "refused": log.refused,
        "elapsed_ms": elapsed.as_millis() as u64,
        "rate_msg_per_s": rate,
        "reconnects": reconnects,
        "brokers": log.brokers,
    });
    let text = format!(
        "sent {}, confirmed {} in {:.3} s ({rate:.0} msg/s), reconnects {reconnects}, broker(s) {}",
        tally.sent,
        tally.confirmed,
        elapsed.as_secs_f64(),
        if log.brokers.is_empty() {
            "none".to_string()
        } else {
            log.brokers.join(", ")
        },
    );
    client_cmd::print_summary(&args.client, json, &text, outcome.as_ref().err());
    outcome
}

async fn send_all(
    args: &SendArgs,
    body: Bytes,
    tally: &mut Tally,
    log: &mut EventLog,
    progress: &mut Progress,
) -> Result<()> {
    let client = client_cmd::connect(&args.client, args.client.connect_options(), None).await?;
    let (started, mut events) = EventLog::start(&client);
    *log = started;
    tally.client = Some(client.clone());
    let destination = args.client.destination.as_str();
    let persistent = if args.persistent { "true" } else { "false" };
    // Transaction ids only need to be unique on this connection.
    let tx_prefix = format!("haven-send-{}", std::process::id());
    let mut open_tx: Option<(String, u64)> = None;
    for seq in 1..=args.count {
        if seq > 1 && args.delay_ms > 0 {
            tokio::time::sleep(Duration::from_millis(args.delay_ms)).await;
        }
        if let (Some(_), None) = (args.transaction_size, &open_tx) {
            let id = format!("{tx_prefix}-{seq}");
            client
                .begin(&id)
                .await
                .map_err(|e| lost(e, log, &mut events, tally))?;
            open_tx = Some((id, 0));
        }
        let seq_text = seq.to_string();
        let mut headers: Vec<(&str, &str)> =
            vec![("persistent", persistent), (SEQ_HEADER, &seq_text)];
        headers.extend(args.headers.iter().map(|(k, v)| (k.as_str(), v.as_str())));
        if let Some((id, _)) = &open_tx {
            headers.push(("transaction", id));
        }
        let sent = if args.receipt && open_tx.is_none() {
            client
                .send_receipted(destination, &headers, body.clone())
                .await
        } else {
            client.send(destination, &headers, body.clone()).await
        };
        sent.map_err(|e| lost(e, log, &mut events, tally))?;
        tally.sent += 1;
        if args.receipt && open_tx.is_none() {
            tally.confirmed += 1;
        }
        if let Some((id, in_tx)) = &mut open_tx {
            *in_tx += 1;
            if Some(*in_tx) == args.transaction_size || seq == args.count {
                let batch = *in_tx;
                client
                    .commit(id)
                    .await
                    .map_err(|e| lost(e, log, &mut events, tally))?;
                tally.confirmed += batch;
                open_tx = None;
            }
        }
        progress.set(tally.sent);
    }
    if args.transaction_size.is_none() && !args.receipt {
        await_confirmations(&client, tally, log, &mut events).await?;
    }
    log.drain(&mut events);
    client.disconnect().await?;
    Ok(())
}

/// Waits until the client holds no unconfirmed SEND. A SEND refused by the broker (it answered
/// ERROR) also leaves the table, so refusals are counted from the events and reported.
async fn await_confirmations(
    client: &Client,
    tally: &mut Tally,
    log: &mut EventLog,
    events: &mut broadcast::Receiver<ConnectionEvent>,
) -> Result<()> {
    loop {
        log.drain(events);
        let unconfirmed = client.unconfirmed_sends() as u64;
        tally.confirmed = tally.sent.saturating_sub(unconfirmed + log.refused);
        if let Some(reason) = &log.failed {
            return Err(CmdError::Lost {
                after: format!("{} sent", tally.sent),
                reason: reason.clone(),
            });
        }
        if unconfirmed == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(CONFIRM_POLL_MS)).await;
    }
    if log.refused > 0 {
        return Err(CmdError::Refused {
            refused: log.refused,
            reason: log.refused_reason.clone().unwrap_or_default(),
        });
    }
    Ok(())
}

/// The error to report for a failed client call: when the client gave up, its reason for
/// giving up says more than the call's own error (often just "connection closed").
fn lost(
    e: haven_client::ClientError,
    log: &mut EventLog,
    events: &mut broadcast::Receiver<ConnectionEvent>,
    tally: &Tally,
) -> CmdError {
    log.drain(events);
    match (&e, &log.failed) {
        (haven_client::ClientError::Closed, Some(reason)) => CmdError::Lost {
            after: format!("{} sent", tally.sent),
            reason: reason.clone(),
        },
        _ => CmdError::Client(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_body_has_the_requested_size() {
        let body = load_body(BodySource::Generated(100)).unwrap();
        assert_eq!(body.len(), 100);
        assert!(body.starts_with(b"0123456789abc"));
        assert!(load_body(BodySource::Generated(BODY_BYTES_MAX + 1)).is_err());
    }
}
