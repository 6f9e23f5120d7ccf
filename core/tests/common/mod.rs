//! What the simulation (`tests/sim`) and the model check (`tests/model`)
//! share: the invariant checker, the signed inputs they feed the engine, and
//! the reads of the Dispatcher's tables the checker is given.
//!
//! Each target uses part of these helpers, so the module is declared with
//! `#[allow(dead_code)]` by both.

pub mod checker;
pub mod fixtures;
pub mod observe;
