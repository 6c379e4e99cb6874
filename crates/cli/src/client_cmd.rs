//! What `haven send` and `haven receive` share: the connection flags, the error type, the
//! progress bar and the summary line.
//!
//! Both commands are thin loops over [`haven_client::Client`], the failover session, so any
//! `tcp://` or `failover:(...)?options` URI an application would use works here too and means
//! the same. Errors the client reports are shown with the client's own text (a bad URI names
//! the option, a broker ERROR carries the broker's message); nothing is re-worded, so what an
//! operator sees here is what the application would log.
//!
//! Output contract: messages (receive) and the `--json` summary go to stdout; progress, the
//! text summary and errors go to stderr, so stdout can be piped into another program.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use haven_client::{Client, ClientError, ConnectOptions, ConnectionEvent};
use serde_json::Value;
use tokio::sync::broadcast;

/// A progress bar appears only once a run has lasted this long: a quick run stays silent.
const PROGRESS_AFTER_MS: u64 = 1_000;

/// Flags every messaging command takes.
#[derive(clap::Args, Debug, Clone)]
pub struct ClientArgs {
    /// Broker URI: `tcp://host:port`, or `failover:(tcp://a:1,tcp://b:2)?options` with
    /// ActiveMQ's failover options (unknown options are an error).
    #[arg(long, default_value = "tcp://127.0.0.1:61613")]
    pub url: String,
    /// CONNECT `login` (omitted when unset).
    #[arg(long)]
    pub login: Option<String>,
    /// CONNECT `passcode` (omitted when unset).
    #[arg(long)]
    pub passcode: Option<String>,
    /// Destination, e.g. `/queue/orders` or `/topic/prices`.
    #[arg(long)]
    pub destination: String,
    /// Progress bar on stderr: `auto` draws one on a terminal for runs over a second.
    #[arg(long, value_enum, default_value_t = ProgressMode::Auto)]
    pub progress: ProgressMode,
    /// No progress bar and no text summary (errors are still printed).
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Print the summary as one JSON line on stdout instead of text on stderr.
    #[arg(long)]
    pub json: bool,
}

