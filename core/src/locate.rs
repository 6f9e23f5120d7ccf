//! The Worker's side of the holder handshake (SPEC §16, `shard::holder`):
//! one webhook's way to the shard that holds its session, or may create
//! it, whatever map the Worker had cached.
//!
//! [`Locate`] is a sans-IO driver, polled like [`crate::delivery`]: the
//! shell asks [`Locate::poll_transmit`] what to send to which shard, sends
//! it, and hands the answer back. A webhook goes to its session's home
//! under the newest map the Worker knows; an `Elsewhere` answer is
//! followed with the answer's map; a `Lookup` is answered by asking each
//! named shard whether it holds the session, then going to the holder or
//! back with the shards that answered absent, under that map's revision.
//! After [`MAX_REQUESTS`] requests the driver gives up: the carrier gets
//! 503 and retries, and nothing was stored by the requests made.
//!
//! The simulation's holder world and the model check drive this same type,
//! with the maps changing and the shards restarting between any two
//! requests.

use crate::messages::{MapNotice, Redirect};
use crate::shard::{Arrival, Holds};

/// Requests one webhook may take to reach its holder before the Worker
/// answers 503 (SPEC §16).
pub const MAX_REQUESTS: u32 = 16;

/// What to send next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Transmit {
    /// The webhook, with what the Worker knows of the map.
    Webhook {
        /// The shard to send it to.
        shard: u32,
        /// The map and the proof of absence it carries.
        arrival: Arrival,
    },
    /// Whether `shard` holds the session, asked under `map`.
    Holds {
        /// The shard asked.
        shard: u32,
        /// The asking shard's map.
        map: MapNotice,
    },
}

/// The question being asked around, for the shard `back` that sent it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Asking {
    /// Shards still to ask, the first one next.
    ask: Vec<u32>,
    /// The map the questions carry.
    map: MapNotice,
    /// Shards that answered absent so far.
    absent: Vec<u32>,
    /// The shard to go back to when every one answered absent.
    back: u32,
}

/// One webhook being placed: see the module documentation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Locate {
    session: String,
    map: MapNotice,
    arrival: Arrival,
    /// The shard the webhook goes to next, when not asking around.
    to: u32,
    asking: Option<Asking>,
    requests: u32,
}

impl Locate {
    /// The placement of a webhook of session `session`, starting from the
    /// Worker's newest map.
    pub fn new(session: &str, map: MapNotice) -> Self {
        Self {
            session: session.to_owned(),
            to: map.home(session),
            map,
            arrival: Arrival {
                map: Some(map),
                ..Arrival::default()
            },
            asking: None,
            requests: 0,
        }
    }

    /// The session placed.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The newest map this placement has seen (for the Worker's cache).
    pub fn map(&self) -> MapNotice {
        self.map
    }

    /// How many requests it has made.
    pub fn requests(&self) -> u32 {
        self.requests
    }

