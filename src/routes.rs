//! The route table (SPEC §3): which routes exist, their methods, the
//! capability each needs, who may call it, and its body limit.
//!
//! Unknown paths are 404 `not_found`; a known path with another method is
//! 405 `method_not_allowed` with an `Allow` header.

use crate::auth::Access;
use crate::config::Capability;
use crate::reply::ApiError;

/// 1 KiB.
const KIB: usize = 1024;
/// Longest call session id accepted in `/v1/calls/{id}`.
pub const MAX_CALL_ID_CHARS: usize = 256;

/// One route of the contract.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Route {
    /// `GET /healthz`.
    Healthz,
    /// `GET /v1/keys`.
    Keys,
    /// `GET /`: the read-only dashboard.
    Dashboard,
    /// `GET /v1/health`.
    Health,
    /// `POST /v1/telnyx/webhook`.
    Webhook,
    /// `POST /v1/nodes/heartbeat`.
    Heartbeat,
    /// `POST /v1/fence`.
    Fence,
    /// `POST /v1/claims`.
    Claims,
    /// `POST /v1/media/verify`.
    MediaVerify,
    /// `POST /v1/nodes/probe`: the L5 probe (SPEC §14).
    Probe,
    /// `GET /v1/policy`.
    GetPolicy,
    /// `PUT /v1/policy`.
    PutPolicy,
    /// `GET /v1/nodes`.
    GetNodes,
    /// `PUT /v1/nodes`.
    PutNodes,
    /// `GET /v1/shards`: the shard map (SPEC §16).
    GetShards,
    /// `PUT /v1/shards`.
    PutShards,
    /// `POST /v1/routing/preview`.
    Preview,
    /// `GET /v1/status`.
    Status,
    /// `GET /v1/decisions`.
    Decisions,
    /// `GET /v1/calls/{call_session_id}`.
    Call(String),
    /// `GET /v1/calls`: whole calls, a page at a time.
    Calls,
    /// `GET /v1/events`: the event ledger's raw webhooks, a page at a time
    /// (the replay export).
    Events,
    /// `GET /v1/metrics`: the Prometheus exposition (SPEC §17).
    Metrics,
}

/// Who may call a route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Anyone.
    Public,
    /// Telnyx: a webhook signature.
    Carrier,
    /// A node: a node signature (SPEC §6).
    Node,
    /// A bearer token.
    Bearer(Access),
}

impl Route {
    /// The route for `method` and `path` (without the query).
    pub fn resolve(method: &str, path: &str) -> Result<Route, ApiError> {
        let (allowed, route): (&[&str], fn(&str) -> Route) = match path {
            "/healthz" => (&["GET"], |_| Route::Healthz),
            "/v1/keys" => (&["GET"], |_| Route::Keys),
            "/" => (&["GET"], |_| Route::Dashboard),
            "/v1/health" => (&["GET"], |_| Route::Health),
            "/v1/telnyx/webhook" => (&["POST"], |_| Route::Webhook),
            "/v1/nodes/heartbeat" => (&["POST"], |_| Route::Heartbeat),
            "/v1/fence" => (&["POST"], |_| Route::Fence),
            "/v1/claims" => (&["POST"], |_| Route::Claims),
            "/v1/media/verify" => (&["POST"], |_| Route::MediaVerify),
            "/v1/nodes/probe" => (&["POST"], |_| Route::Probe),
            "/v1/policy" => (&["GET", "PUT"], |m| {
                if m == "GET" {
                    Route::GetPolicy
                } else {
                    Route::PutPolicy
                }
            }),
            "/v1/nodes" => (&["GET", "PUT"], |m| {
                if m == "GET" {
                    Route::GetNodes
                } else {
                    Route::PutNodes
                }
            }),
            "/v1/shards" => (&["GET", "PUT"], |m| {
                if m == "GET" {
                    Route::GetShards
                } else {
                    Route::PutShards
                }
            }),
            "/v1/routing/preview" => (&["POST"], |_| Route::Preview),
            "/v1/status" => (&["GET"], |_| Route::Status),
            "/v1/decisions" => (&["GET"], |_| Route::Decisions),
            "/v1/calls" => (&["GET"], |_| Route::Calls),
            "/v1/events" => (&["GET"], |_| Route::Events),
            "/v1/metrics" => (&["GET"], |_| Route::Metrics),
            _ => {
                let id = path
                    .strip_prefix("/v1/calls/")
                    .and_then(crate::request_url::path_segment)
                    .filter(|id| valid_call_id(id))
                    .ok_or_else(ApiError::not_found)?;
                return match method {
                    "GET" => Ok(Route::Call(id)),
                    _ => Err(ApiError::method_not_allowed(&["GET"])),
                };
            }
        };
        if allowed.contains(&method) {
            Ok(route(method))
        } else {
            Err(ApiError::method_not_allowed(allowed))
        }
    }

    /// The capability the route needs (checked before anything else).
    pub fn capability(&self) -> Option<Capability> {
        match self {
            Route::Healthz | Route::Dashboard => None,
            Route::Keys => Some(Capability::KeyPublication),
            Route::Webhook => Some(Capability::Ingress),
            Route::Heartbeat | Route::Fence | Route::Claims | Route::MediaVerify | Route::Probe => {
                Some(Capability::NodeRoutes)
            }
            Route::Health
            | Route::GetPolicy
            | Route::PutPolicy
            | Route::GetNodes
            | Route::PutNodes
            | Route::GetShards
            | Route::PutShards
            | Route::Preview
            | Route::Status
            | Route::Decisions
            | Route::Call(_)
            | Route::Calls
            | Route::Events
            | Route::Metrics => Some(Capability::Admin),
        }
    }

