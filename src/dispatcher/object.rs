//! The Durable Object type: construction (schema migrations, the engine),
//! the `fetch` that decodes a protocol message and answers it, and the
//! alarm that re-drives, re-evaluates, sweeps and prunes. A `testing` build
//! (the cargo feature) also keeps the per-operation profile, arms the store's
//! fault switch, serves the bench-only `writes_only` and lets the drills
//! restart one object (a request to `/restart`); the deployed one has none
//! of them.

use super::deliver;
use super::lessee::Lessee;
use super::ops::{self, Served};
#[cfg(feature = "testing")]
use super::profile::{OpProfile, Profile};
use super::role;
use super::store::DoStore;
use crate::clock::now_ms;
use crate::config::Config;
use crate::protocol;
use callfence_core::delivery::Delivery;
use callfence_core::engine::{Engine, EngineError};
use callfence_core::store::migrate;
#[cfg(feature = "testing")]
use std::cell::RefCell;
use std::cell::{Cell, OnceCell};
use worker::{durable_object, DurableObject, Env, Request, Response, Result, State};

/// The Dispatcher Durable Object (class `Dispatcher`, bound as `DISPATCHER`).
#[durable_object(alarm)]
pub struct Dispatcher {
    state: State,
    env: Env,
    /// The engine of the shard this object is (see [`role`]), built at its
    /// first request.
    engine: OnceCell<Engine<DoStore>>,
    /// When the alarm is known to be armed (None: unknown, ask storage).
    armed_at: Cell<Option<i64>>,
    /// A call shard's lease asks, one in flight at a time.
    lessee: Lessee,
    /// The outcome of applying the migrations at construction.
    migrated: std::result::Result<(), String>,
    /// Where the time went, per operation (for `make bench`).
    #[cfg(feature = "testing")]
    profile: RefCell<Profile>,
}

impl DurableObject for Dispatcher {
    fn new(state: State, env: Env) -> Self {
        let migrated = migrate(&DoStore::new(&state), now_ms())
            .map(|_| ())
            .map_err(|e| e.to_string());
        Self {
            state,
            env,
            engine: OnceCell::new(),
            armed_at: Cell::new(None),
            lessee: Lessee::default(),
            migrated,
            #[cfg(feature = "testing")]
            profile: RefCell::new(Profile::default()),
        }
    }