    /// The next request to send, or `None` once [`MAX_REQUESTS`] were made
    /// (the Worker answers 503).
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        if self.requests >= MAX_REQUESTS {
            return None;
        }
        self.requests += 1;
        Some(match &self.asking {
            Some(asking) => Transmit::Holds {
                shard: asking.ask[0],
                map: asking.map,
            },
            None => Transmit::Webhook {
                shard: self.to,
                arrival: self.arrival.clone(),
            },
        })
    }

    /// A newer map learnt elsewhere (the Worker's cache): carried from the
    /// next webhook sent.
    pub fn learn(&mut self, map: MapNotice) {
        if map.supersedes(&self.map) {
            self.map = map;
        }
        self.arrival.map = Some(self.map);
    }

    /// The webhook's shard answered with a redirect.
    pub fn handle_redirect(&mut self, redirect: Redirect) {
        match redirect {
            Redirect::Elsewhere { shard, map } => {
                self.learn(map);
                self.arrival.absent = None;
                self.to = shard;
            }
            Redirect::Lookup { shards, map } => {
                self.learn(map);
                if shards.is_empty() {
                    return;
                }
                self.asking = Some(Asking {
                    ask: shards,
                    map,
                    absent: Vec::new(),
                    back: self.to,
                });
            }
            // Only for an event that names no session, which the Worker
            // does not place with this driver.
            Redirect::Leg { map, .. } => self.learn(map),
        }
    }

    /// The asked shard's answer.
    pub fn handle_holds(&mut self, holds: Holds) {
        let Some(mut asking) = self.asking.take() else {
            return;
        };
        let shard = asking.ask.remove(0);
        match holds {
            Holds::Held => {
                self.arrival.absent = None;
                self.to = shard;
            }
            Holds::Absent => {
                asking.absent.push(shard);
                if asking.ask.is_empty() {
                    self.arrival.absent = Some((asking.map.revision, asking.absent));
                    self.to = asking.back;
                } else {
                    self.asking = Some(asking);
                }
            }
        }
    }

    /// Sends the webhook back to the shard that last answered, claiming
    /// `shards` absent under `revision` without asking them. Only the
    /// simulation's planted bugs use it, to show that the checks catch a
    /// Worker that forges a proof.
    #[cfg(feature = "testing")]
    #[doc(hidden)]
    pub fn forge_absent(&mut self, revision: u64, shards: Vec<u32>) {
        self.asking = None;
        self.arrival.absent = Some((revision, shards));
    }

    /// The proof of absence the next webhook carries.
    pub fn absent(&self) -> Option<&(u64, Vec<u32>)> {
        self.arrival.absent.as_ref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn webhook_to(t: Option<Transmit>) -> (u32, Arrival) {
        match t {
            Some(Transmit::Webhook { shard, arrival }) => (shard, arrival),
            other => panic!("not a webhook: {other:?}"),
        }
    }

    #[test]
    fn a_one_shard_map_sends_the_webhook_to_global_once() {
        let mut l = Locate::new("s1", MapNotice::default());
        let (shard, arrival) = webhook_to(l.poll_transmit());
        assert_eq!(shard, 0);
        assert_eq!(arrival.map, Some(MapNotice::default()));
        assert_eq!(arrival.absent, None);
        assert_eq!(l.requests(), 1);
    }

    #[test]
    fn elsewhere_is_followed_with_the_newer_map() {
        let mut l = Locate::new("s1", MapNotice::default());
        l.poll_transmit();
        let map = MapNotice::new(2, 4, 0);
        l.handle_redirect(Redirect::Elsewhere { shard: 3, map });
        let (shard, arrival) = webhook_to(l.poll_transmit());
        assert_eq!((shard, arrival.map), (3, Some(map)));
        assert_eq!(l.map(), map);
        // An older map learnt later changes nothing.
        l.learn(MapNotice::default());
        assert_eq!(l.map(), map);
    }

    /// A placement at its first shard, told to ask shards 1 and 2.
    fn looked_up() -> (Locate, MapNotice) {
        let mut l = Locate::new("s1", MapNotice::default());
        l.poll_transmit();
        let map = MapNotice::new(5, 4, 0b1011);
        l.handle_redirect(Redirect::Lookup {
            shards: vec![1, 2],
            map,
        });
        (l, map)
    }

    #[test]
    fn a_lookup_asks_each_shard_then_goes_back_with_the_proof() {
        let (mut l, map) = looked_up();
        for asked in [1, 2] {
            assert_eq!(
                l.poll_transmit(),
                Some(Transmit::Holds { shard: asked, map })
            );
            l.handle_holds(Holds::Absent);
        }
        let (shard, arrival) = webhook_to(l.poll_transmit());
        assert_eq!(shard, 0);
        assert_eq!(arrival.absent, Some((5, vec![1, 2])));
    }

    #[test]
    fn a_holder_found_takes_the_webhook_without_a_proof() {
        let (mut l, _) = looked_up();
        l.poll_transmit();
        l.handle_holds(Holds::Held);
        let (shard, arrival) = webhook_to(l.poll_transmit());
        assert_eq!((shard, arrival.absent), (1, None));
    }

    #[test]
    fn it_gives_up_after_the_request_limit() {
        let mut l = Locate::new("s1", MapNotice::default());
        let map = MapNotice::new(1, 2, 0);
        for _ in 0..MAX_REQUESTS {
            assert!(l.poll_transmit().is_some());
            l.handle_redirect(Redirect::Elsewhere { shard: 1, map });
        }
        assert_eq!(l.poll_transmit(), None);
        assert_eq!(l.requests(), MAX_REQUESTS);
    }
}
