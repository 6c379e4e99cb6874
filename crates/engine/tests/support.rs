//! A harness that drives the engine like the server does: records get consecutive LSNs and a
//! copy of the log is kept so a crash can be simulated by replaying it into a fresh engine.

#![allow(dead_code)]

use bytes::Bytes;
use haven_engine::*;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// The log as the loader sees it: records by LSN, deleted when the log is truncated, so a read
/// of a record the engine let go of fails the test.
type Disk = Arc<Mutex<BTreeMap<u64, Vec<u8>>>>;

/// What the engine asked of a loader that reads ahead: the (lsn, seq) its hints named, how
/// often one was named again, and the loads of messages no hint had named.
#[derive(Debug, Default)]
pub struct Hints {
    pub named: std::collections::HashSet<(u64, u64)>,
    pub named_again: usize,
    pub loads: usize,
    pub unhinted_loads: Vec<(u64, u64)>,
    /// Set by a test: the loader drops its read-ahead (what was named is named no more) and
    /// says so at the engine's next `forgot`.
    pub forget: bool,
}

struct DiskLoader(Disk, Option<Arc<Mutex<Hints>>>);

impl MessageLoader for DiskLoader {
    fn prefetch(&mut self, next: &[(u64, u64)]) {
        if let Some(hints) = &self.1 {
            let mut hints = hints.lock().unwrap();
            for &k in next {
                if !hints.named.insert(k) {
                    hints.named_again += 1;
                }
            }
        }
    }

    fn forgot(&mut self) -> bool {
        let Some(hints) = &self.1 else { return false };
        let mut hints = hints.lock().unwrap();
        if std::mem::take(&mut hints.forget) {
            hints.named.clear();
            return true;
        }
        false
    }

    fn load(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        if let Some(hints) = &self.1 {
            let mut hints = hints.lock().unwrap();
            hints.loads += 1;
            if !hints.named.contains(&(lsn, seq)) {
                hints.unhinted_loads.push((lsn, seq));
            }
        }
        let disk = self.0.lock().unwrap();
        let bytes = disk.get(&lsn).ok_or(format!("record {lsn} was deleted"))?;
        let record = Record::decode(bytes).map_err(|e| e.to_string())?;
        record
            .message_with_seq(seq)
            .cloned()
            .ok_or(format!("record {lsn} does not carry message {seq}"))
    }
}

pub struct Harness {
    pub engine: Engine,
    pub log: Vec<(u64, Vec<u8>)>,
    pub next_lsn: u64,
    pub now_ms: u64,
    pub cfg: EngineConfig,
    /// With paging: the loader's view of the log (every appended record is durable at once,
    /// unless `hold_durability`).
    disk: Option<Disk>,
    /// Appended records stay not yet durable until `release_durability`, as they are between
    /// a server's append and its fdatasync.
    durability_held: bool,
}

impl Harness {
    pub fn new(cfg: EngineConfig) -> Harness {
        Harness {
            engine: Engine::new(cfg.clone()),
            log: Vec::new(),
            next_lsn: 1,
            now_ms: 1_000,
            cfg,
            disk: None,
            durability_held: false,
        }
    }

    /// A harness whose engine pages messages out beyond `cfg.memory_bytes_max`, reading them
    /// back from the harness's log.
    pub fn with_paging(cfg: EngineConfig) -> Harness {
        Harness::paging(cfg, None)
    }

    /// `with_paging`, with a loader that records the engine's read-ahead hints and loads.
    pub fn with_paging_hints(cfg: EngineConfig) -> (Harness, Arc<Mutex<Hints>>) {
        let hints = Arc::default();
        (Harness::paging(cfg, Some(Arc::clone(&hints))), hints)
    }

    fn paging(cfg: EngineConfig, hints: Option<Arc<Mutex<Hints>>>) -> Harness {
        let mut h = Harness::new(cfg);
        let disk: Disk = Arc::default();
        h.engine
            .set_loader(Box::new(DiskLoader(disk.clone(), hints)));
        h.disk = Some(disk);
        h
    }

    fn appended(&mut self, lsn: u64, bytes: &[u8]) {
        if let Some(disk) = &self.disk {
            disk.lock().unwrap().insert(lsn, bytes.to_vec());
            if !self.durability_held {
                let resume = self.engine.set_durable_lsn(lsn + 1);
                // Each record is durable before the next call, so no page-in ever waits.
                assert!(
                    !resume,
                    "a page-in waited although every record was durable"
                );
            }
        }
    }

    /// From now on appended records are not durable (not readable back by paging) until
    /// `release_durability`: the window between a server's append and its sync.
    pub fn hold_durability(&mut self) {
        assert!(self.disk.is_some(), "durability matters only with paging");
        self.durability_held = true;
    }

