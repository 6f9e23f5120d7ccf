//! callfence's edge: the Cloudflare Worker that verifies carrier webhooks and
//! node requests, asks the Dispatcher who owns each call, forwards, and
//! serves the API; and the Dispatcher Durable Object itself.
//!
//! Every decision is made by `callfence-core`; this crate translates HTTP
//! and the Durable Object's storage to and from it.
//!
//! # Layout
//!
//! Request path, in the order a request meets them:
//! - [`routes`]: the route table: methods, capability, guard, body limit.
//! - [`config`]: SPEC §2 variables, per capability, parsed once per isolate.
//! - [`auth`]: bearer tokens (admin and policy scopes).
//! - [`node_keys`]: the node-signature pre-check against a cached copy of
//!   the registry's keys.
//! - [`health`]: `/healthz`, `/v1/health`, `/v1/keys`.
//! - [`ingress`]: carrier webhooks: ask, forward, report, answer.
//! - [`forward`]: one forward to an origin, with the assertion.
//! - [`subrequest`]: the Worker's outgoing POSTs, on the runtime's `RequestInit`.
//! - [`node_routes`]: heartbeat, fence, claims, media checks.
//! - [`placing`]: a request about one session sent to the call shard that
//!   holds it (SPEC §16).
//! - [`probe`]: the L5 probe `POST /v1/nodes/probe` (SPEC §14).
//! - [`panel`]: documents, preview, status, decisions, calls.
//! - [`dashboard`]: the read-only page at `/`.
//! - [`metrics`]: `GET /v1/metrics`, and the webhooks this isolate refused.
//! - [`reply`]: JSON replies, error codes to HTTP, body size limits.
//! - [`log`]: one JSON line per request, secrets never included.
//! - [`request_url`]: the host and query parameters of a request's URL.
//! - [`clock`]: the edge's clock.
//!
//! Dispatcher:
//! - [`protocol`]: the typed, versioned Worker ↔ Dispatcher messages.
//! - [`span`]: the status and decision reads that span call shards.
//!   Every refusal is core's [`Refusal`]
//!   (code, status, fields), encoded on this wire or answered as HTTP by
//!   [`reply::Answer::refusal`].
//! - [`dispatcher`]: the Durable Object and its SQLite [`Store`](callfence_core::store::Store).
//!
//! # Request pipeline
//!
//! [`serve`] resolves the route (404, 405), refuses it with 503
//! `misconfigured` if its capability is not configured (before any other
//! check), then applies its guard (bearer token, node signature or Telnyx
//! signature, each reading the body within the route's limit first when it
//! needs it) and only then runs the handler.

#![warn(missing_docs)]

pub mod auth;
pub mod clock;
pub mod config;
pub mod dashboard;
pub mod dispatcher;
pub mod forward;
pub mod health;
pub mod ingress;
pub mod log;
pub mod metrics;
pub mod node_keys;
pub mod node_routes;
pub mod panel;
pub mod placing;
pub mod probe;
pub mod protocol;
pub mod reply;
pub mod request_url;
pub mod routes;
pub mod span;
pub mod subrequest;

use crate::config::{Capability, Config};
use crate::reply::{read_body, Answer, ApiError};
use crate::routes::{Guard, Route};
use callfence_core::refusal::Refusal;
use callfence_core::telnyx;
use worker::{event, Context, Env, Request, Response};

pub use dispatcher::Dispatcher;

/// The Worker's entry point: serves the request, logs one line, and never
/// lets an error escape as the runtime's plain 500.
#[event(fetch)]
async fn fetch(req: Request, env: Env, ctx: Context) -> worker::Result<Response> {
    let started = clock::now_ms();
    let mut log = log::RequestLog::new(&raw_method(&req), &req.path());
    let response = match serve(req, &env, &ctx, &mut log, started).await {
        Ok(response) => Ok(response),
        Err(error) => {
            log.error(error.code());
            error.into_response()
        }
    }
    .or_else(|_| Response::error("internal error", 500))?;
    log.emit(response.status_code(), clock::now_ms() - started);
    metrics::report_due(&env, &ctx, clock::now_ms());
    Ok(response)
}

