//! One object's Dispatcher: a [`Directory`] and a [`CallShard`] over one
//! database, composed (SPEC §16's `global`, which is the directory and call
//! shard 0).
//!
//! [`Engine`] passes the machines' messages between them synchronously:
//! before and after every request it drains each machine's output into the
//! other ([`DirectoryOutput::View`] into the shard, [`ShardOutput::Mark`]
//! into the directory). Since nothing is awaited in between, every change
//! the directory acknowledged is in force for the next decision, exactly
//! as when both were one machine. The simulation drives the two machines
//! itself instead, with the messages delayed, repeated and reordered.
//!
//! The directory needs two facts of the shard: a node's open calls (a
//! beat's answer says whether its capacity is exhausted) and every node's
//! open calls (a registry may not remove a node with live calls). The
//! engine reads them from the shard and passes them in.
//!
//! Everything else the Worker uses of either machine is re-exported here.

pub use crate::config::{EngineConfig, Timing, DEFAULT_SESSION_CAP};
pub use crate::directory::{
    Cached, DocError, HeartbeatRefusal, NodeKey, ProbeAdmission, KEPT_REVISIONS,
};
pub use crate::error::EngineError;
pub use crate::messages::{
    DirectoryView, ForwardMark, ForwardResult, Lease, LeaseAsk, MapNotice, Redirect,
};
pub use crate::node_auth::Caller;
pub use crate::shard::{
    may_reforward, AlarmWork, Arrival, BadRequest, ClaimReply, ClaimRequest, Delivered, FenceGrant,
    FenceRefusal, FenceReply, FenceRequest, Forward, Holds, Ingress, MediaRefusal, MediaReply,
    MediaVerifyRequest, PendingReason, PreviewRequest, Refused, Report, ReportEffect,
    ReportedAnswer, MAX_HOPS, MIN_REFORWARD_BUDGET_MS, ROWS_PER_SESSION,
};

use crate::directory::{Directory, DirectoryInput, DirectoryOutput};
use crate::document::DocKind;
use crate::media::MediaKeys;
use crate::metrics::Counters;
use crate::policy::RoutingPolicy;
use crate::registry::NodeRegistry;
use crate::shard::{CallShard, ShardInput, ShardOutput};
use crate::store::Store;
use serde_json::Value as Json;
use std::rc::Rc;

/// The in-memory state of both machines ([`Engine::caches`]).
#[cfg(feature = "testing")]
#[doc(hidden)]
#[derive(Clone)]
pub struct Caches(crate::directory::Caches, crate::shard::Caches);

/// The Dispatcher of one object: see the module documentation.
pub struct Engine<S: Store> {
    store: Rc<S>,
    directory: Directory<Rc<S>>,
    shard: CallShard<Rc<S>>,
    /// False in a call shard's own object (`calls-k`): its directory machine
    /// is not the deployment's, so no view of it reaches the shard, whose
    /// marks wait in its outbox for the object to send to `global`.
    directs: bool,
}

impl<S: Store> Engine<S> {
    /// `global`'s engine over `store`, whose schema must already be
    /// migrated: the directory and call shard 0.
    pub fn new(store: S, config: EngineConfig) -> Self {
        let store = Rc::new(store);
        Self {
            directory: Directory::new(store.clone(), config.allow_plaintext),
            shard: CallShard::new(store.clone(), config),
            store,
            directs: true,
        }
    }

    /// The engine of call shard `k ≥ 1`'s own object (SPEC §16): the shard
    /// alone, deciding under leases from `global` ([`CallShard::leased`]).
    /// Its forward marks stay in the shard's outbox
    /// ([`CallShard::poll_output`]) for the object to send.
    pub fn call_shard(store: S, config: EngineConfig, k: u32) -> Self {
        let store = Rc::new(store);
        Self {
            directory: Directory::new(store.clone(), config.allow_plaintext),
            shard: CallShard::new(store.clone(), config).numbered(k).leased(),
            store,
            directs: false,
        }
    }

