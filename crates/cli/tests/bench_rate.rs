//! `haven bench --rate`: the offered load of `bench/network_sustained.sh`. What is checked
//! does not depend on the machine's speed: paced producers send nothing ahead of its due time,
//! so a run cannot end sooner than its schedule (a slow machine only makes it later), every
//! message is still accounted, and a rate that is not a rate is refused.

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use haven_testkit::{free_addr, BrokerOpts, BrokerProcess};
use serde_json::Value;

/// Bound on one `haven bench` run; a hang fails the test instead of wedging it.
const BENCH_TIMEOUT_MS: u64 = 60_000;

fn start_broker(dir: &tempfile::TempDir) -> BrokerProcess {
    let mut opts = BrokerOpts::new(
        env!("CARGO_BIN_EXE_haven"),
        dir.path().join("data"),
        free_addr(),
    );
    opts.config_toml = Some(
        "[stomp]\nframe_bytes_max = 1048576\n\n[journal]\nsegment_bytes = 4194304\n".to_string(),
    );
    BrokerProcess::start(opts).unwrap_or_else(|e| panic!("broker starts: {e}"))
}

/// Runs `haven bench` with `args`, killed if it overruns `BENCH_TIMEOUT_MS`.
fn bench(args: &[&str]) -> Output {
    let mut child = Command::new(env!("CARGO_BIN_EXE_haven"))
        .arg("bench")
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("haven bench starts");
    let deadline = Instant::now() + Duration::from_millis(BENCH_TIMEOUT_MS);
    while child.try_wait().expect("wait on haven bench").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("haven bench {args:?} ran over {BENCH_TIMEOUT_MS} ms");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().expect("haven bench output")
}

/// 1,200 messages from 2 producers to 2 consumers, a RECEIPT every 10, at `rate` if given.
fn bench_1200(url: &str, rate: Option<&str>) -> Output {
    let mut args = vec![
        "--url",
        url,
        "--producers",
        "2",
        "--consumers",
        "2",
        "--count",
        "1200",
        "--receipt-every",
        "10",
        "--json",
    ];
    if let Some(rate) = rate {
        args.extend(["--rate", rate]);
    }
    bench(&args)
}

fn summary(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout.lines().last().unwrap_or_else(|| {
        panic!(
            "no summary; stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    serde_json::from_str(line).unwrap_or_else(|e| panic!("summary {line:?} is not JSON: {e}"))
}

#[test]
fn paced_producers_send_nothing_ahead_of_the_schedule_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let broker = start_broker(&dir);
    let url = broker.addr().to_string();
    // 2 producers share 2,000 msg/s: one message per millisecond each, 600 each, so the last
    // of each is due 599 ms after its first. Warm-up is paced too (it is part of the schedule).
    let out = bench_1200(&url, Some("2000"));
    assert!(
        out.status.success(),
        "haven bench failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s = summary(&out);
    assert_eq!(s["rate"], 2000.0);
    assert_eq!(s["sent"], 1200);
    assert_eq!(s["delivered"], 1200);
    assert_eq!(s["lost"], 0);
    assert_eq!(s["duplicates"], 0);
    let send_seconds = s["send_seconds"].as_f64().expect("send_seconds");
    assert!(
        send_seconds >= 0.599,
        "1,200 messages at 2,000 msg/s went out in {send_seconds} s: ahead of the schedule"
    );
    // Unpaced, the same run has no such floor; it is only checked to account the same way.
    let out = bench_1200(&url, None);
    assert!(out.status.success());
    let s = summary(&out);
    assert_eq!(s["rate"], Value::Null);
    assert_eq!(s["delivered"], 1200);
}

#[test]
fn a_rate_that_is_not_a_rate_is_refused() {
    for bad in ["0", "-5", "NaN", "inf"] {
        let rate = format!("--rate={bad}");
        let out = bench(&["--url", "127.0.0.1:1", &rate, "--json"]);
        assert!(!out.status.success(), "--rate {bad} was accepted");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            stderr.contains("--rate"),
            "--rate {bad}: the error does not name the flag: {stderr}"
        );
    }
}
