//! Health and key publication: `GET /healthz` (public probe), `GET /v1/health`
//! (admin details, SPEC §13) and `GET /v1/keys` (the edge's public keys).

use crate::config::{Capability, Config, PublishedKey};
use crate::protocol::{self, Documents, Reply, Request};
use serde_json::{json, Value};
use worker::Env;

/// `GET /healthz`: 200 `{"status":"ok"}` or 503 `{"status":"degraded"}`
/// from the configuration alone. It names nothing and never calls the
/// Dispatcher.
pub fn healthz(config: &Config) -> (u16, Value) {
    let ok = config.all_ok();
    (if ok { 200 } else { 503 }, crate::reply::status_body(ok))
}

/// `GET /v1/keys`: the active key, then the keys published next.
pub fn keys(published: &[PublishedKey]) -> Value {
    let keys: Vec<Value> = published
        .iter()
        .map(|key| json!({"kid": key.kid, "public_key": key.public_key, "state": key.state.as_str()}))
        .collect();
    json!({ "keys": keys })
}

/// What the Dispatcher said to a `ping`, or `None` when it could not be
/// asked.
pub async fn ping(env: &Env) -> Option<Documents> {
    match protocol::call::<Documents>(env, &Request::Ping, b"").await {
        Ok(Reply::Done(reply)) => Some(reply),
        Ok(Reply::Refused(_)) | Err(_) => None,
    }
}

/// `GET /v1/health` (always 200 for an admin): capabilities, whether the
/// Dispatcher answers, which documents exist, the shard map and the
/// rollback floor (`null` where the Dispatcher could not say).
pub fn health(config: &Config, ping: Option<Documents>) -> Value {
    let capabilities: serde_json::Map<String, Value> = Capability::ALL
        .into_iter()
        .map(|c| {
            let state = if config.problem(c).is_some() {
                "misconfigured"
            } else {
                "ok"
            };
            (c.as_str().to_owned(), Value::from(state))
        })
        .collect();
    let reachable = ping.is_some();
    let map = ping.as_ref().and_then(|p| p.shards.as_ref());
    json!({
        "status": if config.all_ok() && reachable { "ok" } else { "degraded" },
        "capabilities": capabilities,
        "dispatcher": if reachable { "reachable" } else { "unreachable" },
        "documents": ping.as_ref().map(|p| json!(p.documents)),
        // Health asks `global` only (one request, SPEC §13's liveness
        // check): no other shard is asked, so none is named unreachable
        // here; `GET /v1/status` names the shards that do not answer.
        "shards": map.map(|m| json!({
            "call_shards": m.call_shards,
            "map_revision": m.map_revision,
            "unreachable": [],
        })),
        "rollback_floor": map.map(|m| m.rollback_floor.as_str()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::KeyState;
    use crate::protocol::{MapState, Present};

    fn config(vars: &[(&str, &str)]) -> Config {
        Config::parse(|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.to_string())
        })
    }

    #[test]
    fn an_unconfigured_worker_is_degraded_and_names_nothing_publicly() {
        let (status, body) = healthz(&config(&[]));
        assert_eq!((status, body), (503, json!({"status": "degraded"})));
    }

    #[test]
    fn health_details_every_capability_and_the_dispatcher() {
        let body = health(&config(&[]), None);
        assert_eq!(
            body,
            json!({"status": "degraded",
                   "capabilities": {"ingress": "misconfigured", "node_routes": "misconfigured",
                                    "admin": "misconfigured", "key_publication": "misconfigured"},
                   "dispatcher": "unreachable", "documents": null, "shards": null,
                   "rollback_floor": null})
        );
        let ping = Documents {
            documents: Present {
                policy: true,
                nodes: false,
            },
            shards: Some(MapState {
                call_shards: 1,
                map_revision: 2,
                rollback_floor: "v1.3".into(),
            }),
        };
        let body = health(&config(&[]), Some(ping.clone()));
        assert_eq!(body["dispatcher"], "reachable");
        assert_eq!(body["documents"], json!({"policy": true, "nodes": false}));
        assert_eq!(
            body["shards"],
            json!({"call_shards": 1, "map_revision": 2, "unreachable": []})
        );
        assert_eq!(body["rollback_floor"], "v1.3");
        let older = health(
            &config(&[]),
            Some(Documents {
                shards: None,
                ..ping
            }),
        );
        assert_eq!(
            (&older["shards"], &older["rollback_floor"]),
            (&Value::Null, &Value::Null)
        );
    }

    #[test]
    fn keys_are_listed_with_their_state() {
        let published = [
            PublishedKey {
                kid: "a".into(),
                public_key: "A".into(),
                state: KeyState::Active,
            },
            PublishedKey {
                kid: "b".into(),
                public_key: "B".into(),
                state: KeyState::Next,
            },
        ];
        assert_eq!(
            keys(&published),
            json!({"keys": [{"kid": "a", "public_key": "A", "state": "active"},
                            {"kid": "b", "public_key": "B", "state": "next"}]})
        );
    }
}