    /// Everything appended is durable now; runs what the server runs then (page-ins that
    /// waited for it) and returns their effects.
    pub fn release_durability(&mut self) -> Vec<Effect> {
        self.durability_held = false;
        if !self.engine.set_durable_lsn(self.next_lsn) {
            return Vec::new();
        }
        self.outside_a_command(Engine::resume_page_ins)
    }

    /// Runs an engine call that is not a command (a timer, a resumed page-in) as the server
    /// does: its records appended, its effects returned, the invariants checked.
    fn outside_a_command(&mut self, call: fn(&mut Engine, Ctx, &mut Vec<Output>)) -> Vec<Effect> {
        let mut out = Vec::new();
        let ctx = self.ctx();
        call(&mut self.engine, ctx, &mut out);
        let effects = self.absorb(out);
        assert_eq!(self.engine.take_fatal(), None);
        self.engine.check_invariants();
        effects
    }

    fn truncated(&mut self, keep_from: u64) {
        self.log.retain(|(lsn, _)| *lsn >= keep_from);
        if let Some(disk) = &self.disk {
            disk.lock().unwrap().retain(|lsn, _| *lsn >= keep_from);
        }
    }

    pub fn ctx(&self) -> Ctx {
        Ctx {
            now_ms: self.now_ms,
            next_lsn: self.next_lsn,
        }
    }

    fn absorb(&mut self, out: Vec<Output>) -> Vec<Effect> {
        let mut effects = Vec::new();
        for o in out {
            match o {
                Output::Log(r) => {
                    let bytes = r.to_bytes();
                    assert_eq!(Record::decode(&bytes).unwrap(), r);
                    self.appended(self.next_lsn, &bytes);
                    self.log.push((self.next_lsn, bytes));
                    self.next_lsn += 1;
                }
                Output::Effect(e) => effects.push(e),
            }
        }
        effects
    }

    pub fn cmd(&mut self, c: Command) -> Result<Vec<Effect>, EngineError> {
        let mut out = Vec::new();
        let ctx = self.ctx();
        let r = self.engine.handle(c, ctx, &mut out);
        if r.is_err() {
            assert!(out.is_empty(), "an error must output nothing");
        }
        let effects = self.absorb(out);
        assert_eq!(self.engine.take_fatal(), None);
        self.engine.check_invariants();
        r.map(|_| effects)
    }

    pub fn ok(&mut self, c: Command) -> Vec<Effect> {
        self.cmd(c).expect("command accepted")
    }

    pub fn connect(&mut self, conn: ConnId, client_id: Option<&str>) {
        self.ok(Command::Connect {
            conn,
            client_id: client_id.map(str::to_string),
            producer: None,
            session: 0,
        });
    }

    pub fn subscribe(
        &mut self,
        conn: ConnId,
        sub: &str,
        dest: &str,
        ack: AckMode,
        prefetch: u32,
    ) -> Vec<Effect> {
        self.ok(Command::Subscribe {
            conn,
            sub_id: sub.into(),
            destination: Destination::parse(dest, conn).unwrap(),
            ack,
            prefetch,
            durable_name: None,
            options: Default::default(),
            receipt: None,
        })
    }

    pub fn send(&mut self, conn: ConnId, dest: &str, body: &str, persistent: bool) -> Vec<Effect> {
        self.send_tx(conn, dest, body, persistent, None)
    }

    pub fn send_tx(
        &mut self,
        conn: ConnId,
        dest: &str,
        body: &str,
        persistent: bool,
        tx: Option<&str>,
    ) -> Vec<Effect> {
        self.ok(Command::Send {
            conn,
            destination: Destination::parse(dest, conn).unwrap(),
            message: NewMessage {
                headers: haven_engine::Headers::from_pairs(&[("k", "v")]),
                body: Bytes::from(body.to_string()),
                persistent,
                priority: 4,
                expires_ms: 0,
            },
            transaction: tx.map(str::to_string),
            receipt: Some(format!("r-{body}")),
            producer: None,
        })
    }

    pub fn ack(&mut self, conn: ConnId, tag: u64) -> Vec<Effect> {
        self.ok(Command::Ack {
            conn,
            ack: AckRef::Tag(tag),
            transaction: None,
            receipt: None,
        })
    }

    pub fn nack(&mut self, conn: ConnId, tag: u64) -> Vec<Effect> {
        self.ok(Command::Nack {
            conn,
            ack: AckRef::Tag(tag),
            transaction: None,
            receipt: None,
        })
    }

