//! Attacks on the agent's trust boundaries (SPEC §11, issue 18), each
//! reproduced as it was observed, against the real `callfence-agent`
//! process. One module per boundary.

#[path = "../common/mod.rs"]
mod common;

mod local_api;
mod options;
mod slow_clients;