    /// Who may call the route.
    pub fn guard(&self) -> Guard {
        match self {
            Route::Healthz | Route::Keys | Route::Dashboard => Guard::Public,
            Route::Webhook => Guard::Carrier,
            Route::Heartbeat | Route::Fence | Route::Claims | Route::MediaVerify | Route::Probe => {
                Guard::Node
            }
            Route::Health
            | Route::GetNodes
            | Route::PutNodes
            | Route::GetShards
            | Route::PutShards
            | Route::Events => Guard::Bearer(Access::AdminOnly),
            Route::GetPolicy
            | Route::PutPolicy
            | Route::Preview
            | Route::Status
            | Route::Decisions
            | Route::Call(_)
            | Route::Calls => Guard::Bearer(Access::PolicyOrAdmin),
            Route::Metrics => Guard::Bearer(Access::MetricsOrAdmin),
        }
    }

    /// The largest body accepted (0: the route takes none).
    pub fn body_limit(&self) -> usize {
        match self {
            Route::Webhook => 64 * KIB,
            Route::PutPolicy | Route::PutNodes => 256 * KIB,
            Route::Heartbeat => 16 * KIB,
            Route::Fence
            | Route::Claims
            | Route::MediaVerify
            | Route::Probe
            | Route::Preview
            | Route::PutShards => 4 * KIB,
            _ => 0,
        }
    }
}

/// A call session id as it may appear in a path: 1 to
/// [`MAX_CALL_ID_CHARS`] visible ASCII characters, no `/`.
pub fn valid_call_id(id: &str) -> bool {
    (1..=MAX_CALL_ID_CHARS).contains(&id.len())
        && id.bytes().all(|b| b.is_ascii_graphic() && b != b'/')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_contract_route_resolves() {
        let cases = [
            ("GET", "/healthz", Route::Healthz),
            ("GET", "/v1/keys", Route::Keys),
            ("GET", "/", Route::Dashboard),
            ("GET", "/v1/health", Route::Health),
            ("POST", "/v1/telnyx/webhook", Route::Webhook),
            ("POST", "/v1/nodes/heartbeat", Route::Heartbeat),
            ("POST", "/v1/fence", Route::Fence),
            ("POST", "/v1/claims", Route::Claims),
            ("POST", "/v1/media/verify", Route::MediaVerify),
            ("POST", "/v1/nodes/probe", Route::Probe),
            ("GET", "/v1/policy", Route::GetPolicy),
            ("PUT", "/v1/policy", Route::PutPolicy),
            ("GET", "/v1/nodes", Route::GetNodes),
            ("PUT", "/v1/nodes", Route::PutNodes),
            ("GET", "/v1/shards", Route::GetShards),
            ("PUT", "/v1/shards", Route::PutShards),
            ("POST", "/v1/routing/preview", Route::Preview),
            ("GET", "/v1/status", Route::Status),
            ("GET", "/v1/decisions", Route::Decisions),
            ("GET", "/v1/calls", Route::Calls),
            ("GET", "/v1/events", Route::Events),
            ("GET", "/v1/metrics", Route::Metrics),
            (
                "GET",
                "/v1/calls/v3:abc-123",
                Route::Call("v3:abc-123".into()),
            ),
            (
                "GET",
                "/v1/calls/v3%3Aabc-123",
                Route::Call("v3:abc-123".into()),
            ),
        ];
        for (method, path, route) in cases {
            assert_eq!(Route::resolve(method, path), Ok(route), "{method} {path}");
        }
    }

    #[test]
    fn unknown_paths_are_404_and_wrong_methods_405() {
        for path in [
            "/nope",
            "/v1/",
            "/v1/status/",
            "/v1/calls/",
            "/v1/calls/a/b",
            "/healthz/x",
        ] {
            assert_eq!(
                Route::resolve("GET", path).unwrap_err().0.status(),
                404,
                "{path}"
            );
        }
        let error = Route::resolve("DELETE", "/v1/policy").unwrap_err();
        assert_eq!(
            (error.0.status(), error.code()),
            (405, "method_not_allowed")
        );
        assert_eq!(
            crate::reply::Answer::refusal(&error.0).headers,
            [("Allow", "GET, PUT".to_owned())]
        );
        assert_eq!(
            Route::resolve("GET", "/v1/telnyx/webhook")
                .unwrap_err()
                .0
                .status(),
            405
        );
        assert_eq!(
            Route::resolve("POST", "/v1/calls/x")
                .unwrap_err()
                .0
                .status(),
            405
        );
    }

    #[test]
    fn operator_only_routes_refuse_policy_tokens() {
        for route in [
            Route::Health,
            Route::GetNodes,
            Route::PutNodes,
            Route::GetShards,
            Route::PutShards,
            Route::Events,
        ] {
            assert_eq!(route.guard(), Guard::Bearer(Access::AdminOnly));
        }
        for route in [
            Route::GetPolicy,
            Route::PutPolicy,
            Route::Preview,
            Route::Status,
            Route::Decisions,
            Route::Calls,
        ] {
            assert_eq!(route.guard(), Guard::Bearer(Access::PolicyOrAdmin));
        }
    }

    #[test]
    fn body_limits_follow_the_contract() {
        assert_eq!(Route::Webhook.body_limit(), 65_536);
        assert_eq!(Route::PutNodes.body_limit(), 262_144);
        assert_eq!(Route::PutShards.body_limit(), 4096);
        assert_eq!(Route::Heartbeat.body_limit(), 16_384);
        assert_eq!(Route::Fence.body_limit(), 4_096);
        assert_eq!(Route::Status.body_limit(), 0);
    }
}
