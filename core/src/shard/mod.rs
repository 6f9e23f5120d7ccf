//! The call-shard machine (SPEC §16): call ownership with its epochs, the
//! event ledger, fences, media checks, claims, decisions, parked events and
//! the alarm that re-drives, rejects, sweeps and prunes them.
//!
//! [`CallShard`] owns a [`Store`] handle and a configuration and nothing
//! else that matters: its caches are rebuilt from SQL after a restart. It
//! reads the directory only through the newest [`DirectoryView`] it has
//! been sent ([`ShardInput::View`]), and tells the directory how forwards
//! ended with [`ForwardMark`]s ([`ShardOutput::Mark`], drained with
//! [`CallShard::poll_output`] after every input, as in str0m). It decides
//! on its own marks at once, before the directory has them: a failure it
//! saw counts against the node in its next decision.
//!
//! Its requests come in four kinds, as in quinn-proto:
//! - `handle_*(…, now_ms)`: an incoming request or event
//!   ([`CallShard::handle_webhook`], [`CallShard::handle_report`],
//!   [`CallShard::handle_fence`], [`CallShard::handle_claim`],
//!   [`CallShard::handle_media_verify`]);
//! - [`CallShard::handle_input`] and [`CallShard::poll_output`]: the
//!   messages to and from the directory;
//! - [`CallShard::poll_alarm`]: what the shard must do when its alarm fires
//!   (forwards to make) and when it should fire next;
//! - getters: the read-only views (`status`, `preview`, `decisions`, `call`,
//!   `calls`, `events`).
//!
//! Every method that changes state reads, checks its preconditions and
//! writes inside one [`Store::atomically`] unit with nothing awaited in
//! between, so a transition's guard (epoch, fence, ended) and its write can
//! never be split. Node operations take the [`Caller`](crate::node_auth::Caller) (node and key id) and
//! refuse a key that the view's registry does not list (`unknown_node_key`).
//!
//! Forwards are not performed here: a method that wants an event delivered
//! returns a [`Forward`]; the caller drives it with core's delivery driver
//! ([`crate::delivery::Delivery`]), which says what to send with which
//! budget and makes the report of the origin's answer, and applies that with
//! [`CallShard::handle_report`], bound to the epoch, attempt and hop it
//! carried. Whether a reassigned event is forwarded again at once is
//! [`may_reforward`]. After every state change the caller asks
//! [`CallShard::next_alarm_at`] when its alarm is next due: it is one
//! indexed read after a change and free otherwise.
//!
//! # Layout
//! - `ownership`: a session's ownership states as types and their guarded
//!   transitions (assign, reassign, release, fence, end), `place`, the one
//!   assignment path, and why a placement parks ([`PendingReason`]);
//! - `ingress`, `reports`, `fencing`, `alarm`: the `handle_*` methods and
//!   `poll_alarm`;
//! - `holder`: the holder rule: whether a session not held here may be
//!   created here, the map the shard adopted, and `handle_holds`;
//! - `lease`: the lease a shard other than `global` decides under, and the
//!   room it (or, in `global`, the other shards) leaves on each node;
//! - `view`: what a decision reads: the directory's view with the shard's
//!   own marks and open calls;
//! - `routing`: resolution and selection, pure functions of that view, the
//!   decision record and the target (node and origin) a placement assigns;
//! - `rows`: sessions, legs and events as read back;
//! - `queries`: the shard's SQL, one named function each;
//! - `requests`, `views`: request bodies and the read-only views;
//! - `refusals`: what was refused under a limit (claims over capacity or
//!   rate, new sessions at `SESSION_CAP`), counted in memory for status;
//! - `writes_only`: `make bench`'s baseline, an assignment's writes alone
//!   (only with the `testing` feature: test and bench builds).
//!
//! Imports between these modules go one way (the handlers use `ownership`,
//! which uses `routing`, `view` and `queries`); no two of them import each
//! other, and nothing here imports the directory.

