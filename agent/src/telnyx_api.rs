//! Telnyx Call Control commands: answer, dial and hangup.
//!
//! Commands that carry a `command_id` are idempotent at Telnyx, so when no
//! HTTP answer arrives within `timing.telnyx_resend_ms` (500 ms) the same
//! command is sent again, at most 3 more times, while the earlier requests
//! stay in flight; the first HTTP answer of any of them wins. The API key is
//! read from its file once and never logged (`Debug` hides it).

use std::fmt;
use std::time::Duration;

use callfence_core::encoding::sha256_hex;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use reqwest::Url;
use serde_json::Value;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::config::TelnyxApiConfig;
use crate::files::check_private;
use crate::net::{describe, read_limited};
use crate::AgentError;

/// How many times a command is resent after the first send.
pub const MAX_RESENDS: usize = 3;

/// The largest Telnyx answer read.
const MAX_REPLY_BYTES: usize = 256 * 1024;

/// Telnyx's HTTP answer.
#[derive(Debug, Clone, PartialEq)]
pub struct Reply {
    /// HTTP status.
    pub status: u16,
    /// JSON body (`Null` when not JSON).
    pub body: Value,
}

impl Reply {
    /// 2xx.
    pub fn ok(&self) -> bool {
        (200..300).contains(&self.status)
    }

    /// Telnyx's error codes (`errors[].code`).
    pub fn error_codes(&self) -> Vec<String> {
        self.body["errors"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|e| match &e["code"] {
                        Value::String(s) => Some(s.clone()),
                        Value::Number(n) => Some(n.to_string()),
                        _ => None,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// True when Telnyx says the call is already answered: a 4xx naming one
    /// of `codes`, or whose error title/detail says "already answered".
    pub fn already_answered(&self, codes: &[String]) -> bool {
        if !(400..500).contains(&self.status) {
            return false;
        }
        if self.error_codes().iter().any(|c| codes.contains(c)) {
            return true;
        }
        self.body["errors"].as_array().is_some_and(|a| {
            a.iter().any(|e| {
                ["title", "detail"].iter().any(|f| {
                    e[*f]
                        .as_str()
                        .is_some_and(|t| t.to_ascii_lowercase().contains("already answered"))
                })
            })
        })
    }
}

/// The Telnyx API client.
#[derive(Clone)]
pub struct TelnyxApi {
    http: reqwest::Client,
    base: Url,
    key: String,
    resend: Duration,
    timeout: Duration,
}

impl fmt::Debug for TelnyxApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TelnyxApi")
            .field("base", &self.base.as_str())
            .finish_non_exhaustive()
    }
}

/// A deterministic `command_id` for hanging up a leg when shedding, so a
/// repeated `drain --shed` sends the same command.
pub fn hangup_command_id(call_control_id: &str) -> String {
    let h = sha256_hex(format!("callfence-hangup|{call_control_id}").as_bytes());
    format!(
        "{}-{}-5{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[16..20],
        &h[20..32]
    )
}

impl TelnyxApi {
    /// Reads the key file (refusing a shared one) and builds the client.
    pub fn from_config(
        http: reqwest::Client,
        cfg: &TelnyxApiConfig,
        resend: Duration,
        timeout: Duration,
    ) -> Result<TelnyxApi, AgentError> {
        check_private(&cfg.key_file, "telnyx api_key_file")?;
        let key = std::fs::read_to_string(&cfg.key_file)
            .map_err(|e| AgentError::new(format!("telnyx api_key_file: {e}")))?
            .trim()
            .to_string();
        if key.is_empty() || key.len() > 512 || !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(AgentError::new(
                "telnyx api_key_file does not hold an API key",
            ));
        }
        Ok(Self::new(http, cfg.base.clone(), key, resend, timeout))
    }

    /// A client for `base` with `key`.
    pub fn new(
        http: reqwest::Client,
        base: Url,
        key: String,
        resend: Duration,
        timeout: Duration,
    ) -> TelnyxApi {
        TelnyxApi {
            http,
            base,
            key,
            resend,
            timeout,
        }
    }

