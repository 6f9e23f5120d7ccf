//! HTTP client plumbing shared by every outgoing request: one client that
//! never follows redirects (a 3xx is an answer, not an instruction), body
//! reads bounded in size, and the paced retry of a request that is safe to
//! repeat ([`retried`]).

use std::future::Future;
use std::time::Duration;

use crate::AgentError;

/// The one client of the process (rustls, no redirects, no proxies from the
/// environment).
pub fn client() -> Result<reqwest::Client, AgentError> {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .connect_timeout(Duration::from_secs(5))
        .user_agent(concat!("callfence-agent/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| AgentError::new(format!("http client: {e}")))
}

/// Reads at most `limit` bytes of a response body; a longer body is an error.
pub async fn read_limited(mut resp: reqwest::Response, limit: usize) -> Result<Vec<u8>, String> {
    if resp.content_length().is_some_and(|n| n > limit as u64) {
        return Err(format!("response body over {limit} bytes"));
    }
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| describe(&e))? {
        if out.len() + chunk.len() > limit {
            return Err(format!("response body over {limit} bytes"));
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// A short description of a transport failure that names no URL query or
/// header (a reqwest error's Display can include the URL).
pub fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "timeout".into()
    } else if e.is_connect() {
        "connect_failed".into()
    } else if e.is_body() || e.is_decode() {
        "bad_body".into()
    } else if e.is_request() {
        "request_failed".into()
    } else {
        "transport_error".into()
    }
}

/// Pauses between the tries of a request that is safe to send again: 0.1,
/// 0.25, 0.5 and 1 s (five tries in all).
pub const RETRY_PAUSES_MS: [u64; 4] = [100, 250, 500, 1_000];

/// Runs `attempt` again after each of [`RETRY_PAUSES_MS`] while `again`
/// says its result is worth another try and the pause still ends within
/// `window` of the first try; returns the last result. Only for requests
/// that are safe to repeat.
pub async fn retried<T, F: Future<Output = T>>(
    window: Duration,
    mut attempt: impl FnMut() -> F,
    again: impl Fn(&T) -> bool,
) -> T {
    let started = tokio::time::Instant::now();
    let mut pauses = RETRY_PAUSES_MS.iter();
    loop {
        let result = attempt().await;
        match pauses.next() {
            Some(&ms)
                if again(&result) && started.elapsed() + Duration::from_millis(ms) <= window =>
            {
                tokio::time::sleep(Duration::from_millis(ms)).await;
            }
            _ => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[tokio::test]
    async fn retried_tries_five_times_at_most_and_stops_on_a_final_result_or_the_window() {
        async fn count(tries: &std::cell::Cell<u32>) -> u32 {
            tries.set(tries.get() + 1);
            tries.get()
        }
        let tries = std::cell::Cell::new(0);
        let last = retried(Duration::MAX, || count(&tries), |_| true).await;
        assert_eq!((last, tries.get()), (5, 5), "one try and four pauses");
        tries.set(0);
        let last = retried(Duration::MAX, || count(&tries), |n| *n < 2).await;
        assert_eq!(last, 2, "a final result ends it");
        tries.set(0);
        let last = retried(Duration::ZERO, || count(&tries), |_| true).await;
        assert_eq!(last, 1, "no pause fits a window of zero");
    }

    /// A loopback server answering every connection with `raw`.
    async fn answering(raw: &'static str) -> String {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        std::thread::spawn(move || {
            for mut conn in listener.incoming().flatten() {
                let mut request = [0u8; 4096];
                let _ = conn.read(&mut request);
                let _ = conn.write_all(raw.as_bytes());
            }
        });
        format!("http://{addr}/")
    }

    async fn body_of(raw: &'static str, limit: usize) -> Result<Vec<u8>, String> {
        let url = answering(raw).await;
        let resp = client().unwrap().get(url).send().await.unwrap();
        read_limited(resp, limit).await
    }

    #[tokio::test]
    async fn a_redirect_is_an_answer_not_followed() {
        let url = answering("HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        let resp = client().unwrap().get(url).send().await.unwrap();
        assert_eq!(resp.status(), 302);
    }

    #[tokio::test]
    async fn bodies_are_read_up_to_the_limit_and_no_further() {
        let sized = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: close\r\n\r\nhello";
        assert_eq!(body_of(sized, 5).await.unwrap(), b"hello");
        assert_eq!(
            body_of(sized, 4).await.unwrap_err(),
            "response body over 4 bytes"
        );
        // Without a length up front, the limit is enforced while reading.
        let chunked = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n";
        assert_eq!(body_of(chunked, 11).await.unwrap(), b"hello world");
        assert_eq!(
            body_of(chunked, 10).await.unwrap_err(),
            "response body over 10 bytes"
        );
    }

    #[tokio::test]
    async fn transport_failures_are_described_without_the_url() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let secret_url = format!("http://127.0.0.1:{port}/path?token=s3cret");
        let err = client().unwrap().get(&secret_url).send().await.unwrap_err();
        let text = describe(&err);
        assert_eq!(text, "connect_failed");
        assert!(!text.contains("s3cret"));
    }
}