mod alarm;
mod fencing;
mod holder;
mod ingress;
mod lease;
pub(crate) mod ownership;
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
pub use fencing::{ClaimReply, FenceGrant, FenceRefusal, FenceReply, MediaRefusal, MediaReply};
pub use holder::{Arrival, Holds};
pub use ingress::{Delivered, Ingress};
pub use ownership::PendingReason;
pub use refusals::Refused;
pub use reports::{
    may_reforward, Report, ReportEffect, ReportedAnswer, MAX_HOPS, MIN_REFORWARD_BUDGET_MS,
};
pub use requests::{BadRequest, ClaimRequest, FenceRequest, MediaVerifyRequest, PreviewRequest};
pub use views::{DEFAULT_LIMIT, MAX_LIMIT, MAX_PAGE, STATUS_DECISIONS};

use crate::config::EngineConfig;
use crate::error::EngineError;
use crate::messages::{DirectoryView, ForwardMark, ForwardResult, Health, PerNode};
use crate::metrics::Counters;
use crate::store::{Store, StoreError};
use queries::{AlarmFacts, Queries};
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::rc::Rc;

/// A message a call shard takes from the directory.
#[derive(Debug, Clone)]
pub enum ShardInput {
    /// The directory's view: kept when it supersedes the one held, else
    /// dropped (a late or repeated view changes nothing).
    View(Rc<DirectoryView>),
}

/// A message a call shard sends the directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardOutput {
    /// How a forward ended ([`crate::directory::Directory::handle_mark`]).
    Mark(ForwardMark),
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

/// What the shard keeps in memory: the alarm's facts as of the last
/// write. A failed unit drops it.
#[derive(Default, Clone)]
struct Cache {
    alarm: Option<AlarmFacts>,
    /// The map adopted (`holder`).
    map: Option<crate::messages::MapNotice>,
}

/// A copy of a shard's in-memory state that the model check restores
/// ([`CallShard::caches`]).
#[cfg(feature = "testing")]
#[doc(hidden)]
#[derive(Clone)]
pub struct Caches {
    cache: Cache,
    view: Rc<DirectoryView>,
    marks: PerNode<Health>,
    outbox: Vec<ForwardMark>,
}

/// A call shard: see the module documentation.
pub struct CallShard<S: Store> {
    store: S,
    /// This shard's number: 0 is `global`, `k` is `calls-k`.
    index: u32,
    config: EngineConfig,
    cache: RefCell<Cache>,
    /// The newest view the directory sent.
    view: RefCell<Rc<DirectoryView>>,
    /// The health this shard's own reports gave nodes, until a view from
    /// the directory has it too.
    marks: RefCell<PerNode<Health>>,
    /// Marks not yet drained by [`CallShard::poll_output`].
    outbox: RefCell<Vec<ForwardMark>>,
    /// Requests refused under a limit since this shard started.
    refused: std::cell::Cell<Refused>,
    /// The metrics counted since this shard started (SPEC §17).
    metrics: Counters,
    /// `None` for `global`'s shard; else the lease held, if any (`lease`).
    lease_state: RefCell<Option<Option<lease::HeldLease>>>,
    /// The newest lease ask since this shard started.
    asked: std::cell::Cell<Option<u64>>,
    /// Nodes whose cap a decision found reached, for the next ask.
    wants: RefCell<Vec<String>>,
    /// True once the decision being made found a node full for want of
    /// room another shard may hold (`lease::Undo::NeedRoom`).
    short: std::cell::Cell<bool>,
    /// True while decisions are taken as they stand ([`CallShard::as_is`]).
    as_is: std::cell::Cell<bool>,
    /// In `global`: per node, the open calls the other shards may hold.
    elsewhere: RefCell<PerNode<u32>>,
}

impl<S: Store> CallShard<S> {
    /// A shard over `store`, whose schema must already be migrated. Until
    /// the directory's first view arrives it knows no node, and parks
    /// every new call.
    pub fn new(store: S, config: EngineConfig) -> Self {
        Self {
            store,
            index: 0,
            config,
            cache: RefCell::new(Cache::default()),
            view: RefCell::new(Rc::new(DirectoryView::empty())),
            marks: RefCell::new(PerNode::default()),
            outbox: RefCell::new(Vec::new()),
            refused: std::cell::Cell::new(Refused::default()),
            metrics: Counters::default(),
            lease_state: RefCell::new(None),
            asked: std::cell::Cell::new(None),
            wants: RefCell::new(Vec::new()),
            short: std::cell::Cell::new(false),
            as_is: std::cell::Cell::new(false),
            elsewhere: RefCell::new(PerNode::default()),
        }
    }

