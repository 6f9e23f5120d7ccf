//! The messages between the directory and a call shard (SPEC §16). In one
//! object they are function arguments; between objects each is one small
//! plain value, versioned (`v`) so that a
//! receiver refuses a format it does not know, and safe to deliver late,
//! twice or out of order:
//! - [`view`]: [`DirectoryView`], directory to shard: the documents in force
//!   and each registered node's beat and forward health. A shard keeps the
//!   newest it has seen ([`DirectoryView::supersedes`]).
//! - [`mark`]: [`ForwardMark`], shard to directory: a forward failed, or
//!   delivered to a node that was failing. Applying one only raises a time.
//! - [`lease`]: [`LeaseAsk`], shard to directory, and [`Lease`], back: the
//!   view and per-node caps a shard other than `global` decides under.
//! - [`map`]: [`MapNotice`], directory to shard (and carried by the Worker
//!   with every request it places): the shard map and the shard counts of
//!   its recent history. A shard keeps the newest revision it has seen.
//!
//! Between objects each travels as JSON through serde (the derives on each
//! type); the simulation's lease world sends every ask and lease in that
//! form.
//!
//! Neither machine imports the other: both import these.

pub mod lease;
pub mod map;
pub mod mark;
pub mod view;

pub use lease::{Lease, LeaseAsk, CLOCK_MARGIN_MS, LEASE_MS, LEASE_VERSION};
pub use map::{MapNotice, Redirect, MAP_VERSION};
pub use mark::{ForwardMark, ForwardResult, MARK_VERSION};
pub use view::{lists_key, DirectoryView, Health, NodeState, PerNode, VIEW_VERSION};
