//! Attacks on the node agent's trust boundaries (SPEC §11, §14, issue 18),
//! each reproduced as it was observed, against the real `callfence-agent`
//! process. One module per boundary:
//!
//! - [`local_api`]: a web page's simple POST, requests without the token, a
//!   DNS-rebinding read, deploy and rollback over HTTP, the control socket.
//! - [`options`]: answer and dial options that would route a call's
//!   webhooks around the edge.
//! - [`slow_clients`]: slow origin requests that would starve the local API.
//! - [`deploy`]: a pull request's commit deployed by SHA, and builds that
//!   run as an account able to read the node's keys (SPEC §14).
//! - [`git`]: a checkout's own git configuration run as the agent on every
//!   beat (SPEC §11).

#[path = "../common/mod.rs"]
mod common;

mod deploy;
mod git;
mod local_api;
mod options;
mod slow_clients;
