//! The simulated Dispatcher: core's two machines, a directory and a call
//! shard, over one database, with the messages between them (the
//! directory's views, the shard's forward marks) held in flight and
//! delivered when the world says, in any order, some of them twice.

use callfence_core::directory::{Directory, DirectoryInput, DirectoryOutput, DocError};
use callfence_core::document::DocKind;
use callfence_core::engine::{EngineConfig, EngineError, HeartbeatRefusal};
use callfence_core::messages::DirectoryView;
use callfence_core::node_auth::Caller;
use callfence_core::shard::{CallShard, ShardInput, ShardOutput};
use callfence_core::store::sqlite::SqliteStore;
use serde_json::Value as Json;
use std::rc::Rc;

/// A message between the machines, in flight.
#[derive(Debug, Clone)]
pub enum Message {
    /// Directory to shard.
    View(Rc<DirectoryView>),
    /// Shard to directory.
    Mark(callfence_core::messages::ForwardMark),
}

pub struct Machines {
    store: Rc<SqliteStore>,
    pub directory: Directory<Rc<SqliteStore>>,
    pub shard: CallShard<Rc<SqliteStore>>,
    /// Sent and not yet delivered, oldest first.
    pub in_flight: Vec<Message>,
    /// Messages delivered, and those a receiver dropped as superseded.
    pub delivered: u64,
    pub superseded: u64,
}

impl Machines {
    pub fn new(store: SqliteStore, config: EngineConfig, now_ms: i64) -> Self {
        let store = Rc::new(store);
        let mut machines = Self {
            directory: Directory::new(store.clone(), config.allow_plaintext),
            shard: CallShard::new(store.clone(), config),
            store,
            in_flight: Vec::new(),
            delivered: 0,
            superseded: 0,
        };
        machines.collect(now_ms);
        machines
    }

    pub fn store(&self) -> &SqliteStore {
        &self.store
    }

    /// New machines on the same database, the messages in flight kept (they
    /// reach the restarted machines).
    pub fn restart(self, config: EngineConfig, now_ms: i64) -> Self {
        let Self {
            store,
            directory,
            shard,
            in_flight,
            delivered,
            superseded,
        } = self;
        drop((directory, shard));
        let store = Rc::try_unwrap(store).unwrap_or_else(|_| panic!("one owner"));
        let mut machines = Self::new(store, config, now_ms);
        machines.in_flight.splice(0..0, in_flight);
        machines.delivered = delivered;
        machines.superseded = superseded;
        machines
    }

    /// Takes every message both machines have to send into flight.
    pub fn collect(&mut self, now_ms: i64) {
        while let Some(ShardOutput::Mark(mark)) = self.shard.poll_output() {
            self.in_flight.push(Message::Mark(mark));
        }
        if let Some(DirectoryOutput::View(view)) = self.directory.poll_output(now_ms).expect("view")
        {
            self.in_flight.push(Message::View(view));
        }
    }

    /// Delivers the message in flight at `index`; `again` keeps a copy in
    /// flight (a duplicate). The shard's held view never goes back.
    pub fn deliver(&mut self, index: usize, again: bool, now_ms: i64) {
        let message = if again {
            self.in_flight[index].clone()
        } else {
            self.in_flight.remove(index)
        };
        match message {
            Message::View(view) => {
                let before = self.shard.directory_view();
                self.shard.handle_input(ShardInput::View(view.clone()));
                let after = self.shard.directory_view();
                assert!(
                    Rc::ptr_eq(&after, &before) || after.supersedes(&before),
                    "the shard's view went back"
                );
                self.superseded += u64::from(!Rc::ptr_eq(&after, &view));
            }
            Message::Mark(mark) => self
                .directory
                .handle_input(DirectoryInput::Mark(mark))
                .expect("mark"),
        }
        self.delivered += 1;
        self.collect(now_ms);
    }

    /// Delivers everything in flight, oldest first.
    pub fn deliver_all(&mut self, now_ms: i64) {
        while !self.in_flight.is_empty() {
            self.deliver(0, false, now_ms);
        }
    }

    pub fn put_document(
        &mut self,
        kind: DocKind,
        body: &[u8],
        if_match: Option<&str>,
        now_ms: i64,
    ) -> Result<u64, DocError> {
        let open_calls = self.shard.open_calls()?;
        let out = self
            .directory
            .put_document(kind, body, if_match, "sim", &open_calls, now_ms);
        self.collect(now_ms);
        out
    }

    pub fn get_document(&self, kind: DocKind) -> Result<(u64, Json), DocError> {
        self.directory.get_document(kind, None)
    }

    pub fn handle_heartbeat(
        &mut self,
        caller: Caller<'_>,
        signed_at_s: i64,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Json, HeartbeatRefusal> {
        let open_calls = self
            .shard
            .node_open_calls(caller.node)
            .map_err(HeartbeatRefusal::from)?;
        let out = self
            .directory
            .handle_heartbeat(caller, signed_at_s, body, open_calls, now_ms);
        self.collect(now_ms);
        out
    }

    /// Runs one request of the shard and takes its marks into flight.
    pub fn on_shard<T>(
        &mut self,
        now_ms: i64,
        request: impl FnOnce(&CallShard<Rc<SqliteStore>>) -> Result<T, EngineError>,
    ) -> Result<T, EngineError> {
        let out = request(&self.shard);
        self.collect(now_ms);
        out
    }

    /// The alarm: the shard's, then the directory's retention.
    pub fn poll_alarm(&mut self, now_ms: i64) -> callfence_core::engine::AlarmWork {
        let work = self
            .on_shard(now_ms, |s| s.poll_alarm(now_ms))
            .expect("alarm");
        self.directory.forget_unregistered(now_ms).expect("forget");
        self.collect(now_ms);
        work
    }
}
