//! Serving the running agent's metrics ([`crate::metrics`]): what a scrape
//! reads at that moment (the mode, the ledger's depth, the time), `GET
//! /metrics` on the local API, and the metrics listener's router where
//! `/metrics` is the only route. Kept apart from the counting so that the
//! tasks that count (the deploy job among them) never reach back into the
//! agent's context through it.

use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

use crate::context::Agent;
use crate::metrics::{self, Reading, CONTENT_TYPE};

/// What a scrape of the running agent reads now.
pub async fn read(agent: &Agent) -> Reading {
    let ledger = agent.ledger.clone();
    let depth = tokio::task::spawn_blocking(move || ledger.depth()).await;
    Reading {
        mode: crate::mode::read(&agent.config.state_dir).mode,
        ledger: depth.ok().and_then(Result::ok),
        now_ms: crate::clock::now_ms(),
    }
}

/// `GET /metrics`: the exposition of the running agent.
pub async fn exposition(agent: Arc<Agent>) -> Response {
    let text = metrics::global().render(&read(&agent).await);
    (StatusCode::OK, [(header::CONTENT_TYPE, CONTENT_TYPE)], text).into_response()
}

/// The metrics listener's routes: `GET /metrics` and nothing else (404),
/// with no token, as node exporters serve theirs.
pub fn router(agent: Arc<Agent>) -> Router {
    Router::new().route("/metrics", get(move || exposition(agent.clone())))
}
