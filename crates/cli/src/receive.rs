//! `haven receive`: consume from a destination (ActiveMQ's `activemq consumer`), print each
//! message, and stop after `--count` messages or `--timeout` ms without one.
//!
//! The default `client-individual` mode acks each message after it is printed, so a message
//! is never lost to a crash between receipt and output: at worst it is printed again (with
//! `redelivered:true`). `auto` lets the broker forget a message once written to the socket,
//! which also means that messages the broker already pushed beyond `--count` are consumed
//! without being printed; the prefetch below is capped by the count to keep that window, and
//! the redeliveries after a stop in the ack modes, small.

use std::io::Write;
use std::time::Duration;

use haven_client::{AckMode, Client, ConnectionEvent, Message};
use serde_json::json;
use tokio::sync::broadcast;

use crate::client_cmd::{self, ClientArgs, CmdError, EventLog, Progress, Result};

/// Upper bound on the subscription's prefetch (`activemq.prefetchSize`); lowered to `--count`
/// so the broker does not push messages this run will not consume.
const PREFETCH_MESSAGES_MAX: u64 = 1_000;

#[derive(clap::Args, Debug, Clone)]
pub struct ReceiveArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Stop after this many messages (default: until --timeout, or forever).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub count: Option<u64>,
    /// Stop after this many milliseconds without a message. Without --count that is a normal
    /// end (exit 0); with --count it is an error saying how many arrived.
    #[arg(long = "timeout", value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Acknowledgement mode; `client` and `client-individual` ack each message after printing.
    #[arg(long, value_enum, default_value_t = Ack::ClientIndividual)]
    pub ack: Ack,
    /// JMS selector, e.g. "priority > 4 AND region = 'eu'".
    #[arg(long)]
    pub selector: Option<String>,
    /// Durable topic subscription name (`activemq.subscriptionName`); needs --client-id.
    #[arg(long, value_name = "NAME", requires = "client_id")]
    pub durable: Option<String>,
    /// CONNECT `client-id`: the owner of durable subscriptions.
    #[arg(long)]
    pub client_id: Option<String>,
    /// What to print on stdout per message: the body, the headers (one JSON object per line)
    /// or nothing (just count).
    #[arg(long, value_enum, default_value_t = Print::Body)]
    pub print: Print,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ack {
    Auto,
    Client,
    ClientIndividual,
}

