//! The Dispatcher Durable Object: the single authority over documents,
//! heartbeats, call ownership and the event ledger (one instance per
//! deployment, named [`INSTANCE`](crate::protocol::INSTANCE)).
//!
//! It applies the schema migrations when constructed, then serves the
//! [`protocol`](crate::protocol) messages the Worker sends. Every operation
//! runs its reads and writes synchronously ([`store`]), so nothing is
//! awaited between a check and the write it guards.

// The #[durable_object] macro adds undocumented wasm-bindgen glue methods to
// the type; everything in `object` written by hand is documented.
pub mod counting;
mod deliver;
mod lessee;
#[allow(missing_docs)]
mod object;
mod ops;
#[cfg(feature = "testing")]
pub mod profile;
mod role;
pub mod store;

pub use object::Dispatcher;