/// Serves one request (see the crate's request pipeline) that arrived at
/// `received_at_ms`.
pub async fn serve(
    mut req: Request,
    env: &Env,
    ctx: &Context,
    log: &mut log::RequestLog,
    received_at_ms: i64,
) -> Result<Response, ApiError> {
    let method = raw_method(&req);
    let path = req.path();
    let route = Route::resolve(&method, &path)?;
    let config = Config::get(env);
    if let Some(capability) = route.capability() {
        if config.problem(capability).is_some() {
            return Err(ApiError::misconfigured(capability.as_str()));
        }
    }
    let answer = match route.guard() {
        Guard::Public => match route {
            Route::Dashboard => return dashboard::page().map_err(|_| ApiError(Refusal::Internal)),
            _ => {
                let (status, body) = public(&route, &config)?;
                Answer {
                    status,
                    body,
                    headers: Vec::new(),
                }
            }
        },
        Guard::Bearer(access) => {
            let admin = config
                .admin
                .as_ref()
                .map_err(|_| ApiError::misconfigured(Capability::Admin.as_str()))?;
            let authorization = req.headers().get("Authorization").ok().flatten();
            let caller = admin
                .tokens
                .authorize(authorization.as_deref(), access)
                .map_err(ApiError::auth)?;
            let body = if route.body_limit() > 0 {
                read_body(&mut req, route.body_limit()).await?
            } else {
                Vec::new()
            };
            match route {
                Route::Health => {
                    let documents = health::ping(env).await;
                    Answer::ok(health::health(&config, documents))
                }
                Route::Metrics => return metrics::scrape(env, clock::now_ms()).await,
                _ => panel::handle(env, &req, &route, &caller, body).await?,
            }
        }
        Guard::Node => {
            let body = read_body(&mut req, route.body_limit()).await?;
            let headers = node_keys::SignedHeaders::of(&req);
            let edge_hosts = config
                .node_routes
                .as_ref()
                .ok()
                .and_then(|n| n.edge_hosts.as_ref());
            let signed = headers.signed(&method, &path, &body);
            let node = node_keys::verify(env, &signed, edge_hosts).await?;
            log.node(&node);
            let header = |name: &str| req.headers().get(name).ok().flatten();
            let kid = header(callfence_core::node_auth::HEADER_KEY_ID).unwrap_or_default();
            let signed_at_s = header(callfence_core::node_auth::HEADER_TIMESTAMP)
                .and_then(|t| t.parse::<i64>().ok())
                .unwrap_or(0);
            node_routes::handle(env, &route, &node, &kid, signed_at_s, body).await?
        }
        Guard::Carrier => {
            let ingress = config
                .ingress
                .as_ref()
                .map_err(|_| ApiError::misconfigured(Capability::Ingress.as_str()))?;
            let webhook =
                match verified_webhook(&mut req, ingress, &route, log, received_at_ms).await {
                    Ok(webhook) => webhook,
                    Err(refused) => {
                        metrics::count_refused();
                        return Err(refused);
                    }
                };
            ingress::handle(env, ctx, ingress, webhook, log).await?
        }
    };
    if answer.status >= 400 {
        if let Some(code) = answer.body.get("error").and_then(|c| c.as_str()) {
            log.error(code);
        }
    }
    answer
        .into_response()
        .map_err(|_| ApiError(Refusal::Internal))
}

/// A carrier webhook read within its limit, verified and parsed (SPEC §7.1,
/// §7.2); the error is the refusal the Worker answers without the
/// Dispatcher.
async fn verified_webhook(
    req: &mut Request,
    ingress: &config::Ingress,
    route: &Route,
    log: &mut log::RequestLog,
    received_at_ms: i64,
) -> Result<ingress::Webhook, ApiError> {
    let body = read_body(req, route.body_limit()).await?;
    let header = |name: &str| req.headers().get(name).ok().flatten();
    telnyx::verify(
        &ingress.telnyx,
        header("telnyx-signature-ed25519").as_deref(),
        header("telnyx-timestamp").as_deref(),
        &body,
        clock::now_ms(),
    )
    .map_err(|e| ApiError(e.into()))?;
    let envelope = telnyx::parse_envelope(&body).map_err(|e| ApiError(e.into()))?;
    log.event_id(&envelope.event_id);
    if let Some(session) = envelope.session_hint() {
        log.call_session_id(session);
    }
    for (field, number) in [("from", &envelope.from), ("to", &envelope.to)] {
        if let Some(number) = number {
            log.number(field, number);
        }
    }
    let headers = ingress::carried_headers(req);
    Ok(ingress::Webhook {
        envelope,
        body,
        headers,
        received_at_ms,
    })
}

/// The public routes' answers.
fn public(route: &Route, config: &Config) -> Result<(u16, serde_json::Value), ApiError> {
    match route {
        Route::Healthz => Ok(health::healthz(config)),
        Route::Keys => {
            let published = config
                .published_keys
                .as_ref()
                .map_err(|_| ApiError::misconfigured(Capability::KeyPublication.as_str()))?;
            Ok((200, health::keys(published)))
        }
        _ => Err(ApiError::not_found()),
    }
}

/// The method exactly as sent. (`worker::Method` turns methods it does not
/// know into `GET`, which would let `FOO /v1/status` pass for a GET and sign
/// a different canonical string than the node did.)
fn raw_method(req: &Request) -> String {
    req.inner().method()
}
