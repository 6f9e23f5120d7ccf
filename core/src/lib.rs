//! callfence-core: every decision callfence makes, as plain Rust that does no
//! I/O, reads no clock and draws no randomness.
//!
//! The Worker (root crate) and the node agent (`agent/`) only translate HTTP
//! and storage to and from this crate. Time always arrives as a parameter
//! (`now_ms`, Unix milliseconds); storage arrives as a [`store::Store`].
//!
//! # Layout
//!
//! Wire formats and cryptography (pure functions):
//! - [`encoding`]: strict base64 flavours, SHA-256 hex, constant-time compare.
//! - [`time`]: RFC 3339 (UTC, milliseconds) to and from Unix milliseconds.
//! - [`number`]: phone number normalisation to canonical E.164, masking for logs.
//! - [`telnyx`]: carrier signature verification and webhook envelope parsing.
//! - [`node_auth`]: node-signed requests (`Callfence-*` headers).
//! - [`edge_hosts`]: `EDGE_HOSTNAMES`, the hosts node signatures are pinned to.
//! - [`assertion`]: the edge's signed `Callfence-Assertion` for forwarded webhooks.
//! - [`media`]: HMAC media tokens.
//! - [`fence`]: the deterministic answer `command_id`.
//! - [`heartbeat`]: heartbeat documents and the routing hash.
//! - [`wire`]: the node routes' request and answer bodies (fence, claim,
//!   media check, heartbeat answer), serialised by the agent and the
//!   Dispatcher alike.
//! - [`probe`]: the public L5 probe: nonce, body, rate limit, verdict.
//!
//! Documents (validated, versioned by compare-and-set):
//! - [`problem`]: `{path, problem}` validation findings.
//! - [`registry`]: the node registry.
//! - [`origin_host`]: an origin URL's host as the runtime parses it, and
//!   whether it is inside the edge's network.
//! - [`policy`]: the routing policy and its resolution rule.
//! - [`document`]: revision preconditions (`If-Match` or a body `revision`).
//! - [`shard_map`]: the shard map document (SPEC §16) and the rollback
//!   floor its history sets.
//! - [`placement`]: the shard a new session is placed on (jump hash).
//! - [`refusal`]: every refusal the edge answers: stable code, HTTP status,
//!   `Retry-After` and body fields, in one table.
//!
//! Decisions:
//! - [`eligibility`]: every reason a node may not take a new call.
//! - [`selection`]: preferred node, then the fallback order.
//! - [`decision`]: the evidence record of each routing decision.
//! - [`outcome`]: classification of an origin's answer to a forward.
//! - [`admission`]: shedding webhooks the Dispatcher cannot take in time.
//! - [`rate`]: token buckets as one stored number (a node's claims).
//! - [`metrics`]: the edge's metric families, counters, gauges and their
//!   Prometheus text exposition (SPEC §17).
//! - [`spanning`]: reads that span call shards (SPEC §16): decisions
//!   merged newest first, status counts summed, unreachable shards named.
//!
//! State (SQL through [`store::Store`], schema in `migrations/`):
//! - [`store`]: the storage trait, values, migrations runner, rusqlite backend;
//!   `sql`: what every machine's statements share (running one, reading a
//!   column, the named counters).
//! - [`config`], [`error`]: the Dispatcher's configuration and its one
//!   failure that is not a business answer.
//! - [`directory`]: the directory machine (SPEC §16): documents, keys,
//!   heartbeats, forward health, the probe's admission, and the view it
//!   sends the call shards.
//! - [`shard`]: the call-shard machine: ownership (typed states with
//!   guarded transitions), the event ledger, fences, claims, media checks,
//!   the re-forward rule, decisions, the alarm and its due time, and the
//!   read-only views (status, preview, decisions, calls).
//! - [`messages`]: the two messages between them, the directory's
//!   [`messages::DirectoryView`] and a shard's [`messages::ForwardMark`],
//!   versioned, and safe to deliver late, twice or out of order.
//! - [`engine`]: the two machines composed in one object, their messages
//!   passed synchronously; what the Durable Object runs.
//! - [`locate`]: the Worker's side of the holder handshake: which shard to
//!   send a webhook to, and whom to ask first, within 16 requests.
//! - [`delivery`]: the one delivery driver: what to send where with which
//!   budget, the report of its answer, and what comes next (the new owner,
//!   or the carrier's answer), polled by every shell that delivers.
//!
//! Imports go one way: `engine` uses `directory` and `shard`, which use
//! `messages` and never each other.
//!
//! # Invariants
//!
//! These hold after every state change; the simulation (`tests/sim`) checks
//! them after every step.
//! 1. At most one (node, epoch) is ever granted a call's fence, and only the
//!    current owner at the current epoch is granted it.
//! 2. Ownership never changes after a fence grant, and never after an
//!    ambiguous forward outcome.
//! 3. Epochs strictly increase across the whole Dispatcher and stay below 2^53.
//! 4. An outcome reported under a superseded epoch changes nothing.
//! 5. A delivered event is never forwarded again.
//! 6. Invalid or unsigned input changes no stored state.
//! 7. Only eligible nodes are chosen, and every assignment cites the policy
//!    and registry revisions and a clean SHA.
//! 8. Document revisions only grow; a stale compare-and-set changes nothing.
//! 9. Each node's maintained open-call count (`node_load`) equals the number
//!    of its sessions that are `assigned` or `answered`.
//! 10. After every step, the engine's next alarm time is exactly when the
//!     stored work is next due (parked events, re-drives, lapsing leases,
//!     the sweep): never late, never missing.
//! 11. A reassigned event is forwarded again at once if and only if a hop is
//!     left (`MAX_HOPS`) and the carrier's budget left is at least
//!     `MIN_REFORWARD_BUDGET_MS`.
//! 12. A node op under a (node, key id) not in the current registry is
//!     refused `unknown_node_key` and changes nothing.
//! 13. No pruning, by age or by row cap, ever removes a live session (open,
//!     or fenced and not ended) or the legs and ledger events of one; at
//!     `SESSION_CAP` with only live sessions a new session is refused
//!     `storage_full` and nothing is evicted.
//! 14. A delivery sends each attempt of an event (its epoch and attempt
//!     number) at most once: only the engine starts another attempt
//!     ([`delivery`]'s driver never resends).

#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod admission;
pub mod assertion;
pub mod config;
pub mod decision;
pub mod delivery;
pub mod directory;
pub mod document;
pub mod edge_hosts;
pub mod eligibility;
pub mod encoding;
pub mod engine;
pub mod error;
pub mod fence;
pub mod heartbeat;
pub mod locate;
pub mod media;
pub mod messages;
pub mod metrics;
pub mod node_auth;
pub mod number;
pub mod origin_host;
pub mod outcome;
pub mod placement;
pub mod policy;
pub mod probe;
pub mod problem;
pub mod rate;
pub mod refusal;
pub mod registry;
pub mod selection;
pub mod shard;
pub mod shard_map;
pub mod spanning;
pub(crate) mod sql;
pub mod store;
pub mod telnyx;
pub mod time;
pub mod wire;

/// The largest epoch or revision the Dispatcher will issue: the Durable
/// Object's SQLite binding carries integers as JavaScript numbers.
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;
