//! Reads paged-out messages back from `haven_log` for the engine (see the engine's `paging`).
//!
//! A reader task on the store's thread owns its own connection (opened on first use: the
//! engine gets the loader before replay, but reads only once the broker serves). `load` is a
//! blocking request/response, bounded by `db_timeout_ms`; the core task waits for it as it
//! would for a disk read. `prefetch` hints the next batch: the task reads it with one
//! `lsn = ANY($1)` query and decodes it ahead, so `load` finds most messages ready. Reads need
//! no fencing: a record, once committed, never changes.

use crate::db::{self, Conn};
use crate::error::PgError;
use crate::runtime::PgRuntime;
use crate::settings::Settings;
use haven_engine::{Message, MessageLoader, Record};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{mpsc, watch};

/// Decoded messages waiting for `load`, at most (as the journal's loader): beyond it the
/// reader drops what was never asked for.
const PREFETCHED_MESSAGES_MAX: usize = 16_384;
/// Records one prefetch query reads at most; a longer hint is read in several. (The hint was
/// once cut to this length, and a page-in of up to 4,000 messages then read the other ~3,000
/// with one blocking query each, which the core waited on: RECEIPTs stalled for 4.5-6 s
/// on a paging shared-db master, docs/POSTGRES.md.)
const PREFETCH_RECORDS_MAX: usize = 1_024;

type Decoded = Arc<Mutex<HashMap<(u64, u64), Arc<Message>>>>;
type Reply = std::sync::mpsc::Sender<Result<Vec<u8>, String>>;

pub(crate) struct PgLoader {
    s: Arc<Settings>,
    rt: Arc<PgRuntime>,
    requests: Option<mpsc::UnboundedSender<(u64, Reply)>>,
    hints: Option<watch::Sender<Vec<(u64, u64)>>>,
    decoded: Decoded,
}

impl PgLoader {
    pub fn new(s: Arc<Settings>, rt: Arc<PgRuntime>) -> PgLoader {
        PgLoader {
            s,
            rt,
            requests: None,
            hints: None,
            decoded: Arc::default(),
        }
    }

    fn start(&mut self) {
        if self.requests.is_some() {
            return;
        }
        let (req_tx, req_rx) = mpsc::unbounded_channel();
        let (hint_tx, hint_rx) = watch::channel(Vec::new());
        self.rt
            .spawn(serve(self.s.clone(), req_rx, hint_rx, self.decoded.clone()));
        self.requests = Some(req_tx);
        self.hints = Some(hint_tx);
    }

    fn read(&mut self, lsn: u64) -> Result<Vec<u8>, String> {
        self.start();
        let (reply, answer) = std::sync::mpsc::channel();
        let sent = self.requests.as_ref().expect("started").send((lsn, reply));
        if sent.is_err() {
            self.requests = None;
            self.hints = None;
            return Err("the database thread stopped".into());
        }
        // The reader answers within its own bounds (connect + query); this is a backstop.
        let backstop = Duration::from_millis(self.s.db_timeout_ms.saturating_mul(3));
        answer
            .recv_timeout(backstop)
            .map_err(|e| format!("reading record {lsn} from the database: {e}"))?
    }
}

impl MessageLoader for PgLoader {
    fn load(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        if let Some(msg) = self
            .decoded
            .lock()
            .expect("prefetch map")
            .remove(&(lsn, seq))
        {
            return Ok(msg);
        }
        let payload = self.read(lsn)?;
        Record::decode_message(&payload, lsn, seq)
    }

    fn prefetch(&mut self, next: &[(u64, u64)]) {
        self.start();
        if let Some(hints) = &self.hints {
            // The newest hint replaces one not yet read. The engine bounds it (a page-in's
            // worth, in messages and bytes).
            let _ = hints.send(next.to_vec());
        }
    }

    fn prefetched_len(&self) -> usize {
        self.decoded.lock().expect("prefetch map").len()
    }
}

async fn serve(
    s: Arc<Settings>,
    mut requests: mpsc::UnboundedReceiver<(u64, Reply)>,
    mut hints: watch::Receiver<Vec<(u64, u64)>>,
    decoded: Decoded,
) {
    let mut conn: Option<Conn> = None;
    loop {
        tokio::select! {
            biased;
            req = requests.recv() => {
                let Some((lsn, reply)) = req else { return };
                let result = read(&s, &mut conn, &[lsn as i64]).await.and_then(|mut rows| {
                    rows.pop().map(|(_, p)| p).ok_or_else(|| format!(
                        "record {lsn} is not in the store (released, or never committed)"
                    ))
                });
                let _ = reply.send(result);
            }
            changed = hints.changed() => {
                if changed.is_err() {
                    return;
                }
                let hint = hints.borrow_and_update().clone();
                let wanted: Vec<(u64, u64)> = {
                    let map = decoded.lock().expect("prefetch map");
                    hint.into_iter().filter(|k| !map.contains_key(k)).collect()
                };
                if wanted.is_empty() {
                    continue;
                }
                // In hint order, one query per chunk, each chunk ready for `load` as it
                // arrives. A failure is not reported here: `load` reads again and reports it.
                for chunk in wanted.chunks(PREFETCH_RECORDS_MAX) {
                    let mut lsns: Vec<i64> = chunk.iter().map(|(l, _)| *l as i64).collect();
                    lsns.dedup();
                    let Ok(rows) = read(&s, &mut conn, &lsns).await else { break };
                    let by_lsn: HashMap<u64, Vec<u8>> =
                        rows.into_iter().map(|(l, p)| (l as u64, p)).collect();
                    let mut map = decoded.lock().expect("prefetch map");
                    for &(lsn, seq) in chunk {
                        let Some(msg) = by_lsn.get(&lsn).and_then(|p| Record::decode_message(p, lsn, seq).ok())
                        else {
                            continue;
                        };
                        if map.len() >= PREFETCHED_MESSAGES_MAX {
                            map.clear();
                        }
                        map.insert((lsn, seq), msg);
                    }
                }
            }
        }
    }
}

/// Reads the given records; reconnects on the next call after a failure.
async fn read(
    s: &Settings,
    conn: &mut Option<Conn>,
    lsns: &[i64],
) -> Result<Vec<(i64, Vec<u8>)>, String> {
    let result: Result<Vec<(i64, Vec<u8>)>, PgError> = async {
        if conn.is_none() {
            *conn = Some(db::connect(s, db::Role::Log).await?);
        }
        let client = &conn.as_ref().expect("connected").client;
        let lsns = lsns.to_vec();
        let rows = db::timed(
            s.db_timeout(),
            "read records",
            client.query(
                "SELECT lsn, payload FROM haven_log WHERE lsn = ANY($1::bigint[])",
                &[&lsns],
            ),
        )
        .await?;
        Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
    }
    .await;
    result.map_err(|e| {
        *conn = None;
        e.to_string()
    })
}