    /// The directory.
    pub fn directory(&self) -> &Directory<Rc<S>> {
        &self.directory
    }

    /// The call shard.
    pub fn shard(&self) -> &CallShard<Rc<S>> {
        &self.shard
    }

    /// The metrics counted since this engine started (the shard's: the
    /// directory counts nothing itself).
    pub fn metrics(&self) -> &Counters {
        self.shard.metrics()
    }

    /// The storage backend. Writes through it bypass the machines' caches.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Gives the store back (to simulate a restart: new machines on the
    /// same storage start with empty caches).
    pub fn into_store(self) -> S {
        let Self {
            store,
            directory,
            shard,
            ..
        } = self;
        drop((directory, shard));
        Rc::try_unwrap(store).unwrap_or_else(|_| unreachable!("the machines held the only clones"))
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        self.shard.config()
    }

    /// A copy of both machines' in-memory state. Only the model check uses
    /// it: it explores many histories on one database, and gives each its
    /// own caches back with [`Engine::set_caches`].
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn caches(&self) -> Caches {
        Caches(self.directory.caches(), self.shard.caches())
    }

    /// Replaces both machines' in-memory state (see [`Engine::caches`]).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn set_caches(&self, caches: Caches) {
        self.directory.set_caches(caches.0);
        self.shard.set_caches(caches.1);
    }

    /// Delivers every pending message: the shard's marks to the directory,
    /// then the directory's view to the shard.
    fn settle(&self, now_ms: i64) -> Result<(), EngineError> {
        if !self.directs {
            return Ok(());
        }
        while let Some(ShardOutput::Mark(mark)) = self.shard.poll_output() {
            if let Err(e) = self
                .directory
                .handle_input(DirectoryInput::Mark(mark.clone()))
            {
                // Kept for the next settle: a failed store loses no mark.
                self.shard.retry_output(ShardOutput::Mark(mark));
                return Err(e);
            }
        }
        if let Some(DirectoryOutput::View(view)) = self.directory.poll_output(now_ms)? {
            self.shard.handle_input(ShardInput::View(view));
        }
        Ok(())
    }

    /// Runs one request of the shard between two settles, counting against
    /// each node's capacity what the other shards may hold, and asking
    /// back the spare room of nodes it found full for want of it.
    fn on_shard<T, E: From<EngineError>>(
        &self,
        now_ms: i64,
        request: impl FnOnce(&CallShard<Rc<S>>) -> Result<T, E>,
    ) -> Result<T, E> {
        if !self.directs {
            // A leased shard keeps its wants for its next lease ask.
            return request(&self.shard);
        }
        self.settle(now_ms)?;
        self.shard
            .set_held_elsewhere(self.directory.held_by_shards()?);
        let out = request(&self.shard);
        let wants = self.shard.take_wants();
        if !wants.is_empty() {
            self.directory.reclaim_spare(&wants, None)?;
        }
        self.settle(now_ms)?;
        out
    }

    /// Runs one request of the directory, then delivers its view.
    fn on_directory<T, E: From<EngineError>>(
        &self,
        now_ms: i64,
        request: impl FnOnce(&Directory<Rc<S>>) -> Result<T, E>,
    ) -> Result<T, E> {
        let out = request(&self.directory);
        self.settle(now_ms)?;
        out
    }

    // ---- the directory ------------------------------------------------------

    /// The current node registry, if one was ever written.
    pub fn registry(&self) -> Result<Cached<NodeRegistry>, EngineError> {
        self.directory.registry()
    }

    /// The current routing policy, if one was ever written.
    pub fn policy(&self) -> Result<Cached<RoutingPolicy>, EngineError> {
        self.directory.policy()
    }

    /// The current revision of a document kind (0 before any).
    pub fn revision(&self, kind: DocKind) -> Result<u64, EngineError> {
        self.directory.revision(kind)
    }

    /// A document at its latest or a named revision.
    pub fn get_document(
        &self,
        kind: DocKind,
        revision: Option<u64>,
    ) -> Result<(u64, Json), DocError> {
        self.directory.get_document(kind, revision)
    }

    /// `PUT /v1/policy` and `PUT /v1/nodes` ([`Directory::put_document`]).
    pub fn put_document(
        &self,
        kind: DocKind,
        body: &[u8],
        if_match: Option<&str>,
        writer_fp: &str,
        now_ms: i64,
    ) -> Result<u64, DocError> {
        let open_calls = self.shard.open_calls()?;
        let revision = self.on_directory(now_ms, |d| {
            d.put_document(kind, body, if_match, writer_fp, &open_calls, now_ms)
        })?;
        if kind == DocKind::Shards {
            // The object's own shard holds the new map before the PUT is
            // answered (the object pushes it to the other shards).
            self.shard.handle_map(&self.map_notice(now_ms)?)?;
        }
        Ok(revision)
    }

    /// The map in force as the call shards need it, with the counts of the
    /// holding horizon ([`Directory::map_notice`]).
    pub fn map_notice(&self, now_ms: i64) -> Result<MapNotice, EngineError> {
        let horizon = self.config().timing.holding_horizon_ms();
        self.directory.map_notice(now_ms, horizon)
    }

    /// Every key of every registered node, and the registry revision.
    pub fn node_keys(&self) -> Result<(u64, Vec<NodeKey>), EngineError> {
        self.directory.node_keys()
    }

    /// True when `caller`'s node and key id are in the current registry.
    pub fn key_in_force(&self, caller: Caller<'_>) -> Result<bool, EngineError> {
        if !self.directs {
            let view = self.shard.directory_view();
            return Ok(view.key_in_force(caller.node, caller.kid));
        }
        self.directory.key_in_force(caller)
    }

    /// `POST /v1/nodes/heartbeat` ([`Directory::handle_heartbeat`]).
    pub fn handle_heartbeat(
        &self,
        caller: Caller<'_>,
        signed_at_s: i64,
        body: &[u8],
        now_ms: i64,
    ) -> Result<Json, HeartbeatRefusal> {
        let open_calls = self.shard.node_open_calls(caller.node)?;
        self.on_directory(now_ms, |d| {
            d.handle_heartbeat(caller, signed_at_s, body, open_calls, now_ms)
        })
    }

    /// A call shard's ask for a lease ([`Directory::handle_lease_ask`]),
    /// counting this object's own open calls, and carrying the map in force
    /// with its history as of now, which this object's own shard adopts too
    /// (as the holding horizon passes, the history narrows).
    pub fn handle_lease_ask(
        &self,
        ask: &LeaseAsk,
        now_ms: i64,
    ) -> Result<Option<Lease>, EngineError> {
        self.lease_for(ask, false, now_ms)
    }

    /// The same ask answered once more, before its first answer was sent:
    /// the shards it made the directory ask to report have reported
    /// ([`Engine::reclaim_pending`]), and the room they gave back counts.
    pub fn handle_lease_ask_again(
        &self,
        ask: &LeaseAsk,
        now_ms: i64,
    ) -> Result<Option<Lease>, EngineError> {
        self.lease_for(ask, true, now_ms)
    }

    fn lease_for(
        &self,
        ask: &LeaseAsk,
        again: bool,
        now_ms: i64,
    ) -> Result<Option<Lease>, EngineError> {
        let open = self.shard.open_calls()?;
        let map = self.map_notice(now_ms)?;
        self.shard.handle_map(&map)?;
        self.directory
            .handle_lease_ask(ask, &open, map, again, now_ms)
    }

    /// True when a call shard is to be asked to report
    /// ([`Engine::poll_reclaim`]).
    pub fn reclaim_pending(&self) -> bool {
        self.directory.reclaim_pending()
    }

    /// Another call shard's forward mark, applied to the node's forward
    /// health and, when that changed a decision, sent to this object's own
    /// shard.
    pub fn handle_mark(&self, mark: ForwardMark, now_ms: i64) -> Result<(), EngineError> {
        self.on_directory(now_ms, |d| d.handle_input(DirectoryInput::Mark(mark)))
    }

    /// When the answer to a directory request made at `now_ms` may be
    /// given: once every lease granted before the last change to what a
    /// decision reads has lapsed (SPEC §16; at once with no lease).
    pub fn acknowledge_at(&self, now_ms: i64) -> Result<i64, EngineError> {
        let decisive = self.directory.take_decisive();
        self.directory.acknowledge_at(now_ms, decisive)
    }

    /// The leases to revoke before the last change can be acknowledged
    /// ([`Directory::revoke_targets`]).
    pub fn revoke_targets(&self, now_ms: i64) -> Result<Vec<(u32, u64)>, EngineError> {
        self.directory.revoke_targets(now_ms)
    }

    /// A shard gave up its lease for ask `seq` ([`Directory::revoked`]).
    pub fn revoked(&self, shard: u32, seq: u64, now_ms: i64) -> Result<(), EngineError> {
        self.directory.revoked(shard, seq, now_ms)
    }

    /// The next shard to ask to report ([`Directory::poll_reclaim`]).
    pub fn poll_reclaim(&self) -> Option<u32> {
        self.directory.poll_reclaim()
    }

    /// `POST /v1/nodes/probe` ([`Directory::handle_probe`]).
    pub fn handle_probe(&self, node: &str, now_ms: i64) -> Result<ProbeAdmission, EngineError> {
        self.directory.handle_probe(node, now_ms)
    }

    // ---- the call shard ---------------------------------------------------

    /// A verified webhook ([`CallShard::handle_webhook`]).
    pub fn handle_webhook(
        &self,
        envelope: &crate::telnyx::Envelope,
        body: &str,
        headers: &[(String, String)],
        now_ms: i64,
    ) -> Result<Ingress, EngineError> {
        self.handle_placed_webhook(envelope, body, headers, &Arrival::default(), now_ms)
    }

    /// A verified webhook as the Worker placed it
    /// ([`CallShard::handle_placed_webhook`]).
    pub fn handle_placed_webhook(
        &self,
        envelope: &crate::telnyx::Envelope,
        body: &str,
        headers: &[(String, String)],
        arrival: &Arrival,
        now_ms: i64,
    ) -> Result<Ingress, EngineError> {
        self.on_shard(now_ms, |s| {
            s.handle_placed_webhook(envelope, body, headers, arrival, now_ms)
        })
    }

    /// Where a node's request about session `id` must go first
    /// ([`CallShard::redirect_for`]).
    pub fn redirect_for(
        &self,
        id: &str,
        arrival: &Arrival,
    ) -> Result<Option<Redirect>, EngineError> {
        self.shard.redirect_for(id, arrival)
    }

    /// Whether the shard holds session `id`, asked under `map`
    /// ([`CallShard::handle_holds`]).
    pub fn handle_holds(&self, id: &str, map: &MapNotice) -> Result<Holds, EngineError> {
        self.shard.handle_holds(id, map)
    }

    /// Whether the shard knows the leg `call_control_id`
    /// ([`CallShard::holds_leg`]).
    pub fn holds_leg(&self, call_control_id: &str) -> Result<bool, EngineError> {
        self.shard.holds_leg(call_control_id)
    }

    /// The outcome of a forward ([`CallShard::handle_report`]).
    pub fn handle_report(&self, report: &Report, now_ms: i64) -> Result<ReportEffect, EngineError> {
        self.on_shard(now_ms, |s| s.handle_report(report, now_ms))
    }

    /// `POST /v1/fence` ([`CallShard::handle_fence`]).
    pub fn handle_fence(
        &self,
        caller: Caller<'_>,
        req: &FenceRequest,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<FenceReply, EngineError> {
        self.on_shard(now_ms, |s| s.handle_fence(caller, req, keys, now_ms))
    }

    /// `POST /v1/claims` ([`CallShard::handle_claim`]).
    pub fn handle_claim(
        &self,
        caller: Caller<'_>,
        req: &ClaimRequest,
        now_ms: i64,
    ) -> Result<ClaimReply, EngineError> {
        self.on_shard(now_ms, |s| s.handle_claim(caller, req, now_ms))
    }

    /// `POST /v1/media/verify` ([`CallShard::handle_media_verify`]).
    pub fn handle_media_verify(
        &self,
        caller: Caller<'_>,
        token: &str,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<MediaReply, EngineError> {
        self.on_shard(now_ms, |s| {
            s.handle_media_verify(caller, token, keys, now_ms)
        })
    }

    /// The alarm: the shard's work, then the directory's retention
    /// (forgetting the beats of nodes no longer registered).
    pub fn poll_alarm(&self, now_ms: i64) -> Result<AlarmWork, EngineError> {
        let work = self.on_shard(now_ms, |s| s.poll_alarm(now_ms))?;
        if self.directs {
            self.on_directory(now_ms, |d| d.forget_unregistered(now_ms))?;
        }
        Ok(work)
    }

    /// When the alarm is next due ([`CallShard::next_alarm_at`]).
    pub fn next_alarm_at(&self, now_ms: i64) -> Result<Option<i64>, EngineError> {
        self.shard.next_alarm_at(now_ms)
    }

    /// `GET /v1/status`.
    pub fn status(&self, now_ms: i64) -> Result<Json, EngineError> {
        self.on_shard(now_ms, |s| s.status(now_ms))
    }

    /// `POST /v1/preview`.
    pub fn preview(&self, req: &PreviewRequest, now_ms: i64) -> Result<Option<Json>, EngineError> {
        self.on_shard(now_ms, |s| s.preview(req, now_ms))
    }

    /// `GET /v1/decisions`.
    pub fn decisions(
        &self,
        limit: Option<u32>,
        session: Option<&str>,
        after: Option<u64>,
    ) -> Result<Json, EngineError> {
        self.shard.decisions(limit, session, after)
    }

    /// `GET /v1/calls`.
    pub fn calls(&self, after: Option<&str>, limit: Option<u32>) -> Result<Json, EngineError> {
        self.shard.calls(after, limit)
    }

    /// `GET /v1/events` (the ledger export).
    pub fn events(&self, after: Option<u64>, limit: Option<u32>) -> Result<Json, EngineError> {
        self.shard.events(after, limit)
    }

    /// `GET /v1/calls/{id}`.
    pub fn call(&self, id: &str) -> Result<Option<Json>, EngineError> {
        self.shard.call(id)
    }

    /// What was refused under a limit since this engine started.
    pub fn refused(&self) -> Refused {
        self.shard.refused()
    }
}

#[cfg(feature = "testing")]
impl<S: Store> Engine<S> {
    /// `make bench`'s baseline ([`CallShard::writes_only_assign`]).
    #[doc(hidden)]
    pub fn writes_only_assign(
        &self,
        id: &str,
        node: &str,
        origin_url: &str,
        body: &str,
        now_ms: i64,
    ) -> Result<(), EngineError> {
        self.shard
            .writes_only_assign(id, node, origin_url, body, now_ms)
    }

    /// `make bench`'s baseline ([`CallShard::writes_only_deliver`]).
    #[doc(hidden)]
    pub fn writes_only_deliver(&self, id: &str, now_ms: i64) -> Result<(), EngineError> {
        self.shard.writes_only_deliver(id, now_ms)
    }
}
