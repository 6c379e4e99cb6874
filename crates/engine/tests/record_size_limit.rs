//! One client cannot make the engine emit a log record larger than the log takes (the journal
//! would refuse it and stop the broker): a topic with many durable subscriptions multiplies a
//! message's record size (found in review).

mod support;
use haven_engine::*;
use support::*;

fn many_durables(limit: usize) -> Harness {
    let cfg = EngineConfig {
        record_bytes_max: limit,
        ..Default::default()
    };
    let mut h = Harness::new(cfg);
    h.connect(1, Some("c"));
    for i in 0..2000 {
        h.ok(Command::Subscribe {
            conn: 1,
            sub_id: "s".into(),
            destination: Destination::Topic("t".into()),
            ack: AckMode::Auto,
            prefetch: 1,
            durable_name: Some(format!("durable-subscription-{i:05}")),
            options: Default::default(),
            receipt: None,
        });
        h.ok(Command::Unsubscribe {
            conn: 1,
            sub_id: "s".into(),
            durable_name: None,
            receipt: None,
        });
    }
    h
}

fn largest_record(out: &[Output]) -> usize {
    out.iter()
        .filter_map(|o| match o {
            Output::Log(r) => Some(r.to_bytes().len()),
            _ => None,
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn a_commit_whose_record_would_be_too_large_is_refused_and_stays_open() {
    let limit = 1024 * 1024;
    let mut h = many_durables(limit);
    h.ok(Command::Begin {
        conn: 1,
        transaction: "tx".into(),
        receipt: None,
    });
    for _ in 0..100 {
        h.send_tx(1, "/topic/t", "x", true, Some("tx"));
    }
    let commit = || Command::Commit {
        conn: 1,
        transaction: "tx".into(),
        receipt: None,
        producer: None,
    };
    assert!(matches!(
        h.cmd(commit()),
        Err(EngineError::RecordTooLarge { .. })
    ));
    // Still open: the client can abort it.
    h.ok(Command::Abort {
        conn: 1,
        transaction: "tx".into(),
        receipt: None,
    });
}

#[test]
fn records_that_fit_are_accepted_and_never_exceed_the_limit() {
    let limit = 1024 * 1024;
    let mut h = many_durables(limit);
    let mut out = Vec::new();
    let ctx = h.ctx();
    let send = Command::Send {
        conn: 1,
        destination: Destination::Topic("t".into()),
        message: NewMessage {
            headers: Default::default(),
            body: "x".into(),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: None,
        receipt: None,
        producer: None,
    };
    h.engine
        .handle(send, ctx, &mut out)
        .expect("one message to 2000 subscriptions fits");
    assert!(largest_record(&out) <= limit);
    // A body that with its holders no longer fits is refused.
    let big = Command::Send {
        conn: 1,
        destination: Destination::Topic("t".into()),
        message: NewMessage {
            headers: Default::default(),
            body: vec![0u8; limit].into(),
            persistent: true,
            priority: 4,
            expires_ms: 0,
        },
        transaction: None,
        receipt: None,
        producer: None,
    };
    assert!(matches!(
        h.cmd(big),
        Err(EngineError::RecordTooLarge { .. })
    ));
}
