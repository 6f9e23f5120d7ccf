//! Sending a request about one session (a webhook, a fence, a claim, a
//! media check) to the call shard that holds it, or may create it (SPEC
//! §16): core's [`Locate`] says where, this module sends.
//!
//! The request goes to the session's home under the newest map this
//! isolate has seen, carrying that map. A shard that may not serve it
//! answers a [`Redirect`]: the isolate keeps the redirect's map if newer,
//! and `Locate` follows it or asks the named shards [`Request::Holds`]
//! first. After [`MAX_REQUESTS`] requests, or at the deadline, the answer
//! is [`Unavailable`] (503). Under a one-shard map the first request is the
//! only one.

use crate::clock::now_ms;
use crate::protocol::{self, Held, Next, Reply, Request, Unavailable, View};
use callfence_core::engine::{Arrival, Holds, MapNotice, Redirect};
use callfence_core::locate::{Locate, Transmit, MAX_REQUESTS};
use serde::de::DeserializeOwned;
use std::cell::Cell;
use worker::Env;

/// Sends `request` about `session`, with `payload`, to the session's
/// holder by `answer_by` (Unix ms); `redirect_of` reads a redirect out of
/// an answer (`None`: the answer is the holder's).
pub async fn to_holder<T: DeserializeOwned>(
    env: &Env,
    session: &str,
    mut request: Request,
    payload: &[u8],
    answer_by: i64,
    redirect_of: impl Fn(&T) -> Option<Redirect>,
) -> Result<Reply<T>, Unavailable> {
    let mut locate = Locate::new(session, known_map());
    loop {
        let left = answer_by - now_ms();
        match locate.poll_transmit() {
            None => {
                return Err(Unavailable(format!(
                    "no holder found within {MAX_REQUESTS} requests"
                )))
            }
            Some(Transmit::Webhook { shard, arrival }) => {
                request.set_arrival(arrival);
                request.set_sent_at(now_ms());
                let reply =
                    protocol::call_shard_within(env, shard, &request, payload, left).await?;
                let redirect = match &reply {
                    Reply::Done(answer) => redirect_of(answer),
                    Reply::Refused(_) => None,
                };
                let Some(redirect) = redirect else {
                    return Ok(reply);
                };
                locate.handle_redirect(redirect);
                remember_map(locate.map());
            }
            Some(Transmit::Holds { shard, map }) => {
                let call_session_id = locate.session().to_owned();
                let holds = Request::Holds {
                    call_session_id,
                    map,
                };
                match protocol::call_shard_within::<Held>(env, shard, &holds, b"", left).await? {
                    Reply::Done(Held { held: true }) => locate.handle_holds(Holds::Held),
                    Reply::Done(Held { held: false }) => locate.handle_holds(Holds::Absent),
                    Reply::Refused(refused) => return Ok(Reply::Refused(refused)),
                }
            }
        }
    }
}

/// Sends a webhook that names no session to the holder of its leg `leg`
/// (SPEC §16): to `global` first, carrying this isolate's map; when
/// `global` does not know the leg and other shards may ([`Redirect::Leg`]),
/// each of them is asked [`Request::Leg`] at once, and the webhook goes to
/// the one that knows it, or back to `global` to be recorded as unroutable
/// when none does. A shard that cannot be asked may know it: 503, and the
/// carrier retries.
pub async fn to_leg_holder(
    env: &Env,
    leg: Option<String>,
    mut request: Request,
    payload: &[u8],
    answer_by: i64,
) -> Result<Reply<Next>, Unavailable> {
    let mut arrival = Arrival {
        map: Some(known_map()),
        ..Arrival::default()
    };
    request.set_arrival(arrival.clone());
    request.set_sent_at(now_ms());
    let left = answer_by - now_ms();
    let reply = protocol::call_within::<Next>(env, &request, payload, left).await?;
    let (Reply::Done(Next::Redirect(Redirect::Leg { shards, map })), Some(leg)) = (&reply, leg)
    else {
        return Ok(reply);
    };
    remember_map(*map);
    let question = Request::Leg {
        call_control_id: leg,
    };
    let left = answer_by - now_ms();
    let asked = shards
        .iter()
        .map(|&k| protocol::call_shard_within::<Held>(env, k, &question, b"", left));
    let answers = futures_util::future::join_all(asked).await;
    let mut holder = 0;
    for (&k, answer) in shards.iter().zip(answers) {
        if let Reply::Done(Held { held: true }) = answer? {
            holder = k;
        }
    }
    arrival.map = Some(*map);
    arrival.legs_asked = true;
    request.set_arrival(arrival);
    request.set_sent_at(now_ms());
    let left = answer_by - now_ms();
    protocol::call_shard_within(env, holder, &request, payload, left).await
}

/// The redirect in a relayed answer (a node's request, a call's record).
pub fn redirect_in(view: &View) -> Option<Redirect> {
    serde_json::from_value(view.get("redirect")?.clone()).ok()
}

thread_local! {
    /// The newest shard map this isolate has seen in a redirect.
    static KNOWN_MAP: Cell<MapNotice> = Cell::new(MapNotice::default());
}

/// The newest shard map this isolate knows (the map before any `PUT` until
/// a shard answers with a newer one).
fn known_map() -> MapNotice {
    KNOWN_MAP.with(Cell::get)
}

/// Keeps `map` when it is newer than the one known.
fn remember_map(map: MapNotice) {
    KNOWN_MAP.with(|known| {
        if map.supersedes(&known.get()) {
            known.set(map);
        }
    });
}
