//! The Durable Object type: construction (schema migrations, the engine),
//! the `fetch` that decodes a protocol message and answers it, and the
//! alarm that re-drives, re-evaluates, sweeps and prunes.

use super::ops;
use super::store::DoStore;
use crate::clock::now_ms;
use crate::config::Config;
use crate::forward;
use crate::protocol;
use callfence_core::engine::{Engine, EngineConfig, Report, Timing};
use callfence_core::store::migrate;
use std::cell::Cell;
use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

/// The Dispatcher Durable Object (class `Dispatcher`, bound as `DISPATCHER`).
#[durable_object(alarm)]
pub struct Dispatcher {
    state: State,
    env: Env,
    engine: Engine<DoStore>,
    /// When the alarm is known to be armed (None: unknown, ask storage).
    armed_at: Cell<Option<i64>>,
    /// The outcome of applying the migrations at construction.
    migrated: std::result::Result<(), String>,
}

/// A variable as text, if set.
fn var(env: &Env, name: &str) -> Option<String> {
    env.var(name)
        .ok()
        .map(|v| v.to_string())
        .filter(|v| !v.is_empty())
}

fn var_ms(env: &Env, name: &str) -> Option<i64> {
    var(env, name)
        .and_then(|v| v.parse().ok())
        .filter(|v: &i64| *v > 0)
}

/// The engine's configuration from the environment. The `CALLFENCE_TEST_*`
/// variables shorten the background timing for tests only (README).
fn engine_config(env: &Env) -> EngineConfig {
    let defaults = Timing::default();
    EngineConfig {
        forward_timeout_ms: var_ms(env, "FORWARD_TIMEOUT_MS").unwrap_or(1_500),
        connection_ids: var(env, "TELNYX_CONNECTION_IDS").map(|ids| {
            ids.split(',')
                .map(|id| id.trim().to_owned())
                .filter(|id| !id.is_empty())
                .collect()
        }),
        allow_plaintext: var(env, "ORIGIN_ALLOW_PLAINTEXT").as_deref() == Some("true"),
        timing: Timing {
            node_lost_after_ms: var_ms(env, "CALLFENCE_TEST_NODE_LOST_MS")
                .unwrap_or(defaults.node_lost_after_ms),
            max_duration_ms: var_ms(env, "CALLFENCE_TEST_MAX_DURATION_MS")
                .unwrap_or(defaults.max_duration_ms),
            sweep_interval_ms: var_ms(env, "CALLFENCE_TEST_SWEEP_MS")
                .unwrap_or(defaults.sweep_interval_ms),
            ..defaults
        },
    }
}

impl DurableObject for Dispatcher {
    fn new(state: State, env: Env) -> Self {
        let store = DoStore::new(state.storage().sql());
        let migrated = migrate(&store, now_ms())
            .map(|_| ())
            .map_err(|e| e.to_string());
        let engine = Engine::new(store, engine_config(&env));
        Self {
            state,
            env,
            engine,
            armed_at: Cell::new(None),
            migrated,
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        if let Err(problem) = &self.migrated {
            // Thrown: the Worker answers dispatcher_unavailable.
            return Err(worker::Error::RustError(format!(
                "schema migration failed: {problem}"
            )));
        }
        let path = req.path();
        let url_op = path.trim_start_matches('/');
        let body = req.bytes().await?;
        match protocol::decode_request(url_op, &body) {
            Ok((op, args)) => {
                let config = Config::get(&self.env);
                let media = config.node_routes.as_ref().ok().map(|n| &n.media);
                let reply = ops::serve(&self.engine, media, op, args, now_ms())
                    .map_err(|e| worker::Error::RustError(e.to_string()))?;
                // Sans-IO: after every op the engine says when the alarm is
                // due (free when the op changed nothing).
                self.arm().await?;
                answer(200, reply)
            }
            Err(error) => answer(400, protocol::encode_rejected(error)),
        }
    }

    async fn alarm(&self) -> Result<Response> {
        self.armed_at.set(None);
        let work = self
            .engine
            .poll_alarm(now_ms())
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        let config = Config::get(&self.env);
        if let Ok(ingress) = &config.ingress {
            for f in work.forwards {
                let answer = forward::send(
                    &f,
                    &ingress.edge,
                    i64::from(ingress.forward_timeout_ms),
                    now_ms(),
                )
                .await;
                let report = Report {
                    event_id: f.event_id,
                    epoch: f.epoch,
                    attempt: f.attempt,
                    answer,
                    budget_left_ms: 0,
                    hop: 1,
                };
                self.engine
                    .handle_report(&report, now_ms())
                    .map_err(|e| worker::Error::RustError(e.to_string()))?;
            }
        }
        self.arm().await?;
        Response::ok("")
    }
}

impl Dispatcher {
    /// Arms the alarm for the earliest pending work, unless it is already
    /// armed for earlier (known from memory, else asked of storage once).
    async fn arm(&self) -> Result<()> {
        let now = now_ms();
        let next = self
            .engine
            .next_alarm_at(now)
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        let Some(at) = next else {
            return Ok(());
        };
        if self.armed_at.get().is_some_and(|armed| armed <= at) {
            return Ok(());
        }
        let storage = self.state.storage();
        match storage.get_alarm().await? {
            Some(armed) if armed <= at => self.armed_at.set(Some(armed)),
            _ => {
                storage.set_alarm((at - now).max(0)).await?;
                self.armed_at.set(Some(at));
            }
        }
        Ok(())
    }
}

/// A protocol answer with its HTTP status.
fn answer(status: u16, body: String) -> Result<Response> {
    Ok(Response::ok(body)?.with_status(status))
}
