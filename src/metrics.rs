//! `GET /v1/metrics` (SPEC §17): the Prometheus text exposition of the
//! Dispatcher's counters and gauges, and the webhooks this Worker isolate
//! refused before the Dispatcher.
//!
//! # Refusals, per isolate
//!
//! A webhook refused by the Worker (§7.1: a missing, bad or stale
//! signature, a body that is not an event or is too large) never reaches
//! the Dispatcher, so a flood of forged webhooks costs it nothing. Each
//! isolate counts them in memory ([`count_refused`]) and reports them to the
//! Dispatcher in a batch:
//! - on the first request it serves (any route) at least
//!   [`REPORT_INTERVAL_MS`] after its last report, under `ctx.waitUntil`
//!   ([`report_due`]), so at most one batch a second per isolate; a batch
//!   that does not arrive is kept for the next;
//! - and with every scrape that isolate serves: the `metrics` message
//!   carries the isolate's pending count, which the Dispatcher adds before
//!   it answers. A test (or an operator) that scrapes through the isolate
//!   that refused sees every refusal at once, without waiting out a clock.
//!
//! A batch the Dispatcher applied but whose answer was lost is given back
//! and may be counted twice; a counter that is off by a rare batch is the
//! price of never writing to storage for it.
//!
//! # Cost of a scrape
//!
//! One Dispatcher message (to `global`, call shard 0 and the directory,
//! the only object until shard maps exist: N + 1 = 1 object), which reads
//! the status view and the in-memory counters and writes nothing.

use crate::protocol::{self, Reply, Request, Scraped};
use crate::reply::ApiError;
use callfence_core::metrics::exposition::{render, CONTENT_TYPE};
use callfence_core::metrics::merge::merge_scrapes;
use callfence_core::metrics::Sample;
use callfence_core::refusal::Refusal;
use futures_util::future::join_all;
use std::cell::RefCell;
use worker::{Context, Env, Response};

/// Least time between two reports of one isolate's refusals.
pub const REPORT_INTERVAL_MS: i64 = 1_000;

/// An isolate's refusals not yet reported, and when it last reported.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// Webhooks refused since the last report.
    pub refused: u64,
    /// When the last report was sent (0: never).
    pub reported_at_ms: i64,
}

impl Pending {
    /// The batch to report now, if any is pending and the last report is at
    /// least [`REPORT_INTERVAL_MS`] old; it is taken out of the pending count.
    pub fn take_due(&mut self, now_ms: i64) -> Option<u64> {
        if self.refused == 0 || now_ms - self.reported_at_ms < REPORT_INTERVAL_MS {
            return None;
        }
        Some(self.take(now_ms))
    }

    /// Takes everything pending (for a scrape, whatever the time).
    pub fn take(&mut self, now_ms: i64) -> u64 {
        self.reported_at_ms = now_ms;
        std::mem::take(&mut self.refused)
    }

    /// A batch that did not arrive: pending again.
    pub fn give_back(&mut self, batch: u64) {
        self.refused = self.refused.saturating_add(batch);
    }
}

thread_local! {
    static PENDING: RefCell<Pending> = RefCell::new(Pending::default());
}

fn pending<T>(f: impl FnOnce(&mut Pending) -> T) -> T {
    PENDING.with(|p| f(&mut p.borrow_mut()))
}

/// Counts one webhook this isolate refused before the Dispatcher.
pub fn count_refused() {
    pending(|p| p.refused = p.refused.saturating_add(1));
}

/// Reports the isolate's refusals under `waitUntil` if a report is due (see
/// the module doc); nothing otherwise. Never delays the request.
pub fn report_due(env: &Env, ctx: &Context, now_ms: i64) {
    let Some(batch) = pending(|p| p.take_due(now_ms)) else {
        return;
    };
    let env = env.clone();
    ctx.wait_until(async move {
        let request = Request::CountRefused { refused: batch };
        let reply = protocol::call::<serde_json::Value>(&env, &request, b"").await;
        if !matches!(reply, Ok(Reply::Done(_))) {
            pending(|p| p.give_back(batch));
        }
    });
}

/// `GET /v1/metrics`, after its bearer was accepted: every shard's samples
/// merged (SPEC §16: at most N + 1 objects, the map from `global` first),
/// with this isolate's pending refusals added, as text. A shard that does
/// not answer fails the scrape (503): a sum without its counters would
/// read as a counter reset.
pub async fn scrape(env: &Env, now_ms: i64) -> Result<Response, ApiError> {
    let batch = pending(|p| p.take(now_ms));
    let Some(scrapes) = scrape_shards(env, batch).await else {
        pending(|p| p.give_back(batch));
        return Err(ApiError::dispatcher_unavailable());
    };
    let internal = |_| ApiError(Refusal::Internal);
    let mut response = Response::ok(render(&merge_scrapes(&scrapes))).map_err(internal)?;
    let headers = response.headers_mut();
    headers
        .set("Content-Type", CONTENT_TYPE)
        .map_err(internal)?;
    headers.set("Cache-Control", "no-store").map_err(internal)?;
    Ok(response)
}

/// Every shard's samples, `refused` counted at `global`; `None` if any
/// shard did not answer.
async fn scrape_shards(env: &Env, refused: u64) -> Option<Vec<(u32, Vec<Sample>)>> {
    let shards = crate::span::shards(env).await;
    let asks = (0..shards).map(|shard| async move {
        let refused = if shard == 0 { refused } else { 0 };
        let request = Request::Metrics { refused };
        let deadline = protocol::DEADLINE_MS as i64;
        match protocol::call_shard_within::<Scraped>(env, shard, &request, b"", deadline).await {
            Ok(Reply::Done(scraped)) => Some((shard, scraped.samples)),
            _ => None,
        }
    });
    join_all(asks).await.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_due_at_most_once_a_second_and_only_when_something_is_pending() {
        let mut p = Pending::default();
        assert_eq!(p.take_due(5_000), None, "nothing pending");
        p.refused = 2;
        assert_eq!(
            p.take_due(5_000),
            Some(2),
            "the first report is due at once"
        );
        p.refused = 1;
        assert_eq!(p.take_due(5_999), None, "within the second");
        assert_eq!(p.take_due(6_000), Some(1));
        assert_eq!(p.refused, 0);
    }

    #[test]
    fn a_scrape_takes_everything_and_a_lost_batch_comes_back() {
        let mut p = Pending {
            refused: 3,
            reported_at_ms: 9_900,
        };
        assert_eq!(p.take(10_000), 3);
        p.refused = 1;
        p.give_back(3);
        assert_eq!(p.refused, 4);
        assert_eq!(p.take_due(10_500), None);
        assert_eq!(p.take_due(11_000), Some(4));
    }
}