    /// The same shard numbered `index` (`calls-{index}`; 0 is `global`).
    pub fn numbered(mut self, index: u32) -> Self {
        self.index = index;
        self
    }

    /// The metrics counted since this shard started: the shard stages its
    /// decisions and the alarm's rejections within their units, and the
    /// Dispatcher counts answers here.
    pub fn metrics(&self) -> &Counters {
        &self.metrics
    }

    /// The storage backend (for tests and the simulation's checker).
    pub fn store(&self) -> &S {
        &self.store
    }

    /// The configuration.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// A message from the directory.
    pub fn handle_input(&self, input: ShardInput) {
        match input {
            ShardInput::View(view) => {
                if view.v != crate::messages::VIEW_VERSION || !view.supersedes(&self.view.borrow())
                {
                    return;
                }
                // Own marks the directory now has are dropped.
                self.marks.borrow_mut().retain(|node, own| {
                    let theirs = view.nodes.get(node).map(|n| n.health).unwrap_or_default();
                    theirs.merge(own) != theirs
                });
                *self.view.borrow_mut() = view;
            }
        }
    }

    /// The next message for the directory, if any.
    pub fn poll_output(&self) -> Option<ShardOutput> {
        let mut outbox = self.outbox.borrow_mut();
        (!outbox.is_empty()).then(|| ShardOutput::Mark(outbox.remove(0)))
    }

    /// A message from [`CallShard::poll_output`] that could not be
    /// delivered: it is the next one polled again. (Marks are idempotent,
    /// so sending one again is always safe.)
    pub fn retry_output(&self, output: ShardOutput) {
        let ShardOutput::Mark(mark) = output;
        self.outbox.borrow_mut().insert(0, mark);
    }

    /// The view held now (the newest the directory sent).
    pub fn directory_view(&self) -> Rc<DirectoryView> {
        self.view.borrow().clone()
    }

    /// A copy of the in-memory state (the model check gives each explored
    /// history its own). Only with the `testing` feature.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn caches(&self) -> Caches {
        Caches {
            cache: self.cache.borrow().clone(),
            view: self.view.borrow().clone(),
            marks: self.marks.borrow().clone(),
            outbox: self.outbox.borrow().clone(),
        }
    }

    /// Replaces the in-memory state (see [`CallShard::caches`]).
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn set_caches(&self, caches: Caches) {
        *self.cache.borrow_mut() = caches.cache;
        *self.view.borrow_mut() = caches.view;
        *self.marks.borrow_mut() = caches.marks;
        *self.outbox.borrow_mut() = caches.outbox;
    }

    fn q(&self) -> Queries<'_, S> {
        Queries::new(&self.store)
    }

    /// Records how a forward to `node` ended, inside the report's unit: the
    /// shard decides on it at once, and the directory hears of a failure,
    /// or of a delivery to a node known as failing (nothing else changes
    /// eligibility, so nothing else is sent).
    fn mark(&self, node: &str, result: ForwardResult, now_ms: i64) {
        let mark = ForwardMark::new(node, result, now_ms);
        let theirs = self
            .view
            .borrow()
            .nodes
            .get(node)
            .map(|n| n.health)
            .unwrap_or_default();
        let mut marks = self.marks.borrow_mut();
        let own = marks.get(node).unwrap_or_default();
        let known = theirs.merge(own);
        if result == ForwardResult::Delivered && !known.failing() {
            return;
        }
        marks.set(node, own.with(&mark));
        self.outbox.borrow_mut().push(mark);
    }

    /// Runs one state-changing unit atomically. Whatever its outcome, the
    /// alarm's cached facts are stale; when it fails (and the store rolled
    /// it back) what the unit staged is dropped: the cache, the metrics and
    /// the marks it made.
    fn unit<T, E: From<StoreError>>(&self, work: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
        let (marks, queued) = (self.marks.borrow().clone(), self.outbox.borrow().len());
        let result = self.store.atomically(work);
        let mut cache = self.cache.borrow_mut();
        cache.alarm = None;
        if result.is_err() {
            *cache = Cache::default();
            *self.marks.borrow_mut() = marks;
            self.outbox.borrow_mut().truncate(queued);
            self.metrics.discard();
        } else {
            self.metrics.commit();
        }
        result
    }
}