impl ClientArgs {
    pub fn connect_options(&self) -> ConnectOptions {
        ConnectOptions {
            login: self.login.clone(),
            passcode: self.passcode.clone(),
            ..ConnectOptions::default()
        }
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressMode {
    Auto,
    Never,
}

/// Why `haven send` or `haven receive` failed. The exit code is non-zero for every variant.
#[derive(Debug, thiserror::Error)]
pub enum CmdError {
    /// From the client: a bad URI, no broker reachable, a broker ERROR, a lost outcome.
    #[error("{0}")]
    Client(#[from] ClientError),
    #[error("bad arguments: {0}")]
    Args(String),
    #[error("cannot read the body from {from}: {source}")]
    Body {
        from: String,
        source: std::io::Error,
    },
    #[error("the body from {from} is larger than {bytes_max} bytes")]
    BodyTooLarge { from: String, bytes_max: u64 },
    #[error("no broker connection within {timeout_ms} ms (--timeout)")]
    ConnectTimeout { timeout_ms: u64 },
    /// `haven send --timeout` expired before every message was sent and confirmed.
    #[error("timed out after {timeout_ms} ms: {sent} of {count} sent, {confirmed} confirmed")]
    SendTimeout {
        timeout_ms: u64,
        count: u64,
        sent: u64,
        confirmed: u64,
    },
    /// `haven receive --count N --timeout MS`: the queue went quiet first.
    #[error("no message for {timeout_ms} ms: received {received} of {count}")]
    CountNotReached {
        timeout_ms: u64,
        count: u64,
        received: u64,
    },
    /// The client gave up (its connection ended and the URI allows no more reconnects).
    #[error("connection lost after {after}: {reason}")]
    Lost { after: String, reason: String },
    /// The broker answered ERROR to SENDs the command did not wait for one by one.
    #[error("{refused} SEND(s) refused by the broker: {reason}")]
    Refused { refused: u64, reason: String },
    #[error("cannot write to stdout: {0}")]
    Stdout(std::io::Error),
}

impl CmdError {
    /// 2 for a usage error (like clap's own), 1 for everything the run itself ran into.
    pub fn exit_code(&self) -> std::process::ExitCode {
        match self {
            CmdError::Args(_) => std::process::ExitCode::from(2),
            _ => std::process::ExitCode::FAILURE,
        }
    }
}

pub type Result<T, E = CmdError> = std::result::Result<T, E>;

/// Connects, bounded by `timeout_ms` when set (a failover URI may otherwise retry forever,
/// which is what `startupMaxReconnectAttempts=-1` asks for).
pub async fn connect(
    args: &ClientArgs,
    opts: ConnectOptions,
    timeout_ms: Option<u64>,
) -> Result<Client> {
    let connecting = Client::connect(&args.url, opts);
    match timeout_ms {
        Some(ms) => tokio::time::timeout(Duration::from_millis(ms), connecting)
            .await
            .map_err(|_| CmdError::ConnectTimeout { timeout_ms: ms })?
            .map_err(CmdError::from),
        None => connecting.await.map_err(CmdError::from),
    }
}

/// What the client's event stream said during a run.
#[derive(Debug, Default)]
pub struct EventLog {
    /// Every broker a connection was made to, in order, without repeats.
    pub brokers: Vec<String>,
    /// SENDs refused by a broker that the command did not wait for (plain `send`).
    pub refused: u64,
    /// The first refusal's reason, to show the user.
    pub refused_reason: Option<String>,
    /// Set when the client gave up reconnecting.
    pub failed: Option<String>,
}

impl EventLog {
    fn note_broker(&mut self, broker: String) {
        if !self.brokers.contains(&broker) {
            self.brokers.push(broker);
        }
    }

    /// Folds in every event received so far, without waiting.
    pub fn drain(&mut self, events: &mut broadcast::Receiver<ConnectionEvent>) {
        loop {
            match events.try_recv() {
                Ok(
                    ConnectionEvent::Connected { broker } | ConnectionEvent::Resumed { broker, .. },
                ) => self.note_broker(broker),
                Ok(ConnectionEvent::SendRefused { reason, .. }) => {
                    self.refused += 1;
                    self.refused_reason
                        .get_or_insert_with(|| reason.to_string());
                }
                Ok(ConnectionEvent::Failed { reason }) => {
                    self.failed.get_or_insert_with(|| reason.to_string());
                }
                // A forgotten producer is logged as a warning by the client library itself.
                Ok(
                    ConnectionEvent::Interrupted { .. }
                    | ConnectionEvent::ClusterUpdated { .. }
                    | ConnectionEvent::ProducerForgotten { .. },
                ) => {}
                // More than the client's event buffer behind: only brokers and refusals could
                // be missed, and those are also visible through `Client::broker`/the outcome.
                Err(broadcast::error::TryRecvError::Lagged(_)) => {}
                Err(_) => return,
            }
        }
    }

    /// Starts a log for a freshly connected client. The first broker is read from the client
    /// too, in case another clone already took the receiver that sees `Connected`.
    pub fn start(client: &Client) -> (EventLog, broadcast::Receiver<ConnectionEvent>) {
        let events = client.events();
        let mut log = EventLog::default();
        if let Some(broker) = client.broker() {
            log.note_broker(broker);
        }
        (log, events)
    }
}

/// A progress bar that appears on a terminal once the run has lasted [`PROGRESS_AFTER_MS`].
pub struct Progress {
    started: Instant,
    enabled: bool,
    /// Known total (a count), or a spinner.
    len: Option<u64>,
    verb: &'static str,
    bar: Option<indicatif::ProgressBar>,
}

impl Progress {
    pub fn new(args: &ClientArgs, len: Option<u64>, verb: &'static str) -> Progress {
        let enabled = !args.quiet
            && !args.json
            && args.progress == ProgressMode::Auto
            && std::io::stderr().is_terminal();
        Progress {
            started: Instant::now(),
            enabled,
            len,
            verb,
            bar: None,
        }
    }

    pub fn elapsed(&self) -> Duration {
        self.started.elapsed()
    }

    pub fn set(&mut self, pos: u64) {
        if !self.enabled {
            return;
        }
        if self.bar.is_none() {
            if self.started.elapsed() < Duration::from_millis(PROGRESS_AFTER_MS) {
                return;
            }
            self.bar = Some(self.make_bar());
        }
        if let Some(bar) = &self.bar {
            bar.set_position(pos);
        }
    }

    fn make_bar(&self) -> indicatif::ProgressBar {
        let (bar, template) = match self.len {
            Some(n) => (
                indicatif::ProgressBar::new(n),
                format!(
                    "{{elapsed_precise}} [{{bar:30}}] {} {{pos}}/{{len}} ({{per_sec}})",
                    self.verb
                ),
            ),
            None => (
                indicatif::ProgressBar::new_spinner(),
                format!(
                    "{{spinner}} {{elapsed_precise}} {} {{pos}} ({{per_sec}})",
                    self.verb
                ),
            ),
        };
        bar.set_style(
            indicatif::ProgressStyle::with_template(&template)
                .expect("valid template")
                .progress_chars("=> "),
        );
        bar
    }

    pub fn finish(&mut self) {
        if let Some(bar) = self.bar.take() {
            bar.finish_and_clear();
        }
    }
}

/// Messages per second over `elapsed`, 0 for an instant run.
pub fn rate_per_s(messages: u64, elapsed: Duration) -> f64 {
    let s = elapsed.as_secs_f64();
    if s > 0.0 {
        messages as f64 / s
    } else {
        0.0
    }
}

/// Prints the run's summary: a JSON line on stdout with `--json`, else `text` on stderr
/// unless `--quiet`. `error` is included in the JSON so a script sees why the run failed.
pub fn print_summary(args: &ClientArgs, mut json: Value, text: &str, error: Option<&CmdError>) {
    if args.json {
        json["ok"] = Value::Bool(error.is_none());
        json["error"] = error.map_or(Value::Null, |e| Value::String(e.to_string()));
        println!("{json}");
    } else if !args.quiet {
        eprintln!("{text}");
    }
}

/// `k=v` (the first `=` splits; the value may contain more). STOMP headers cannot hold a line
/// break, and an empty name is not a header.
pub fn parse_header(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=VALUE"))?;
    if k.is_empty() || k.contains(['\n', '\r', ':']) || v.contains(['\n', '\r']) {
        return Err(format!("`{s}` is not a valid STOMP header"));
    }
    Ok((k.to_string(), v.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_splits_at_the_first_equals_sign() {
        assert_eq!(
            parse_header("a=b=c").unwrap(),
            ("a".to_string(), "b=c".to_string())
        );
        assert_eq!(
            parse_header("a=").unwrap(),
            ("a".to_string(), String::new())
        );
        assert!(parse_header("novalue").is_err());
        assert!(parse_header("=v").is_err());
        assert!(parse_header("a:b=c").is_err());
    }

    #[test]
    fn rate_of_an_instant_run_is_zero() {
        assert_eq!(rate_per_s(10, Duration::ZERO), 0.0);
        assert_eq!(rate_per_s(10, Duration::from_secs(2)), 5.0);
    }
}
