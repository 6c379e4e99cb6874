//! Over the wire: scheduled delivery across a restart, producer flow control on a destination
//! limit (held, then released or refused with the limit named), and the disk limit.

mod common;

use common::{connect_client as connect, next_body};

use haven_client::AckMode;
use haven_server::config::DestinationLimitsConfig;
use haven_server::{Config, Server};
use std::path::Path;
use std::time::Duration;

/// Bound on every wait for something that must happen.
const WAIT: Duration = Duration::from_secs(10);
/// How long a test watches for something that must NOT happen (no timing is asserted: a slow
/// machine can only make such a check pass, never fail wrongly).
const QUIET: Duration = Duration::from_millis(300);

fn config(dir: &Path, edit: impl FnOnce(&mut Config)) -> Config {
    let mut c = Config::default();
    c.stomp.listen = "127.0.0.1:0".parse().unwrap();
    c.journal.dir = dir.to_path_buf();
    edit(&mut c);
    c
}

#[tokio::test(flavor = "multi_thread")]
async fn scheduled_message_survives_a_restart_and_is_delivered_once() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), |_| {});
    let server = Server::start(cfg.clone()).await.unwrap();
    let c = connect(&server).await;
    // Due 1.5 s after the SEND; two repeats 500 ms apart after that.
    let headers = [
        ("AMQ_SCHEDULED_DELAY", "1500"),
        ("AMQ_SCHEDULED_PERIOD", "500"),
        ("AMQ_SCHEDULED_REPEAT", "2"),
    ];
    c.send_receipted("/queue/later", &headers, "tick")
        .await
        .unwrap();
    // Restart at once (an orderly stop; the schedule is on disk since its RECEIPT).
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
    let server = Server::start(cfg).await.unwrap();
    let c = connect(&server).await;
    let mut sub = c
        .subscribe("/queue/later", AckMode::Auto, &[])
        .await
        .unwrap();
    for _ in 0..3 {
        assert_eq!(next_body(&mut sub, WAIT).await, "tick");
    }
    assert!(
        tokio::time::timeout(Duration::from_millis(1500), sub.next())
            .await
            .is_err(),
        "exactly three deliveries"
    );
    // A bad schedule is refused with the reason.
    let bad = connect(&server).await;
    let e = bad
        .send_receipted("/queue/later", &[("AMQ_SCHEDULED_CRON", "99 * * * *")], "x")
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("minute"), "{e}");
    c.disconnect().await.unwrap();
    server.shutdown().await.unwrap();
}

fn limited(dir: &Path, wait_ms: u64) -> Config {
    config(dir, |c| {
        c.limits.producer_wait_ms_max = wait_ms;
        c.limits.destination.push(DestinationLimitsConfig {
            destination: "/queue/fc.>".into(),
            memory_bytes_max: None,
            messages_max: Some(3),
            bytes_max: None,
        });
    })
}

