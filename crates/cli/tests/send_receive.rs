//! `haven send` and `haven receive` against the real broker binary, as a user runs them: the
//! counts in the summary, the bodies and headers that arrive, failover URIs, and the exit code
//! and message of every way a run can fail.
//!
//! Each test starts its own broker (small journal segments, its own data directory) through
//! the testkit, which kills it when the test ends, pass or fail. Every `haven send`/`receive`
//! child is bounded by [`CMD_TIMEOUT_MS`] and killed if it overruns.

use std::io::{Read, Write};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use haven_testkit::{free_addr, free_port, BrokerOpts, BrokerProcess};
use serde_json::Value;

/// Bound on one `haven send`/`haven receive` run; a hang fails the test instead of wedging it.
const CMD_TIMEOUT_MS: u64 = 60_000;
/// Small segments (4 MiB) keep each test broker's preallocated journal small.
const BROKER_CONFIG: &str =
    "[stomp]\nframe_bytes_max = 1048576\n\n[journal]\nsegment_bytes = 4194304\n";

fn start_broker(dir: &tempfile::TempDir) -> BrokerProcess {
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    opts.config_toml = Some(BROKER_CONFIG.to_string());
    BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker starts: {e}"))
}

/// What a finished `haven` run left behind.
struct Run {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The `--json` summary: the last line of stdout.
    fn summary(&self) -> Value {
        let line = self.stdout.lines().last().unwrap_or_else(|| {
            panic!("no summary on stdout; stderr: {}", self.stderr);
        });
        serde_json::from_str(line).unwrap_or_else(|e| {
            panic!(
                "summary {line:?} is not JSON ({e}); stderr: {}",
                self.stderr
            )
        })
    }

    fn assert_success(&self) -> &Run {
        assert!(
            self.status.success(),
            "haven exited with {}; stdout: {}\nstderr: {}",
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

fn drain(mut pipe: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut bytes = Vec::new();
        let _ = pipe.read_to_end(&mut bytes);
        String::from_utf8_lossy(&bytes).into_owned()
    })
}

/// Runs `haven ARGS`, feeding `stdin` (or a closed, non-terminal stdin), within
/// [`CMD_TIMEOUT_MS`].
fn haven(args: &[&str], stdin: Option<&[u8]>) -> Run {
    let mut child: Child = Command::new(env!("CARGO_BIN_EXE_haven"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn haven");
    let mut input = child.stdin.take().expect("stdin piped");
    if let Some(bytes) = stdin {
        input.write_all(bytes).expect("write stdin");
    }
    drop(input);
    let stdout = drain(child.stdout.take().expect("stdout piped"));
    let stderr = drain(child.stderr.take().expect("stderr piped"));
    let deadline = Instant::now() + Duration::from_millis(CMD_TIMEOUT_MS);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for haven") {
            break status;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("haven {args:?} ran longer than {CMD_TIMEOUT_MS} ms");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    Run {
        status,
        stdout: stdout.join().expect("stdout reader"),
        stderr: stderr.join().expect("stderr reader"),
    }
}

fn u64_of(summary: &Value, key: &str) -> u64 {
    summary[key]
        .as_u64()
        .unwrap_or_else(|| panic!("summary {summary} has no number {key:?}"))
}

#[test]
fn send_then_receive_counts_every_message() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    let sent = haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/counts",
            "--count",
            "100",
            "--size",
            "512",
            "--json",
        ],
        None,
    );
    let s = sent.assert_success().summary();
    assert_eq!(u64_of(&s, "sent"), 100, "{s}");
    assert_eq!(u64_of(&s, "confirmed"), 100, "{s}");
    assert_eq!(s["ok"], Value::Bool(true));
    assert_eq!(s["brokers"], serde_json::json!([url]));

    let received = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/counts",
            "--count",
            "100",
            "--print",
            "none",
            "--json",
        ],
        None,
    );
    let r = received.assert_success().summary();
    assert_eq!(u64_of(&r, "received"), 100, "{r}");
    assert_eq!(u64_of(&r, "redelivered"), 0, "{r}");
    assert_eq!(
        received.stdout.lines().count(),
        1,
        "--print none prints only the summary"
    );

    // Everything was acked: the queue is empty now.
    let after = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/counts",
            "--timeout",
            "300",
            "--json",
        ],
        None,
    );
    assert_eq!(u64_of(&after.assert_success().summary(), "received"), 0);
}