    async fn fetch(&self, mut req: Request) -> Result<Response> {
        if let Err(problem) = &self.migrated {
            // Thrown: the Worker answers dispatcher_unavailable.
            return Err(worker::Error::RustError(format!(
                "schema migration failed: {problem}"
            )));
        }
        let url = req.url()?;
        #[cfg(feature = "testing")]
        if url.path() == "/restart" {
            return self.restart();
        }
        let Some(shard) = url.host_str().and_then(protocol::shard_of) else {
            return answer(
                400,
                protocol::encode_rejected(protocol::MessageError::UnknownOp),
            );
        };
        #[cfg(feature = "testing")]
        if Config::get(&self.env).test.unreachable_shard == Some(shard) {
            // Thrown, as a runtime's failure: the Worker sees an
            // unreachable shard (tests/e2e/call-shards.test.mjs).
            return Err(worker::Error::RustError("unreachable (test switch)".into()));
        }
        let engine = self.engine(Some(shard))?;
        #[cfg(feature = "testing")]
        let (arrived, spent_before) = (now_ms(), engine.store().spent());
        let url_op = url.path().trim_start_matches('/');
        let body = req.bytes().await?;
        let mut message = match protocol::decode_request(url_op, &body) {
            Ok(message) => message,
            Err(error) => return answer(400, protocol::encode_rejected(error)),
        };
        message.taken_at_ms = Some(now_ms());
        if !role::serves(engine, &message.request) {
            return answer(
                400,
                protocol::encode_rejected(protocol::MessageError::UnknownOp),
            );
        }
        if !self
            .lessee
            .before(engine, &self.env, &message.request)
            .await
        {
            // Thrown: the Worker answers dispatcher_unavailable.
            return Err(worker::Error::RustError(
                "this call shard holds no lease from global".into(),
            ));
        }
        let decoded = now_ms();
        let config = Config::get(&self.env);
        #[cfg(feature = "testing")]
        if matches!(message.request, protocol::Request::WritesOnly { .. })
            && !config.test.writes_only
        {
            // A bench-only message: unknown unless the test switch is set.
            return answer(
                400,
                protocol::encode_rejected(protocol::MessageError::UnknownOp),
            );
        }
        let media = config.node_routes.as_ref().ok().map(|n| &n.media);
        let serve = |now: i64| {
            #[cfg(feature = "testing")]
            let served = ops::serve(engine, media, &self.profile.borrow(), &message, now);
            #[cfg(not(feature = "testing"))]
            let served = ops::serve(engine, media, &message, now);
            served.map_err(rust_error)
        };
        let mut served = serve(decoded)?;
        if matches!(served, Served::NeedRoom) {
            // A decision found a node full for want of room another shard
            // may hold: nothing was stored. The room is asked for, and the
            // request served again, its decision taken as it stands.
            self.lessee.make_room(engine, &self.env).await;
            served = engine.shard().as_is(|| serve(now_ms()))?;
        }
        let served = role::lease_with_room(engine, &self.env, &message.request, served)
            .await
            .map_err(rust_error)?;
        #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
        let (reply, origin_ms) = match served {
            Served::Reply(reply) => (reply, 0),
            Served::NeedRoom => {
                // Served as it stands, a request is never undone twice.
                return Err(worker::Error::RustError("a decision undone twice".into()));
            }
            Served::Deliver {
                forward,
                received_at_ms,
            } => {
                let ingress = config
                    .ingress
                    .as_ref()
                    .map_err(|_| worker::Error::RustError("ingress is misconfigured".into()))?;
                let delivered = deliver::deliver(
                    engine,
                    &ingress.edge,
                    i64::from(ingress.forward_timeout_ms),
                    *forward,
                    received_at_ms,
                )
                .await
                .map_err(rust_error)?;
                #[cfg(feature = "testing")]
                if let Some(ms) = config.test.slow_answer_ms {
                    worker::Delay::from(std::time::Duration::from_millis(ms as u64)).await;
                }
                delivered
            }
            #[cfg(feature = "testing")]
            Served::WritesOnlyDeliver { id } => {
                // Yield to the event loop, as a forward does, so the first
                // unit commits on its own before the second.
                worker::Delay::from(std::time::Duration::ZERO).await;
                engine
                    .writes_only_deliver(&id, now_ms())
                    .map_err(rust_error)?;
                (
                    protocol::encode_done(&serde_json::json!({"written": true})),
                    0,
                )
            }
        };
        role::send_marks(engine, &self.env).await;
        role::reclaim(engine, &self.env).await;
        role::push_map(engine, &self.env, &message.request).await;
        if message.request.acknowledges() {
            self.acknowledged(engine).await?;
        }
        #[cfg(feature = "testing")]
        let served = now_ms();
        #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
        let alarm_api_calls = if message.request.changes_state() {
            self.arm(engine).await?
        } else {
            0
        };
        #[cfg(feature = "testing")]
        self.record(
            engine,
            message.request.op(),
            Marks {
                arrived,
                decoded,
                served,
                origin_ms,
                spent_before,
                alarm_api_calls,
            },
        );
        answer(200, reply)
    }

    async fn alarm(&self) -> Result<Response> {
        let engine = self.engine(None)?;
        #[cfg(feature = "testing")]
        let (arrived, spent_before) = (now_ms(), engine.store().spent());
        self.armed_at.set(None);
        self.lessee.renew(engine, &self.env).await;
        let work = engine
            .poll_alarm(now_ms())
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        let config = Config::get(&self.env);
        let mut origin_ms = 0;
        if let Ok(ingress) = &config.ingress {
            let budget = i64::from(ingress.forward_timeout_ms);
            for f in work.forwards {
                let mut redrive = Delivery::redrive(f, budget);
                origin_ms += deliver::drive(engine, &ingress.edge, &mut redrive)
                    .await
                    .map_err(rust_error)?;
            }
        }
        #[cfg(not(feature = "testing"))]
        let _ = origin_ms;
        role::send_marks(engine, &self.env).await;
        role::reclaim(engine, &self.env).await;
        #[cfg(feature = "testing")]
        let armed = now_ms();
        #[cfg_attr(not(feature = "testing"), allow(unused_variables))]
        let alarm_api_calls = self.arm(engine).await?;
        #[cfg(feature = "testing")]
        self.record(
            engine,
            "alarm",
            Marks {
                arrived,
                decoded: arrived,
                served: armed,
                origin_ms,
                spent_before,
                alarm_api_calls,
            },
        );
        Response::ok("")
    }
}

/// When one request's parts ended, for its profile.
#[cfg(feature = "testing")]
struct Marks {
    arrived: i64,
    decoded: i64,
    served: i64,
    origin_ms: i64,
    spent_before: (u64, i64),
    alarm_api_calls: u64,
}