    pub fn close(&mut self, conn: ConnId) -> Vec<Effect> {
        self.ok(Command::Close {
            conn,
            receipt: None,
        })
    }

    /// A crash: a fresh engine rebuilt from the log alone.
    pub fn crash_and_recover(&mut self) {
        self.engine = self.recovered_engine();
    }

    /// The engine a crash now would recover, leaving the running one untouched (so a test can
    /// compare without losing its connections).
    pub fn recovered_engine(&self) -> Engine {
        let mut e = Engine::new(self.cfg.clone());
        if let Some(disk) = &self.disk {
            e.set_loader(Box::new(DiskLoader(disk.clone(), None)));
            let resume = e.set_durable_lsn(self.next_lsn);
            assert!(!resume, "nothing consumed before recovery");
        }
        for (lsn, bytes) in &self.log {
            e.replay(*lsn, Record::decode(bytes).unwrap()).unwrap();
        }
        e.finish_recovery().unwrap();
        e.check_invariants();
        e
    }

    /// Like [`Harness::cmd`], but returns every output in the order the engine produced it
    /// (records are appended to the log as they go), so a test can check that an effect comes
    /// after the records it depends on.
    pub fn cmd_outputs(&mut self, c: Command) -> Result<Vec<Output>, EngineError> {
        let mut out = Vec::new();
        let ctx = self.ctx();
        let r = self.engine.handle(c, ctx, &mut out);
        if r.is_err() {
            assert!(out.is_empty(), "an error must output nothing");
        }
        self.append_records(&out);
        self.engine.check_invariants();
        r.map(|_| out)
    }

    /// Appends the `Log` outputs to the log at consecutive LSNs (round-tripping the encoding).
    pub fn append_records(&mut self, out: &[Output]) {
        for o in out {
            if let Output::Log(r) = o {
                let bytes = r.to_bytes();
                assert_eq!(&Record::decode(&bytes).unwrap(), r);
                self.appended(self.next_lsn, &bytes);
                self.log.push((self.next_lsn, bytes));
                self.next_lsn += 1;
            }
        }
    }

    /// Compaction: re-logs up to `max` live objects described below `lsn_limit` and appends
    /// the records. Returns how many objects were re-logged.
    pub fn relocate(&mut self, lsn_limit: u64, max: usize) -> usize {
        let mut out = Vec::new();
        let ctx = self.ctx();
        let n = self
            .engine
            .relocate_below(lsn_limit, max, u64::MAX, ctx, &mut out);
        assert!(
            out.iter().all(|o| matches!(o, Output::Log(_))),
            "compaction only writes records"
        );
        assert_eq!(out.len(), n, "one record per relocated object");
        self.append_records(&out);
        assert_eq!(self.engine.take_fatal(), None);
        self.engine.check_invariants();
        n
    }

    /// Advances the clock by `ms` and runs the engine's timers (redelivery delays, schedules).
    pub fn tick(&mut self, ms: u64) -> Vec<Effect> {
        self.now_ms += ms;
        self.outside_a_command(Engine::tick)
    }

    /// What the server's segment deletion does: log a `Checkpoint` of the message numbering
    /// first, then delete every record below both the live watermark and that checkpoint.
    pub fn checkpoint_and_truncate(&mut self) {
        let checkpoint = Record::Checkpoint {
            next_seq: self.engine.next_seq(),
        };
        let cp_lsn = self.next_lsn;
        let bytes = checkpoint.to_bytes();
        self.appended(cp_lsn, &bytes);
        self.log.push((cp_lsn, bytes));
        self.next_lsn += 1;
        let keep_from = self.engine.min_live_lsn().unwrap_or(cp_lsn).min(cp_lsn);
        self.truncated(keep_from);
    }

    /// Deletes log records below the engine's live watermark (what segment deletion does).
    pub fn truncate_dead_prefix(&mut self) {
        let keep_from = self.engine.min_live_lsn().unwrap_or(self.next_lsn);
        self.truncated(keep_from);
    }
}

pub fn deliveries(effects: &[Effect]) -> Vec<(ConnId, Delivery)> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Deliver { conn, delivery } => Some((*conn, delivery.clone())),
            _ => None,
        })
        .collect()
}

pub fn bodies(effects: &[Effect]) -> Vec<String> {
    deliveries(effects)
        .iter()
        .map(|(_, d)| String::from_utf8(d.message.body.to_vec()).unwrap())
        .collect()
}

pub fn receipts(effects: &[Effect]) -> Vec<String> {
    effects
        .iter()
        .filter_map(|e| match e {
            Effect::Receipt { receipt, .. } => Some(receipt.clone()),
            _ => None,
        })
        .collect()
}
