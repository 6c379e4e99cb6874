//! Reads paged-out messages back from the journal for the engine (see the engine's `paging`).

use haven_engine::{Message, MessageLoader, Record};
use haven_journal::Reader;
use std::path::PathBuf;
use std::sync::Arc;

/// Opens its reader on first use: the engine gets the loader before replay (so a deep backlog
/// is recovered paged out), but reads only once the broker serves.
pub(crate) struct JournalLoader {
    dir: PathBuf,
    reader: Option<Reader>,
}

impl JournalLoader {
    pub fn new(dir: PathBuf) -> JournalLoader {
        JournalLoader { dir, reader: None }
    }
}

impl MessageLoader for JournalLoader {
    fn load(&mut self, lsn: u64, seq: u64) -> Result<Arc<Message>, String> {
        if self.reader.is_none() {
            self.reader = Some(Reader::open(&self.dir).map_err(|e| e.to_string())?);
        }
        let reader = self.reader.as_mut().expect("just opened");
        let payload = reader.read(lsn).map_err(|e| e.to_string())?;
        let record = Record::decode(&payload).map_err(|e| format!("lsn {lsn}: {e}"))?;
        record
            .message_with_seq(seq)
            .cloned()
            .ok_or_else(|| format!("record {lsn} does not carry message {seq}"))
    }
}
