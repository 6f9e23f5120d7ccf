//! Attacks on the node agent, each reproduced as it was observed against
//! the real `callfence-agent` binary (issue 18).
//!
//! - [`deploy`]: a pull request's commit deployed by SHA, and builds that
//!   run as an account able to read the node's keys (SPEC §14).
//! - [`git`]: a checkout's own git configuration run as the agent on every
//!   beat (SPEC §11).

#[path = "../common/mod.rs"]
mod common;
mod deploy;
mod git;