impl Ack {
    fn mode(self) -> AckMode {
        match self {
            Ack::Auto => AckMode::Auto,
            Ack::Client => AckMode::Client,
            Ack::ClientIndividual => AckMode::ClientIndividual,
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Print {
    Body,
    Headers,
    None,
}

#[derive(Default)]
struct Tally {
    received: u64,
    redelivered: u64,
}

/// Runs `haven receive`; prints the summary (also on failure) and returns the error for the
/// exit code.
pub async fn run(args: ReceiveArgs) -> Result<()> {
    let mut progress = Progress::new(&args.client, args.count, "received");
    let mut tally = Tally::default();
    let mut log = EventLog::default();
    let mut reconnects = 0;
    let outcome = receive_all(&args, &mut tally, &mut log, &mut reconnects, &mut progress).await;
    progress.finish();
    let elapsed = progress.elapsed();
    let rate = client_cmd::rate_per_s(tally.received, elapsed);
    let json = json!({
        "command": "receive",
        "destination": args.client.destination,
        "received": tally.received,
        "redelivered": tally.redelivered,
        "elapsed_ms": elapsed.as_millis() as u64,
        "rate_msg_per_s": rate,
        "reconnects": reconnects,
        "brokers": log.brokers,
    });
    let text = format!(
        "received {} ({} redelivered) in {:.3} s ({rate:.0} msg/s), reconnects {reconnects}",
        tally.received,
        tally.redelivered,
        elapsed.as_secs_f64(),
    );
    client_cmd::print_summary(&args.client, json, &text, outcome.as_ref().err());
    outcome
}

async fn receive_all(
    args: &ReceiveArgs,
    tally: &mut Tally,
    log: &mut EventLog,
    reconnects: &mut u64,
    progress: &mut Progress,
) -> Result<()> {
    let mut opts = args.client.connect_options();
    opts.client_id = args.client_id.clone();
    let client = client_cmd::connect(&args.client, opts, args.timeout_ms).await?;
    let (started, mut events) = EventLog::start(&client);
    *log = started;
    let result = consume(args, &client, tally, log, &mut events, progress).await;
    *reconnects = client.reconnects();
    log.drain(&mut events);
    // Acks were sent without receipts; the receipted DISCONNECT makes the broker apply them
    // before the command reports success.
    let closed = client.disconnect().await;
    result?;
    closed.map_err(CmdError::from)
}

async fn consume(
    args: &ReceiveArgs,
    client: &Client,
    tally: &mut Tally,
    log: &mut EventLog,
    events: &mut broadcast::Receiver<ConnectionEvent>,
    progress: &mut Progress,
) -> Result<()> {
    let prefetch = args
        .count
        .map_or(PREFETCH_MESSAGES_MAX, |n| n.min(PREFETCH_MESSAGES_MAX))
        .to_string();
    let mut headers: Vec<(&str, &str)> = vec![("activemq.prefetchSize", &prefetch)];
    if let Some(selector) = &args.selector {
        headers.push(("selector", selector));
    }
    if let Some(name) = &args.durable {
        headers.push(("activemq.subscriptionName", name));
    }
    let mut sub = client
        .subscribe(&args.client.destination, args.ack.mode(), &headers)
        .await?;
    let mut stdout = std::io::stdout().lock();
    while args.count != Some(tally.received) {
        let next = next_message(&mut sub, events, args.timeout_ms);
        let msg = match next.await {
            Next::Message(m) => m,
            Next::Idle(timeout_ms) => {
                return match args.count {
                    Some(count) => Err(CmdError::CountNotReached {
                        timeout_ms,
                        count,
                        received: tally.received,
                    }),
                    None => Ok(()),
                }
            }
            Next::Failed(reason) => {
                log.failed.get_or_insert_with(|| reason.clone());
                return Err(CmdError::Lost {
                    after: format!("{} received", tally.received),
                    reason,
                });
            }
        };
        tally.received += 1;
        if msg.redelivered {
            tally.redelivered += 1;
        }
        print(&mut stdout, args.print, &msg).map_err(CmdError::Stdout)?;
        if args.ack != Ack::Auto {
            client.ack(&msg).await?;
        }
        progress.set(tally.received);
    }
    stdout.flush().map_err(CmdError::Stdout)
}

enum Next {
    Message(Message),
    /// `--timeout` ms passed without a message.
    Idle(u64),
    /// The client gave up reconnecting.
    Failed(String),
}

/// The next message, or why there is none. The client's event stream is watched alongside:
/// a `Client` subscription does not end when the client gives up (it keeps its own sender
/// for restores), so `Failed` is the only sign that nothing more will come.
async fn next_message(
    sub: &mut haven_client::Subscription,
    events: &mut broadcast::Receiver<ConnectionEvent>,
    timeout_ms: Option<u64>,
) -> Next {
    let idle = async {
        match timeout_ms {
            Some(ms) => tokio::time::sleep(Duration::from_millis(ms)).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(idle);
    // The stream closes only if the client is gone, which cannot happen while `sub`'s owner
    // holds it; if it does, stop listening rather than spin.
    let mut events_open = true;
    loop {
        tokio::select! {
            m = sub.next() => return match m {
                Some(m) => Next::Message(m),
                None => Next::Failed("the subscription ended".into()),
            },
            ev = events.recv(), if events_open => match ev {
                Ok(ConnectionEvent::Failed { reason }) => return Next::Failed(reason.to_string()),
                // Other events (and a lagging event stream) change nothing here.
                Ok(_) | Err(broadcast::error::RecvError::Lagged(_)) => {}
                Err(broadcast::error::RecvError::Closed) => events_open = false,
            },
            () = &mut idle => return Next::Idle(timeout_ms.unwrap_or(0)),
        }
    }
}

fn print(out: &mut impl Write, what: Print, msg: &Message) -> std::io::Result<()> {
    match what {
        Print::None => Ok(()),
        // The bytes as sent (binary bodies pass through unchanged), one message per line.
        Print::Body => {
            out.write_all(&msg.body)?;
            out.write_all(b"\n")
        }
        Print::Headers => {
            // STOMP's first-occurrence rule: a repeated header's later values are not seen by
            // applications either.
            let mut object = serde_json::Map::new();
            for (k, v) in &msg.headers {
                object
                    .entry(k.to_string())
                    .or_insert_with(|| serde_json::Value::String(v.to_string()));
            }
            writeln!(out, "{}", serde_json::Value::Object(object))
        }
    }
}