#[tokio::test(flavor = "multi_thread")]
async fn a_full_destination_holds_the_send_until_a_consumer_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(limited(dir.path(), 60_000)).await.unwrap();
    let p = connect(&server).await;
    for i in 0..3 {
        p.send_receipted("/queue/fc.a", &[], format!("m{i}"))
            .await
            .unwrap();
    }
    // The fourth waits: no RECEIPT while the queue holds its limit.
    let held = p
        .send_with_receipt_future("/queue/fc.a", &[], "m3")
        .await
        .unwrap();
    let mut held = Box::pin(held);
    assert!(
        tokio::time::timeout(QUIET, &mut held).await.is_err(),
        "RECEIPT delayed while the destination is full"
    );
    // Other producers to other destinations are not affected. (Later frames of this
    // connection wait behind its held SEND, in order.)
    let other = connect(&server).await;
    tokio::time::timeout(WAIT, other.send_receipted("/queue/other", &[], "free"))
        .await
        .expect("another destination takes SENDs")
        .unwrap();
    // A consumer takes one: the held SEND goes through, in order.
    let c = connect(&server).await;
    let mut sub = c
        .subscribe(
            "/queue/fc.a",
            AckMode::ClientIndividual,
            &[("activemq.prefetchSize", "1")],
        )
        .await
        .unwrap();
    let first = tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap()
        .unwrap();
    c.ack_receipted(&first).await.unwrap();
    tokio::time::timeout(WAIT, held)
        .await
        .expect("RECEIPT once there is room")
        .unwrap();
    let mut bodies = vec![String::from_utf8(first.body.to_vec()).unwrap()];
    for _ in 0..3 {
        let m = tokio::time::timeout(WAIT, sub.next())
            .await
            .unwrap()
            .unwrap();
        bodies.push(String::from_utf8(m.body.to_vec()).unwrap());
        c.ack_receipted(&m).await.unwrap();
    }
    assert_eq!(bodies, ["m0", "m1", "m2", "m3"]);
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_send_held_too_long_gets_an_error_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(limited(dir.path(), 200)).await.unwrap();
    let p = connect(&server).await;
    for i in 0..3 {
        p.send_receipted("/queue/fc.b", &[], format!("m{i}"))
            .await
            .unwrap();
    }
    let e = tokio::time::timeout(WAIT, p.send_receipted("/queue/fc.b", &[], "m3"))
        .await
        .expect("refused in time")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("messages_max = 3") && e.contains("producer_wait_ms_max"),
        "{e}"
    );
    // Nothing beyond the limit was stored.
    let c = connect(&server).await;
    let mut sub = c
        .subscribe("/queue/fc.b", AckMode::Auto, &[])
        .await
        .unwrap();
    for i in 0..3 {
        assert_eq!(next_body(&mut sub, WAIT).await, format!("m{i}"));
    }
    assert!(tokio::time::timeout(QUIET, sub.next()).await.is_err());
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_connection_held_back_can_still_ack_what_it_consumes() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(limited(dir.path(), 60_000)).await.unwrap();
    let pc = connect(&server).await;
    let mut sub = pc
        .subscribe(
            "/queue/fc.c",
            AckMode::ClientIndividual,
            &[("activemq.prefetchSize", "10")],
        )
        .await
        .unwrap();
    for i in 0..3 {
        pc.send_receipted("/queue/fc.c", &[], format!("m{i}"))
            .await
            .unwrap();
    }
    let held = pc
        .send_with_receipt_future("/queue/fc.c", &[], "m3")
        .await
        .unwrap();
    // Plain ACKs (no receipt) are not queued behind the held SEND.
    let m = tokio::time::timeout(WAIT, sub.next())
        .await
        .unwrap()
        .unwrap();
    pc.ack(&m).await.unwrap();
    tokio::time::timeout(WAIT, held)
        .await
        .expect("the ACK made room")
        .unwrap();
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn the_disk_limit_holds_persistent_sends_but_not_non_persistent_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), |c| {
        c.limits.disk_bytes_max = 1; // any journal is over it
        c.limits.producer_wait_ms_max = 300;
        c.journal.maintenance_interval_ms = 20;
    });
    let server = Server::start(cfg).await.unwrap();
    let p = connect(&server).await;
    // Give the maintenance tick a moment to notice the disk state.
    let c = connect(&server).await;
    let mut sub = c.subscribe("/queue/d", AckMode::Auto, &[]).await.unwrap();
    let mut refused = None;
    for _ in 0..100 {
        match p
            .send_receipted("/queue/d", &[("persistent", "true")], "p")
            .await
        {
            Ok(()) => tokio::time::sleep(Duration::from_millis(20)).await,
            Err(e) => {
                refused = Some(e.to_string());
                break;
            }
        }
    }
    let e = refused.expect("persistent SENDs are refused once the disk limit is seen");
    assert!(e.contains("disk_bytes_max"), "{e}");
    let q = connect(&server).await;
    q.send_receipted("/queue/d", &[("persistent", "false")], "np")
        .await
        .expect("non-persistent SENDs still flow");
    loop {
        if next_body(&mut sub, WAIT).await == "np" {
            break;
        }
    }
    server.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn non_persistent_messages_beyond_memory_spill_to_the_journal_and_come_back() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), |c| {
        c.limits.memory_bytes_max = 1024 * 1024;
    });
    let server = Server::start(cfg).await.unwrap();
    let p = connect(&server).await;
    const N: usize = 3_000; // about 7 MiB by the broker's estimate: most of it spills
    let body = "x".repeat(1024);
    for i in 0..N {
        let headers = [("persistent", "false"), ("n", &i.to_string() as &str)];
        if i % 500 == 499 {
            p.send_receipted("/queue/spill", &headers, body.clone())
                .await
                .unwrap();
        } else {
            p.send("/queue/spill", &headers, body.clone())
                .await
                .unwrap();
        }
    }
    // (That the engine spills beyond its budget is checked in the engine's paging tests; this
    // one checks the way back through the journal reader of a running broker.)
    let c = connect(&server).await;
    let mut sub = c
        .subscribe(
            "/queue/spill",
            AckMode::Auto,
            &[("activemq.prefetchSize", "100")],
        )
        .await
        .unwrap();
    for i in 0..N {
        let m = tokio::time::timeout(WAIT, sub.next())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            m.header("n"),
            Some(i.to_string().as_str()),
            "in order, once"
        );
        assert_eq!(m.body.len(), 1024);
    }
    assert!(tokio::time::timeout(QUIET, sub.next()).await.is_err());
    server.shutdown().await.unwrap();
}
