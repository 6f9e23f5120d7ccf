//! The Dispatcher state machine: the single authority over documents,
//! heartbeats, call ownership, the event ledger, fences and decisions, in
//! two sides, a directory and a call shard (see Layout).
//!
//! [`Engine`] owns a [`Store`] and a configuration and nothing else that
//! matters: its caches are rebuilt from SQL after a restart. Its methods come
//! in four kinds, as in quinn-proto:
//! - `handle_*(…, now_ms)`: an incoming request or event ([`Engine::handle_webhook`],
//!   [`Engine::handle_report`], [`Engine::handle_heartbeat`], [`Engine::handle_fence`],
//!   [`Engine::handle_claim`], [`Engine::handle_media_verify`], [`Engine::handle_probe`]);
//! - mutators for operator commands ([`Engine::put_document`]);
//! - [`Engine::poll_alarm`]: what the Dispatcher must do when its alarm fires
//!   (forwards to make) and when it should fire next;
//! - getters: the read-only views (`status`, `preview`, `decisions`, `call`,
//!   `get_document`, `node_keys`).
//!
//! Every method that changes state reads, checks its preconditions and writes
//! inside one [`Store::atomically`] unit with nothing awaited in between, so a
//! transition's guard (epoch, fence, ended) and its write can never be split.
//! Node operations take the [`Caller`] (node and key id) and refuse a key
//! that is no longer in the current registry (`unknown_node_key`).
//!
//! Forwards are not performed here: a method that wants an event delivered
//! returns a [`Forward`]; the caller drives it with core's delivery driver
//! ([`crate::delivery::Delivery`]), which says what to send with which
//! budget and makes the report of the origin's answer, and applies that with
//! [`Engine::handle_report`], bound to the epoch, attempt and hop it
//! carried. Whether a reassigned event is forwarded again at once is
//! [`may_reforward`]. After every state change the caller asks
//! [`Engine::next_alarm_at`] when its alarm is next due (sans-IO, as str0m's
//! "drain `poll_output` after every input"): it is one indexed read after a
//! change and free otherwise.
//!
//! # Layout
//!
//! The engine has two sides, the seam of SPEC §16 (a *directory* and
//! *call shards*); today both run in the one object `global`, over one
//! database, and each unit may span both.
//!
//! The **directory** (documents, keys, heartbeats, eligibility facts,
//! forward-failure marks, the L5 probe, the open-call counts capacity is
//! decided on):
//! - `documents`, `nodes`, `probes`: document writes and reads, key checks,
//!   heartbeats, the probe's admission; `nodes` takes the
//!   [`DirectoryView`] ([`Engine::directory_view`](Engine)) and applies
//!   [`ForwardMark`]s.
//!
//! The **call shard** (ownership, epochs, the ledger, fences, media checks,
//! claims, decisions, parked events, the alarm):
//! - `ownership`: a session's ownership states as types and their
//!   guarded transitions (assign, reassign, release, fence, end),
//!   `Engine::place`, the one assignment path, and why a placement parks
//!   ([`PendingReason`]);
//! - `ingress`, `reports`, `fencing`, `alarm`: the `handle_*` methods and
//!   `poll_alarm`;
//! - `routing`: resolution and selection, pure functions of a
//!   [`DirectoryView`], the decision record and the target (node and
//!   origin) a placement assigns;
//! - `rows`: sessions, legs and events as read back;
//! - `refusals`: what was refused under a limit (claims over capacity or
//!   rate, new sessions at `SESSION_CAP`), counted in memory for status;
//! - `writes_only`: `make bench`'s baseline, an assignment's writes alone
//!   (only with the `testing` feature: test and bench builds).
//!
//! The shard side reads the directory only through the two messages that
//! will cross objects when the shards are objects of their own:
//! - `view`: [`DirectoryView`], directory to shard: the documents in force
//!   with their revisions and each registered node's beat, forward health
//!   and open calls, versioned (`v`) and ordered
//!   ([`DirectoryView::supersedes`]), taken in the unit of the decision
//!   that reads it; the key check of a claim reads it too (fences and media
//!   checks still ask [`Engine::key_in_force`]);
//! - `marks`: [`ForwardMark`], shard to directory: a forward delivered or
//!   failed, versioned and idempotent, applied in the report's unit
//!   before any re-placement reads the view.
//!
//! Shared: `queries` (every SQL statement, one named function each, by
//! table: `nodes` is the directory's documents, beats and forward health,
//! and the decisions; `sessions`, `events`, `retention` the shard's),
//! `requests` and `views` (request bodies and the read-only views, which
//! read both sides).
//!
//! Imports between these modules go one way (the handlers use `ownership`,
//! which uses `routing` and `queries`; `nodes` uses `view` and `marks`); no
//! two of them import each other.

mod alarm;
mod documents;
mod fencing;
mod ingress;
mod marks;
mod nodes;
pub(crate) mod ownership;
mod probes;
pub(crate) mod queries;
mod refusals;
mod reports;
mod requests;
mod routing;
pub(crate) mod rows;
mod view;
mod views;
#[cfg(feature = "testing")]
mod writes_only;

