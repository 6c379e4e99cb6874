//! Reads paged-out messages back from `haven_log` for the engine (see the engine's `paging`).
//!
//! A reader task on the store's thread owns its own connection (opened on first use: the
//! engine gets the loader before replay, but reads only once the broker serves). `load` is a
//! blocking request/response, bounded by `db_timeout_ms`; the core task waits for it as it
//! would for a disk read. `prefetch` hints the next messages: the task reads them with one
//! `lsn = ANY($1)` query per 1,024 records and decodes them ahead, so `load` finds most
//! messages ready. Hints are kept in order, each naming messages after the last one's (the
//! engine's contract), and those that came during a read-ahead extend it. A `load` that arrives while a read-ahead runs is answered between its queries, from
//! what it read if it holds the message: it waits for one query, not for the whole hint, and
//! does not read again what the read-ahead just read. Reads need no fencing: a record, once
//! committed, never changes.

use crate::db::{self, Conn};
use crate::error::PgError;
use crate::runtime::PgRuntime;
use crate::settings::Settings;
use haven_engine::read_ahead::{ReadAhead, HINTS_QUEUED_MAX};
use haven_engine::{Message, MessageLoader, Record};
use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::mpsc;

/// Records one prefetch query reads at most; a longer hint is read in several. (The hint was
/// once cut to this length, and a page-in of up to 4,000 messages then read the other ~3,000
/// with one blocking query each, which the core waited on: RECEIPTs stalled for 4.5-6 s
/// on a paging shared-db master, docs/POSTGRES.md.)
const PREFETCH_RECORDS_MAX: usize = 1_024;

type Hint = Vec<(u64, u64)>;

/// What the reader decoded ahead: bounded in messages and bytes, as the journal's loader's.
type Decoded = Arc<Mutex<ReadAhead>>;
type Reply = std::sync::mpsc::Sender<Result<Arc<Message>, String>>;

/// A `load` the map did not answer: (lsn, seq) and where the message goes.
struct Request {
    lsn: u64,
    seq: u64,
    reply: Reply,
}

pub(crate) struct PgLoader {
    s: Arc<Settings>,
    rt: Arc<PgRuntime>,
    requests: Option<mpsc::UnboundedSender<Request>>,
    hints: Option<mpsc::Sender<Hint>>,
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
        let (hint_tx, hint_rx) = mpsc::channel(HINTS_QUEUED_MAX);
        self.rt
            .spawn(serve(self.s.clone(), req_rx, hint_rx, self.decoded.clone()));
        self.requests = Some(req_tx);
        self.hints = Some(hint_tx);
    }

    /// Asks the reader task for message (`lsn`, `seq`) and waits for it.
    fn request(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        self.start();
        let (reply, answer) = std::sync::mpsc::channel();
        let request = Request { lsn, seq, reply };
        let sent = self.requests.as_ref().expect("started").send(request);
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
        self.request(lsn, seq)
    }

    fn prefetch(&mut self, next: &[(u64, u64)]) {
        self.start();
        if let Some(hints) = &self.hints {
            match hints.try_send(next.to_vec()) {
                Ok(()) | Err(mpsc::error::TrySendError::Full(_)) => {}
                Err(mpsc::error::TrySendError::Closed(_)) => self.hints = None,
            }
        }
    }

    fn prefetched_len(&self) -> usize {
        self.decoded.lock().expect("prefetch map").len()
    }
}

async fn serve(
    s: Arc<Settings>,
    mut requests: mpsc::UnboundedReceiver<Request>,
    mut hints: mpsc::Receiver<Hint>,
    decoded: Decoded,
) {
    let mut conn: Option<Conn> = None;
    loop {
        tokio::select! {
            // A hint first: the engine hints a page-in and then loads its first message, which
            // the hint's first query reads; served the other way round, that message would be
            // read twice and its read-ahead copy left in the map.
            biased;
            hint = hints.recv() => {
                let Some(hint) = hint else { return };
                read_ahead(&s, &mut conn, &decoded, &mut requests, &mut hints, hint).await;
            }
            req = requests.recv() => {
                let Some(req) = req else { return };
                answer(&s, &mut conn, &decoded, req).await;
            }
        }
    }
}

/// Reads `hint`, and the hints that come while it runs, in order, one query per
/// `PREFETCH_RECORDS_MAX` records, each chunk ready for `load` as it arrives. Between queries
/// it answers the `load`s that came meanwhile (the core waits in them): from the map, or with
/// a query of their own for a message the hints have not reached yet, which they then skip.
/// A failure is not reported here: `load` reads again and reports it.
async fn read_ahead(
    s: &Settings,
    conn: &mut Option<Conn>,
    decoded: &Decoded,
    requests: &mut mpsc::UnboundedReceiver<Request>,
    hints: &mut mpsc::Receiver<Hint>,
    hint: Hint,
) {
    let mut wanted: VecDeque<(u64, u64)> = VecDeque::new();
    let add = |wanted: &mut VecDeque<(u64, u64)>, hint: Hint| {
        let map = decoded.lock().expect("prefetch map");
        wanted.extend(hint.into_iter().filter(|k| !map.contains(k)));
    };
    add(&mut wanted, hint);
    loop {
        // Later hints name later messages: read them in the same run of queries.
        while let Ok(more) = hints.try_recv() {
            add(&mut wanted, more);
        }
        if wanted.is_empty() {
            return;
        }
        let chunk: Vec<(u64, u64)> = wanted
            .drain(..wanted.len().min(PREFETCH_RECORDS_MAX))
            .collect();
        let mut lsns: Vec<i64> = chunk.iter().map(|(l, _)| *l as i64).collect();
        lsns.dedup();
        let Ok(rows) = read(s, conn, &lsns).await else {
            return;
        };
        let by_lsn: HashMap<u64, Vec<u8>> = rows.into_iter().map(|(l, p)| (l as u64, p)).collect();
        {
            let mut map = decoded.lock().expect("prefetch map");
            for &(lsn, seq) in &chunk {
                let Some(msg) = by_lsn
                    .get(&lsn)
                    .and_then(|p| Record::decode_message(p, lsn, seq).ok())
                else {
                    continue;
                };
                map.offer((lsn, seq), msg);
            }
        }
        while let Ok(req) = requests.try_recv() {
            // Read here, it must not be read again into the map, where nobody would take it.
            wanted.retain(|k| *k != (req.lsn, req.seq));
            answer(s, conn, decoded, req).await;
        }
    }
}

/// Answers a `load`: from what the read-ahead decoded if it holds the message, else with a
/// query of its own.
async fn answer(s: &Settings, conn: &mut Option<Conn>, decoded: &Decoded, req: Request) {
    let Request { lsn, seq, reply } = req;
    let ready = decoded.lock().expect("prefetch map").remove(&(lsn, seq));
    let result = match ready {
        Some(msg) => Ok(msg),
        None => read(s, conn, &[lsn as i64]).await.and_then(|mut rows| {
            let (_, payload) = rows.pop().ok_or_else(|| {
                format!("record {lsn} is not in the store (released, or never committed)")
            })?;
            Record::decode_message(&payload, lsn, seq)
        }),
    };
    let _ = reply.send(result);
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