#[test]
fn messages_arrive_in_order_with_sequence_and_extra_headers() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/headers",
            "--count",
            "20",
            "--body",
            "hi",
            "--header",
            "region=eu",
            "--header",
            "expr=a=b",
            "--persistent",
            "false",
            "--quiet",
        ],
        None,
    )
    .assert_success();
    let received = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/headers",
            "--count",
            "20",
            "--print",
            "headers",
        ],
        None,
    );
    received.assert_success();
    let lines: Vec<Value> = received
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per message"))
        .collect();
    assert_eq!(lines.len(), 20, "stdout: {}", received.stdout);
    for (i, headers) in lines.iter().enumerate() {
        assert_eq!(
            headers["haven-send-seq"],
            Value::String((i + 1).to_string()),
            "{headers}"
        );
        assert_eq!(headers["region"], "eu");
        assert_eq!(
            headers["expr"], "a=b",
            "the value keeps every '=' after the first"
        );
        assert_eq!(headers["destination"], "/queue/headers");
    }
    assert!(
        received.stderr.contains("received 20"),
        "text summary: {}",
        received.stderr
    );
}

#[test]
fn send_reads_the_body_from_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    // No body option and a piped stdin: stdin is the body.
    haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/stdin",
            "--count",
            "2",
        ],
        Some(b"piped body"),
    )
    .assert_success();
    // `--body -` says so explicitly.
    haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/stdin",
            "--body",
            "-",
        ],
        Some(b"dash body"),
    )
    .assert_success();
    let received = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/stdin",
            "--count",
            "3",
        ],
        None,
    );
    received.assert_success();
    let bodies: Vec<&str> = received.stdout.lines().collect();
    assert_eq!(bodies, ["piped body", "piped body", "dash body"]);
}

#[test]
fn receipted_and_transacted_sends_are_all_confirmed() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    let receipted = haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/modes",
            "--count",
            "10",
            "--body",
            "r",
            "--receipt",
            "--json",
        ],
        None,
    );
    assert_eq!(
        u64_of(&receipted.assert_success().summary(), "confirmed"),
        10
    );
    let transacted = haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/modes",
            "--count",
            "23",
            "--body",
            "t",
            "--transaction-size",
            "5",
            "--delay-ms",
            "1",
            "--json",
        ],
        None,
    );
    assert_eq!(
        u64_of(&transacted.assert_success().summary(), "confirmed"),
        23
    );
    let received = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/modes",
            "--count",
            "33",
            "--print",
            "none",
            "--json",
            "--timeout",
            "5000",
        ],
        None,
    );
    assert_eq!(u64_of(&received.assert_success().summary(), "received"), 33);
}

#[test]
fn failover_url_skips_a_dead_broker_listed_first() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    // Nothing listens here: the OS handed the port out and it was released at once.
    let dead = free_port();
    let live = broker.addr();
    let url = format!("failover:(tcp://127.0.0.1:{dead},tcp://{live})?randomize=false");
    let sent = haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/failover",
            "--count",
            "10",
            "--body",
            "f",
            "--json",
        ],
        None,
    );
    let s = sent.assert_success().summary();
    assert_eq!(u64_of(&s, "confirmed"), 10, "{s}");
    assert_eq!(s["brokers"], serde_json::json!([format!("tcp://{live}")]));
    let received = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/failover",
            "--count",
            "10",
            "--print",
            "none",
            "--json",
        ],
        None,
    );
    assert_eq!(u64_of(&received.assert_success().summary(), "received"), 10);
}