pub use alarm::{AlarmWork, ROWS_PER_SESSION};
pub use documents::DocError;
pub use fencing::{ClaimReply, FenceGrant, FenceRefusal, FenceReply, MediaRefusal, MediaReply};
pub use ingress::{Delivered, Ingress};
pub use marks::{ForwardMark, ForwardResult, MARK_VERSION};
pub use nodes::{Caller, HeartbeatRefusal, NodeKey};
pub use ownership::PendingReason;
pub use probes::ProbeAdmission;
pub use refusals::Refused;
pub use reports::{
    may_reforward, Report, ReportEffect, ReportedAnswer, MAX_HOPS, MIN_REFORWARD_BUDGET_MS,
};
pub use requests::{BadRequest, ClaimRequest, FenceRequest, MediaVerifyRequest, PreviewRequest};
pub use view::{DirectoryView, VIEW_VERSION};

use crate::document::DocKind;
use crate::eligibility::Beat;
use crate::metrics::Counters;
use crate::policy::RoutingPolicy;
use crate::registry::NodeRegistry;
use crate::store::{Store, StoreError};
use queries::{AlarmFacts, Queries};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::collections::HashMap;
use std::rc::Rc;

/// Timing of the Dispatcher's background work. The defaults are the
/// contract's; tests may shorten them (documented as test-only in docs/operations.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Timing {
    /// How long a parked event is re-evaluated before it is rejected (10 s).
    pub pending_window_ms: i64,
    /// How often a parked event is re-evaluated (1 s).
    pub pending_retry_ms: i64,
    /// Extra lease beyond the forward budget (500 ms).
    pub lease_grace_ms: i64,
    /// Delays of the alarm's re-drives of an unknown event after its lease
    /// (0, then 1, 2, 4, 8 s).
    pub redrive_backoff_ms: Vec<i64>,
    /// A session whose owner's beat has been stale this long is `node_lost` (120 s).
    pub node_lost_after_ms: i64,
    /// A session older than this is settled as `max_duration` (4 h).
    pub max_duration_ms: i64,
    /// Rows untouched this long are pruned (24 h).
    pub retention_ms: i64,
    /// How often the alarm sweeps while calls are open (30 s).
    pub sweep_interval_ms: i64,
}

impl Default for Timing {
    fn default() -> Self {
        Self {
            pending_window_ms: 10_000,
            pending_retry_ms: 1_000,
            lease_grace_ms: 500,
            redrive_backoff_ms: vec![0, 1_000, 2_000, 4_000, 8_000],
            node_lost_after_ms: 120_000,
            max_duration_ms: 4 * 3_600_000,
            retention_ms: 24 * 3_600_000,
            sweep_interval_ms: 30_000,
        }
    }
}

/// The Dispatcher's configuration.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// The origin forward budget (`FORWARD_TIMEOUT_MS`, default 1500).
    pub forward_timeout_ms: i64,
    /// `TELNYX_CONNECTION_IDS`: events of other connections are `ignored`.
    pub connection_ids: Option<Vec<String>>,
    /// `ORIGIN_ALLOW_PLAINTEXT`: accept `http://` origins in the registry.
    pub allow_plaintext: bool,
    /// Background timing.
    pub timing: Timing,
    /// `SESSION_CAP`: the sessions table's row cap (SPEC §9), at least 1.
    /// The legs' and events' caps are [`ROWS_PER_SESSION`] times it.
    pub session_cap: i64,
}

/// `SESSION_CAP` when unset.
pub const DEFAULT_SESSION_CAP: i64 = 100_000;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            forward_timeout_ms: 1_500,
            connection_ids: None,
            allow_plaintext: false,
            timing: Timing::default(),
            session_cap: DEFAULT_SESSION_CAP,
        }
    }
}

/// A failure of the engine that is not a business answer: the caller must
/// answer 503 `dispatcher_unavailable` and change nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EngineError {
    /// The storage backend failed.
    Store(StoreError),
    /// A stored row could not be read back.
    Corrupt(String),
}

impl std::fmt::Display for EngineError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EngineError::Store(e) => write!(f, "{e}"),
            EngineError::Corrupt(what) => write!(f, "corrupt stored state: {what}"),
        }
    }
}

impl std::error::Error for EngineError {}

impl From<StoreError> for EngineError {
    fn from(e: StoreError) -> Self {
        EngineError::Store(e)
    }
}

/// A webhook the caller must send to an origin now, then report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forward {
    /// Telnyx's `data.id`.
    pub event_id: String,
    /// The session the event belongs to.
    pub call_session_id: String,
    /// The leg, when the event names one.
    pub call_control_id: Option<String>,
    /// The owner it goes to.
    pub node: String,
    /// The owner's origin URL recorded at assignment.
    pub origin_url: String,
    /// The epoch it is sent under.
    pub epoch: u64,
    /// The attempt number (1 for the first send).
    pub attempt: u32,
    /// The stored raw body, unchanged.
    pub body: String,
    /// The stored Telnyx headers (`content-type`, `telnyx-signature-ed25519`,
    /// `telnyx-timestamp`), unchanged.
    pub headers: Vec<(String, String)>,
}