#[cfg(feature = "testing")]
impl Dispatcher {
    /// The drills' restart of this one object (tests/drills/stack.mjs):
    /// the runtime's `abort` resets it, its in-memory state (engine, lease,
    /// alarm knowledge) gone and its storage kept, and the next request
    /// constructs it anew. The reset runs from a timer, outside this wasm
    /// call: the instance's memory is shared by every object of the
    /// isolate, and must not be left in the middle of a call. Answers
    /// `{"restarting":true}`; the reset follows at once.
    fn restart(&self) -> Result<Response> {
        use worker::js_sys::{global, Array, Function, Reflect};
        use worker::wasm_bindgen::{JsCast, JsValue};
        let method = |target: &JsValue, name: &str| {
            Reflect::get(target, &JsValue::from_str(name))
                .ok()
                .and_then(|f| f.dyn_into::<Function>().ok())
        };
        let raw: &JsValue = self.state.as_raw().as_ref();
        let (Some(abort), Some(set_timeout)) =
            (method(raw, "abort"), method(&global(), "setTimeout"))
        else {
            return Err(worker::Error::RustError(
                "this runtime cannot reset an object".into(),
            ));
        };
        let reset = abort.bind1(raw, &JsValue::from_str("restarted by a drill"));
        set_timeout.apply(&JsValue::UNDEFINED, &Array::of2(&reset, &JsValue::from(0)))?;
        answer(
            200,
            protocol::encode_done(&serde_json::json!({"restarting": true})),
        )
    }

    /// Adds one request of `op` to the profile; it ends now.
    fn record(&self, engine: &Engine<DoStore>, op: &'static str, m: Marks) {
        let (statements, sql_ms) = engine.store().spent();
        let done = now_ms();
        self.profile.borrow_mut().record(
            op,
            &OpProfile {
                count: 1,
                total_ms: done - m.arrived,
                decode_ms: m.decoded - m.arrived,
                serve_ms: m.served - m.decoded - m.origin_ms,
                origin_ms: m.origin_ms,
                sql_ms: sql_ms - m.spent_before.1,
                statements: statements - m.spent_before.0,
                arm_ms: done - m.served,
                alarm_api_calls: m.alarm_api_calls,
            },
        );
    }
}

impl Dispatcher {
    /// The engine of the shard this object is: `shard` as the request's URL
    /// names it, kept in storage at the first request so that the alarm
    /// (`None`) knows it too.
    fn engine(&self, shard: Option<u32>) -> Result<&Engine<DoStore>> {
        if let Some(engine) = self.engine.get() {
            return Ok(engine);
        }
        let store = DoStore::new(&self.state);
        let shard = role::settle_shard(&store, shard).map_err(rust_error)?;
        let config = Config::get(&self.env);
        #[cfg(feature = "testing")]
        store.arm_fault_switch(config.test.fail_unit_after_writes);
        let engine = match shard {
            0 => Engine::new(store, config.engine()),
            k => Engine::call_shard(store, config.engine(), k),
        };
        Ok(self.engine.get_or_init(|| engine))
    }

    /// Waits until a change of the directory this request made (or one
    /// still pending) is in force in every call shard: every lease granted
    /// before it has been given up ([`role::revoke`]) or has lapsed (SPEC
    /// §16, `Engine::acknowledge_at`). At once when no other shard holds a
    /// lease.
    async fn acknowledged(&self, engine: &Engine<DoStore>) -> Result<()> {
        let now = now_ms();
        let mut at = engine.acknowledge_at(now).map_err(rust_error)?;
        if at > now {
            role::revoke(engine, &self.env).await;
            at = engine.acknowledge_at(now_ms()).map_err(rust_error)?;
        }
        let now = now_ms();
        if at > now {
            let wait = std::time::Duration::from_millis((at - now) as u64);
            worker::Delay::from(wait).await;
        }
        Ok(())
    }

    /// Arms the alarm for the earliest pending work, unless it is already
    /// armed for earlier (known from memory, else asked of storage once).
    /// Returns how many calls it made to the runtime's alarm API.
    async fn arm(&self, engine: &Engine<DoStore>) -> Result<u64> {
        let now = now_ms();
        let next = engine
            .next_alarm_at(now)
            .map_err(|e| worker::Error::RustError(e.to_string()))?;
        let Some(at) = next else {
            return Ok(0);
        };
        if self.armed_at.get().is_some_and(|armed| armed <= at) {
            return Ok(0);
        }
        let storage = self.state.storage();
        match storage.get_alarm().await? {
            Some(armed) if armed <= at => {
                self.armed_at.set(Some(armed));
                Ok(1)
            }
            _ => {
                storage.set_alarm((at - now).max(0)).await?;
                self.armed_at.set(Some(at));
                Ok(2)
            }
        }
    }
}

/// An engine failure, thrown: the Worker answers `dispatcher_unavailable`.
fn rust_error(e: EngineError) -> worker::Error {
    worker::Error::RustError(e.to_string())
}

/// A protocol answer with its HTTP status.
fn answer(status: u16, body: String) -> Result<Response> {
    Ok(Response::ok(body)?.with_status(status))
}
