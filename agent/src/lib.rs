//! callfence-agent: the program that runs on each phone node next to the
//! voice app (SPEC §11).
//!
//! It tells the edge what the node really is (signed heartbeats), admits only
//! webhooks the edge routed to this node (the verifying origin proxy), makes
//! the node ask the edge for the answer fence before it answers a call (the
//! local API), and keeps its operating mode on disk so that a node that lost
//! its mind comes back `drained`, never `active`.
//!
//! # Layout
//!
//! Plumbing:
//! - [`clock`]: the wall clock, read in one place.
//! - [`log`]: one JSON line per event on stderr; never a secret or a body.
//! - [`files`]: durable small files (temp file, fsync, rename) and permission checks.
//! - [`net`]: the shared HTTP client and bounded body reads.
//! - [`duration`]: durations as operators type them (`30m`, `90s`).
//!
//! What the node is:
//! - [`config`]: the TOML configuration and its validation.
//! - [`keys`]: node signing keys: generation, loading, rotation to a `next` key.
//! - [`mode`]: the persisted, fail-closed mode (`active`, `shadow`, `drained`).
//! - [`seq`]: the persisted, strictly increasing heartbeat sequence number.
//! - [`git`]: the SHA and cleanliness of the runtime checkout; the one way
//!   git is run (no configured program ever runs).
//! - [`identity`]: the agent's own user and the accounts it names.
//! - [`probe`]: the voice app's status contract and the tunnel probe.
//!
//! Talking to others:
//! - [`edge`]: node-signed requests to the edge (§6).
//! - [`heartbeat`]: building, signing and sending beats; the edge's verdict,
//!   kept as the last-beat record (`last_beat.json`).
//! - [`telnyx_api`]: Telnyx Call Control commands with `command_id` resends.
//!
//! Serving:
//! - [`ledger`]: the durable webhook ledger (`received` → `completed`).
//! - [`forward`]: the origin proxy's decisions: admit or refuse a forward,
//!   what the ledger's entry says, what completes an event.
//! - [`proxy`]: the origin proxy `POST /callfence/telnyx`, translating
//!   HTTP, the ledger and the app to and from [`forward`].
//! - [`serve`]: both listeners' bounds: open connections, read timeouts,
//!   the open-file budget.
//! - [`local_auth`]: who may call the local API: Origin, Host, JSON, the
//!   bearer token in `state_dir/local-api.token`.
//! - [`fence`]: the local API's decisions: an answer request, the fence
//!   reply, Telnyx's answer after a grant, a dial's claim, the media check.
//! - [`local_api`]: the loopback API for the voice app (`/local/*`, probes,
//!   `/metrics`), translating HTTP, the edge and Telnyx to and from [`fence`].
//! - [`metrics`]: the agent's Prometheus metrics, counted with one call
//!   where each event is seen; [`scrape`] serves them at `GET /metrics` and
//!   on the `metrics_listen` listener, where they are the only route.
//! - [`telnyx_options`]: the Telnyx answer and dial options a caller may pass.
//! - [`control`]: the Unix control socket the `deploy`, `rollback` and `job`
//!   commands use (the agent's own user or root only).
//! - [`context`]: the handles the running agent shares between its tasks.
//! - [`run`]: the `run` command: servers, heartbeat loop, upkeep.
//! - [`drain`]: the `drain` command.
//! - [`status`]: the `status` command.
//! - [`deploy`]: clean deployment: `deploy --sha`, `rollback`, `releases`,
//!   the journal and the automatic restore (SPEC §14).
//! - [`notify`]: the systemd notify protocol and watchdog pings.
//!
//! Decisions are plain functions without I/O, unit-tested where they live
//! ([`forward`], [`fence`], [`deploy::verdict`], [`deploy::report`]); the
//! handlers, the deploy sequences and the commands translate to and from
//! them. No two modules import each other, directly or in a circle.
//!
//! Binaries besides `callfence-agent` (in `src/bin/`): `callfence-demo-app`,
//! a minimal voice app, `callfence-fake-telnyx`, the one fake Telnyx Call
//! Control API that `make dev`, the end-to-end suites and this crate's
//! integration tests share, and `callfence-fake-notify`, systemd's side of
//! the notify socket for the deploy drill.

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod clock;
pub mod config;
pub mod context;
pub mod control;
pub mod deploy;
pub mod drain;
pub mod duration;
pub mod edge;
pub mod fence;
pub mod files;
pub mod forward;
pub mod git;
pub mod heartbeat;
pub mod identity;
pub mod keys;
pub mod ledger;
pub mod local_api;
pub mod local_auth;
pub mod log;
pub mod metrics;
pub mod mode;
pub mod net;
pub mod notify;
pub mod probe;
pub mod proxy;
pub mod run;
pub mod scrape;
pub mod seq;
pub mod serve;
pub mod status;
pub mod telnyx_api;
pub mod telnyx_options;

use std::fmt;

/// An operator-facing failure: what went wrong, in words that never include a
/// secret. The binary prints it and exits non-zero.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentError(pub String);

impl AgentError {
    /// Builds an error from any message.
    pub fn new(message: impl Into<String>) -> Self {
        AgentError(message.into())
    }
}

impl fmt::Display for AgentError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for AgentError {}

/// The agent's version, reported in every heartbeat as `agent_version`.
pub const AGENT_VERSION: &str = env!("CARGO_PKG_VERSION");