#[test]
fn bad_uri_and_unknown_failover_option_fail_naming_the_problem() {
    // No broker needed: the URI is refused before any connection is tried.
    let missing_port = haven(
        &[
            "send",
            "--url",
            "tcp://127.0.0.1",
            "--destination",
            "/queue/x",
            "--body",
            "b",
        ],
        None,
    );
    assert!(!missing_port.status.success());
    assert!(
        missing_port.stderr.contains("bad address")
            && missing_port.stderr.contains("missing :port"),
        "stderr: {}",
        missing_port.stderr
    );
    let bogus = haven(
        &[
            "receive",
            "--url",
            "failover:(tcp://127.0.0.1:1)?bogusOption=1",
            "--destination",
            "/queue/x",
            "--json",
        ],
        None,
    );
    assert!(!bogus.status.success());
    assert!(
        bogus.stderr.contains("unknown option \"bogusOption\""),
        "stderr: {}",
        bogus.stderr
    );
    let s = bogus.summary();
    assert_eq!(s["ok"], Value::Bool(false));
    assert!(s["error"].as_str().unwrap().contains("bogusOption"), "{s}");
}

#[test]
fn nothing_listening_on_a_tcp_url_is_an_error() {
    let dead = free_port();
    let run = haven(
        &[
            "send",
            "--url",
            &format!("tcp://127.0.0.1:{dead}"),
            "--destination",
            "/queue/x",
            "--body",
            "b",
        ],
        None,
    );
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("no broker reachable"),
        "stderr: {}",
        run.stderr
    );
}

#[test]
fn receive_timeout_on_an_empty_queue_without_count_is_success() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    let started = Instant::now();
    let run = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/empty",
            "--timeout",
            "300",
            "--json",
        ],
        None,
    );
    let s = run.assert_success().summary();
    assert_eq!(u64_of(&s, "received"), 0);
    assert!(started.elapsed() >= Duration::from_millis(300));
}

#[test]
fn receive_timeout_before_count_is_an_error_saying_how_many_arrived() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    let empty = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/short",
            "--count",
            "5",
            "--timeout",
            "300",
        ],
        None,
    );
    assert!(!empty.status.success());
    assert!(
        empty.stderr.contains("received 0 of 5"),
        "stderr: {}",
        empty.stderr
    );

    haven(
        &[
            "send",
            "--url",
            &url,
            "--destination",
            "/queue/short",
            "--count",
            "3",
            "--body",
            "s",
        ],
        None,
    )
    .assert_success();
    let short = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/short",
            "--count",
            "5",
            "--timeout",
            "500",
            "--print",
            "none",
        ],
        None,
    );
    assert!(!short.status.success());
    assert!(
        short.stderr.contains("received 3 of 5"),
        "stderr: {}",
        short.stderr
    );
}

#[test]
fn broker_error_is_reported_with_its_message() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    let run = haven(
        &[
            "receive",
            "--url",
            &url,
            "--destination",
            "/queue/sel",
            "--selector",
            "a = = (",
            "--timeout",
            "2000",
        ],
        None,
    );
    assert!(!run.status.success());
    assert!(
        run.stderr.contains("broker error"),
        "stderr: {}",
        run.stderr
    );
    assert!(
        run.stderr.to_lowercase().contains("selector"),
        "stderr: {}",
        run.stderr
    );
}

#[test]
fn selector_and_durable_subscription_filter_and_keep_messages() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.stomp_url();
    let durable = [
        "receive",
        "--url",
        &url,
        "--destination",
        "/topic/prices",
        "--durable",
        "d1",
        "--client-id",
        "cli-test",
        "--selector",
        "region = 'eu'",
        "--timeout",
        "300",
        "--json",
    ];
    // Creates the durable subscription; nothing to receive yet.
    assert_eq!(
        u64_of(
            &haven(&durable, None).assert_success().summary(),
            "received"
        ),
        0
    );
    for region in ["eu", "us", "eu"] {
        let header = format!("region={region}");
        haven(
            &[
                "send",
                "--url",
                &url,
                "--destination",
                "/topic/prices",
                "--body",
                region,
                "--header",
                &header,
            ],
            None,
        )
        .assert_success();
    }
    // The subscription kept the two matching messages while no one was connected.
    let run = haven(&durable, None);
    let s = run.assert_success().summary();
    assert_eq!(u64_of(&s, "received"), 2, "{s}");
    assert_eq!(run.stdout.lines().filter(|l| *l == "eu").count(), 2);
}
