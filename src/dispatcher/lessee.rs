//! A call shard's lease from `global` (SPEC §16, `core::shard::lease`), as
//! its object (`calls-k`, k ≥ 1) keeps it: renewed before a request that
//! decides or checks a node's key, asked for at once when a decision found
//! a node full for want of room held elsewhere, and given up when `global`
//! asks for a report. One ask is in flight at a time: a request that needs
//! a lease while one is asked for waits for that answer, since a second
//! ask would make the shard refuse the first one's answer (it takes only
//! the answer to its newest ask). `global` holds no lease: every call here
//! returns at once there.

use super::role;
use super::store::DoStore;
use crate::clock::now_ms;
use crate::protocol::{self, Leased, Reply, Request};
use callfence_core::engine::Engine;
use futures_channel::oneshot;
use std::cell::RefCell;

/// How many asks a request makes before it goes on with what it has.
const ASKS: u32 = 3;

/// How many times a request looks at the lease (after each ask it made or
/// waited for) before it goes on with what it has.
const LOOKS: u32 = 12;

/// One object's lease asks: see the module documentation.
#[derive(Default)]
pub struct Lessee {
    /// While an ask is in flight: the requests waiting for its answer.
    waiting: RefCell<Option<Vec<oneshot::Sender<()>>>>,
}

/// What a request needs of the lease before it goes on.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Need {
    /// A lease not yet due for renewal.
    Fresh,
    /// An ask made since a decision found a node's cap reached, naming it.
    Room,
    /// An ask of its own wanting no spare room (`global` asked for a report).
    Report,
}

impl Lessee {
    /// Before `request`: renews the lease when due (asked to report,
    /// [`Request::Reclaim`], asks for one wanting no spare room). Returns
    /// false when the request is on the call path (a webhook, a fence, a
    /// claim, a media check) and the shard still holds no usable lease: it
    /// may not serve it (the Worker answers 503), since the lease is what
    /// keeps its map, its view and its caps in force. `global` always may.
    pub async fn before(
        &self,
        engine: &Engine<DoStore>,
        env: &worker::Env,
        request: &Request,
    ) -> bool {
        let call_path = matches!(
            request,
            Request::Webhook { .. }
                | Request::Fence { .. }
                | Request::Claim { .. }
                | Request::MediaVerify { .. }
        );
        if matches!(request, Request::Reclaim) {
            self.ask(engine, env, Need::Report).await;
        } else if call_path || matches!(request, Request::Status) {
            self.ask(engine, env, Need::Fresh).await;
        }
        !call_path || engine.shard().lease_usable(now_ms())
    }

    /// Asks for the room a decision found lacking: a call shard asks for a
    /// new lease naming the nodes it wants room on (its caps reached), and
    /// `global` asks the shards holding room there to report
    /// ([`role::reclaim`]), so the decision served again counts every
    /// shard's calls as the directory knows them now.
    pub async fn make_room(&self, engine: &Engine<DoStore>, env: &worker::Env) {
        if engine.shard().index() == 0 {
            role::reclaim(engine, env).await;
        } else {
            self.ask(engine, env, Need::Room).await;
        }
    }

    /// Asks for a new lease when the one held is due (the alarm's). An ask
    /// that fails leaves the shard with none: its call path answers 503
    /// until a later ask succeeds. Nothing is decided on a view it does not
    /// hold.
    pub async fn renew(&self, engine: &Engine<DoStore>, env: &worker::Env) {
        self.ask(engine, env, Need::Fresh).await;
    }

    /// Asks `global` until `need` is met, one ask in flight at a time: with
    /// one in flight, waits for its answer and looks again.
    async fn ask(&self, engine: &Engine<DoStore>, env: &worker::Env, need: Need) {
        let shard = engine.shard();
        if shard.index() == 0 {
            return;
        }
        let mut asked = 0;
        for _ in 0..LOOKS {
            let met = match need {
                Need::Fresh => !shard.lease_due(now_ms()),
                Need::Room => !shard.wants_room(),
                Need::Report => false,
            };
            if met {
                return;
            }
            if self.wait().await {
                continue;
            }
            if asked == ASKS {
                return;
            }
            asked += 1;
            self.ask_once(engine, env, need == Need::Report).await;
            if need == Need::Report {
                return;
            }
        }
    }

    /// One lease ask to `global` (`reclaimed`: wanting no spare room), its
    /// answer taken; the requests that wait meanwhile are woken after.
    async fn ask_once(&self, engine: &Engine<DoStore>, env: &worker::Env, reclaimed: bool) {
        let shard = engine.shard();
        *self.waiting.borrow_mut() = Some(Vec::new());
        // `global` answers no lease to an ask it already answered a newer
        // one of: asked again.
        for _ in 0..ASKS {
            let Ok(ask) = shard.lease_ask(reclaimed) else {
                break;
            };
            let request = Request::LeaseAsk { ask };
            match protocol::call::<Leased>(env, &request, b"").await {
                Ok(Reply::Done(Leased { lease: Some(lease) })) => {
                    // A lease whose map could not be stored is not taken:
                    // the shard stays without one, as when the ask fails.
                    let _taken = shard.handle_lease(lease);
                    break;
                }
                Ok(Reply::Done(Leased { lease: None })) => continue,
                _ => break,
            }
        }
        for waiter in self.waiting.borrow_mut().take().unwrap_or_default() {
            let _ = waiter.send(());
        }
    }

    /// Waits for the ask in flight, if any; true when there was one.
    async fn wait(&self) -> bool {
        let answered = {
            let mut waiting = self.waiting.borrow_mut();
            let Some(waiters) = waiting.as_mut() else {
                return false;
            };
            let (tx, rx) = oneshot::channel();
            waiters.push(tx);
            rx
        };
        let _ = answered.await;
        true
    }
}