    fn url(&self, segments: &[&str]) -> Result<Url, String> {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|_| "bad telnyx api_base".to_string())?;
            path.pop_if_empty();
            for s in segments {
                path.push(s);
            }
        }
        Ok(url)
    }

    async fn send(
        http: reqwest::Client,
        url: Url,
        key: String,
        body: Vec<u8>,
        timeout: Duration,
    ) -> Result<Reply, String> {
        let resp = http
            .post(url)
            .timeout(timeout)
            .header(AUTHORIZATION, format!("Bearer {key}"))
            .header(CONTENT_TYPE, "application/json")
            .body(body)
            .send()
            .await
            .map_err(|e| describe(&e))?;
        let status = resp.status().as_u16();
        let bytes = read_limited(resp, MAX_REPLY_BYTES).await?;
        Ok(Reply {
            status,
            body: serde_json::from_slice(&bytes).unwrap_or(Value::Null),
        })
    }

    /// Sends one request, no resend (for commands without a `command_id`).
    pub async fn post_once(&self, segments: &[&str], body: &Value) -> Result<Reply, String> {
        let url = self.url(segments)?;
        let bytes = serde_json::to_vec(body).map_err(|_| "bad body".to_string())?;
        Self::send(
            self.http.clone(),
            url,
            self.key.clone(),
            bytes,
            self.timeout,
        )
        .await
    }

    /// Sends an idempotent command (its body carries a `command_id`),
    /// resending it while no HTTP answer has come; returns the first answer.
    pub async fn command(&self, segments: &[&str], body: &Value) -> Result<Reply, String> {
        let url = self.url(segments)?;
        let bytes = serde_json::to_vec(body).map_err(|_| "bad body".to_string())?;
        let mut set = JoinSet::new();
        let mut sent = 0usize;
        let mut next_send = Instant::now();
        let mut last_err = String::from("no_answer");
        loop {
            if sent <= MAX_RESENDS && Instant::now() >= next_send {
                set.spawn(Self::send(
                    self.http.clone(),
                    url.clone(),
                    self.key.clone(),
                    bytes.clone(),
                    self.timeout,
                ));
                sent += 1;
                next_send += self.resend;
            }
            let wake = if sent <= MAX_RESENDS {
                next_send
            } else {
                Instant::now() + self.timeout
            };
            tokio::select! {
                Some(done) = set.join_next() => match done {
                    Ok(Ok(reply)) => return Ok(reply),
                    Ok(Err(e)) => last_err = e,
                    Err(_) => last_err = "task_failed".into(),
                },
                _ = tokio::time::sleep_until(wake) => {
                    if sent > MAX_RESENDS && set.is_empty() {
                        return Err(last_err);
                    }
                }
            }
            if sent > MAX_RESENDS && set.is_empty() {
                return Err(last_err);
            }
        }
    }

    /// `POST /v2/calls/{id}/actions/answer` with `options` (which carry the
    /// fence's `command_id`).
    pub async fn answer(&self, call_control_id: &str, options: &Value) -> Result<Reply, String> {
        self.command(
            &["v2", "calls", call_control_id, "actions", "answer"],
            options,
        )
        .await
    }

    /// `POST /v2/calls/{id}/actions/hangup` with a deterministic `command_id`.
    pub async fn hangup(&self, call_control_id: &str) -> Result<Reply, String> {
        let body = serde_json::json!({"command_id": hangup_command_id(call_control_id)});
        self.command(
            &["v2", "calls", call_control_id, "actions", "hangup"],
            &body,
        )
        .await
    }

    /// `POST /v2/calls` (dial). Sent once: a dial is not idempotent.
    pub async fn dial(&self, options: &Value) -> Result<Reply, String> {
        self.post_once(&["v2", "calls"], options).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::extract::State;
    use axum::routing::post;
    use axum::{Json, Router};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    #[derive(Default)]
    struct Fake {
        hits: AtomicUsize,
        bodies: Mutex<Vec<Value>>,
        slow_first: usize,
    }

    async fn serve(fake: Arc<Fake>) -> Url {
        async fn answer(State(f): State<Arc<Fake>>, Json(body): Json<Value>) -> Json<Value> {
            let n = f.hits.fetch_add(1, Ordering::SeqCst);
            f.bodies.lock().unwrap().push(body);
            if n < f.slow_first {
                tokio::time::sleep(Duration::from_millis(3_000)).await;
            }
            Json(serde_json::json!({"data": {"result": "ok", "hit": n}}))
        }
        let app = Router::new()
            .route("/v2/calls/{id}/actions/answer", post(answer))
            .with_state(fake);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        Url::parse(&format!("http://{addr}")).unwrap()
    }

    fn api(base: Url) -> TelnyxApi {
        TelnyxApi::new(
            crate::net::client().unwrap(),
            base,
            "KEY".into(),
            Duration::from_millis(100),
            Duration::from_secs(5),
        )
    }

    #[tokio::test]
    async fn a_slow_answer_is_resent_with_the_same_command() {
        let fake = Arc::new(Fake {
            slow_first: 2,
            ..Default::default()
        });
        let t = api(serve(fake.clone()).await);
        let body = serde_json::json!({"command_id": "c-1"});
        let reply = t.answer("v3:abc", &body).await.unwrap();
        assert!(reply.ok());
        assert_eq!(
            reply.body["data"]["hit"], 2,
            "the third send answered first"
        );
        let bodies = fake.bodies.lock().unwrap().clone();
        assert_eq!(bodies.len(), 3);
        assert!(bodies.iter().all(|b| b == &body));
    }

    #[tokio::test]
    async fn a_prompt_answer_is_sent_once_and_no_answer_is_an_error() {
        let fake = Arc::new(Fake::default());
        let t = api(serve(fake.clone()).await);
        t.answer("v3:abc", &serde_json::json!({"command_id": "c"}))
            .await
            .unwrap();
        assert_eq!(fake.hits.load(Ordering::SeqCst), 1);
        let dead = api(Url::parse("http://127.0.0.1:9").unwrap());
        assert!(dead.answer("x", &serde_json::json!({})).await.is_err());
    }

    #[test]
    fn already_answered_is_recognised() {
        let r = Reply {
            status: 422,
            body: serde_json::json!({"errors": [{"code": "90018", "title": "Call already answered"}]}),
        };
        assert!(r.already_answered(&[]));
        let r = Reply {
            status: 422,
            body: serde_json::json!({"errors": [{"code": "12345", "title": "Nope"}]}),
        };
        assert!(!r.already_answered(&[]));
        assert!(r.already_answered(&["12345".to_string()]));
        let r = Reply {
            status: 500,
            body: serde_json::json!({"errors": [{"title": "already answered"}]}),
        };
        assert!(!r.already_answered(&[]));
    }

    #[test]
    fn hangup_ids_are_stable_uuids() {
        let a = hangup_command_id("v3:x");
        assert_eq!(a, hangup_command_id("v3:x"));
        assert_ne!(a, hangup_command_id("v3:y"));
        assert_eq!(a.len(), 36);
        assert_eq!(&a[14..15], "5");
    }
}