/// A document with its revision, cached by revision.
type Cached<T> = Option<(u64, Rc<T>)>;

/// What the engine keeps in memory: documents by revision, each node's last
/// accepted beat (parsed), and the alarm's facts as of the last write. All
/// of it is rebuilt from SQL on demand; a failed unit drops all of it.
#[derive(Default, Clone)]
struct Cache {
    nodes: Option<Cached<NodeRegistry>>,
    policy: Option<Cached<RoutingPolicy>>,
    beats: HashMap<String, Option<Rc<Beat>>>,
    alarm: Option<AlarmFacts>,
}

/// A copy of an engine's in-memory caches ([`Engine::caches`]).
#[cfg(feature = "testing")]
#[doc(hidden)]
#[derive(Default, Clone)]
pub struct Caches(Cache);

/// The Dispatcher: see the module documentation.
pub struct Engine<S: Store> {
    store: S,
    config: EngineConfig,
    cache: RefCell<Cache>,
    /// Requests refused under a limit since this engine started.
    refused: std::cell::Cell<Refused>,
    /// The metrics counted since this engine started (SPEC §17).
    metrics: Counters,
}

impl<S: Store> Engine<S> {
    /// An engine over `store`, whose schema must already be migrated.
    pub fn new(store: S, config: EngineConfig) -> Self {
        Self {
            store,
            config,
            cache: RefCell::new(Cache::default()),
            refused: std::cell::Cell::new(Refused::default()),
            metrics: Counters::default(),
        }
    }

    /// The metrics counted since this engine started: the engine stages
    /// its decisions and the alarm's rejections within their units, and the
    /// Dispatcher counts answers here.
    pub fn metrics(&self) -> &Counters {
        &self.metrics
    }

    /// The storage backend (for tests and the simulation's checker). Writes
    /// through it bypass the engine's caches.
    pub fn store(&self) -> &S {
        &self.store
    }

    /// Gives the store back (to simulate a restart: a new engine on the same
    /// storage starts with empty caches).
    pub fn into_store(self) -> S {
        self.store
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// A copy of the in-memory caches (cheap: shared parsed documents and
    /// beats). Only the model check uses it: it explores many histories on
    /// one engine and database, and gives each history its own caches back
    /// with [`Engine::set_caches`] when it returns to it, so that a cache
    /// that disagrees with the database (a planted bug) is explored exactly.
    /// Only with the `testing` feature.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn caches(&self) -> Caches {
        Caches(self.cache.borrow().clone())
    }

    /// Replaces the in-memory caches (see [`Engine::caches`]).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn set_caches(&self, caches: Caches) {
        *self.cache.borrow_mut() = caches.0;
    }

    fn q(&self) -> Queries<'_, S> {
        Queries::new(&self.store)
    }

    /// Runs one state-changing unit atomically. Whatever its outcome, the
    /// alarm's cached facts are stale; when it fails (and the store rolled
    /// it back) every cache is dropped, since it may hold what the unit read
    /// or wrote.
    fn unit<T, E: From<StoreError>>(&self, work: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let result = self.store.atomically(work);
        let mut cache = self.cache.borrow_mut();
        cache.alarm = None;
        if result.is_err() {
            *cache = Cache::default();
            self.metrics.discard();
        } else {
            self.metrics.commit();
        }
        result
    }

    /// The current node registry, if one was ever written.
    pub fn registry(&self) -> Result<Cached<NodeRegistry>, EngineError> {
        if let Some(cached) = &self.cache.borrow().nodes {
            return Ok(cached.clone());
        }
        let loaded = self
            .latest_document(DocKind::Nodes)?
            .map(|(revision, doc)| {
                crate::registry::validate(&doc, true)
                    .map(|r| (revision, Rc::new(r)))
                    .map_err(|_| EngineError::Corrupt("stored node registry".into()))
            })
            .transpose()?;
        self.cache.borrow_mut().nodes = Some(loaded.clone());
        Ok(loaded)
    }

    /// The current routing policy, if one was ever written.
    pub fn policy(&self) -> Result<Cached<RoutingPolicy>, EngineError> {
        if let Some(cached) = &self.cache.borrow().policy {
            return Ok(cached.clone());
        }
        let loaded = match self.latest_document(DocKind::Policy)? {
            None => None,
            Some((revision, doc)) => Some((revision, Rc::new(documents::load_policy(&doc)?))),
        };
        self.cache.borrow_mut().policy = Some(loaded.clone());
        Ok(loaded)
    }

    /// Forgets cached documents (after a write, or to simulate a restart).
    fn invalidate(&self, kind: DocKind) {
        let mut cache = self.cache.borrow_mut();
        match kind {
            DocKind::Nodes => cache.nodes = None,
            DocKind::Policy => cache.policy = None,
        }
    }
}
