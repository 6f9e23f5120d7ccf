//! Read-only views: status (the panel contract), preview, decisions, a
//! call's record, the paged reads of calls and of the event ledger (SPEC §9,
//! §13). Nothing here writes.

use super::routing::{route, route_under};
use super::rows::event_state as st;
use super::view::ShardView;
use super::{CallShard, EngineError, PreviewRequest};
use crate::eligibility::{effective_max_calls, Reason};
use crate::heartbeat::routing_hash;
use crate::number::normalise;
use crate::policy::RoutingPolicy;
use crate::store::Store;
use crate::time::format_ms;
use serde_json::{json, Value as Json};
use std::collections::BTreeMap;

/// The default and largest `limit` of list views.
pub const DEFAULT_LIMIT: u32 = 50;
/// See [`DEFAULT_LIMIT`].
pub const MAX_LIMIT: u32 = 500;
/// Decisions shown in the status view.
pub const STATUS_DECISIONS: u32 = 10;

/// At most this many routes are run for the caller overrides' next calls in
/// the status view (overrides × (lines + 1)); beyond it their `next_calls`
/// is null, and the editor's preview says where a caller's call would go.
pub const OVERRIDE_ROUTES: usize = 1000;

/// The largest `limit` of the paged reads of whole calls and of raw
/// events (`GET /v1/calls`, `GET /v1/events`); their default is
/// [`DEFAULT_LIMIT`].
pub const MAX_PAGE: u32 = 100;

/// Clamps a list `limit` to 1..=500, defaulting to 50.
pub fn clamp_limit(limit: Option<u32>) -> u32 {
    limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT)
}

/// Clamps a page `limit` to 1..=[`MAX_PAGE`], defaulting to 50.
fn clamp_page(limit: Option<u32>) -> u32 {
    limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_PAGE)
}

/// A page's `next` cursor: the last item's, when the page is full.
fn next<T: Into<Json> + Clone>(items: &[T], limit: u32) -> Json {
    match items.last() {
        Some(last) if items.len() == limit as usize => last.clone().into(),
        _ => Json::Null,
    }
}

fn reasons_json(reasons: &BTreeMap<String, Vec<Reason>>) -> Json {
    json!(reasons)
}

impl<S: Store> CallShard<S> {
    /// `POST /v1/routing/preview`: the same resolution and eligibility as a
    /// live call, storing nothing. `None` when there is no policy (or, for a
    /// draft, no registry). With a draft `policy`, resolves under the draft
    /// (validated as a PUT would validate it) and says `"draft": true`; a
    /// draft that would not validate answers its `draft_problems` instead.
    pub fn preview(&self, req: &PreviewRequest, now_ms: i64) -> Result<Option<Json>, EngineError> {
        let to = req.to.as_deref().and_then(normalise);
        let from = req.from.as_deref().and_then(normalise);
        let view = self.decision_view(now_ms);
        let routed = match &req.policy {
            None => route(&view, from.as_deref(), to.as_deref(), None, now_ms)?,
            Some(draft) => {
                let Some((nodes_revision, registry)) = &view.registry else {
                    return Ok(None);
                };
                let current = view.policy.as_ref();
                let previous = current.map(|(_, p)| p.as_ref());
                let policy = match crate::policy::validate(draft, registry, previous, now_ms) {
                    Ok(policy) => policy,
                    Err(problems) => {
                        return Ok(Some(json!({ "draft": true, "draft_problems": problems })))
                    }
                };
                let base = current.map_or(0, |(r, _)| *r);
                Some(route_under(
                    (base, &policy),
                    (*nodes_revision, registry),
                    &view,
                    from.as_deref(),
                    to.as_deref(),
                    None,
                    now_ms,
                )?)
            }
        };
        let Some(routed) = routed else {
            return Ok(None);
        };
        Ok(Some(json!({
            "rule": routed.resolution.rule,
            "line_id": routed.resolution.line_id,
            "prefers": routed.resolution.prefers,
            "chosen": routed.selection.chosen,
            "reasons": reasons_json(&routed.selection.reasons),
            "policy_revision": routed.policy_revision,
            "nodes_revision": routed.nodes_revision,
            "draft": req.policy.is_some(),
        })))
    }

    /// `GET /v1/decisions`: newest first; with `after` (a decision id),
    /// oldest first from there, and `next`, the cursor of the following
    /// page (null on the last).
    pub fn decisions(
        &self,
        limit: Option<u32>,
        session: Option<&str>,
        after: Option<u64>,
    ) -> Result<Json, EngineError> {
        let limit = clamp_limit(limit);
        let rows = self.q().decisions(limit, session, after)?;
        let list: Vec<Json> = rows
            .iter()
            .filter_map(|(_, b)| serde_json::from_str(b).ok())
            .collect();
        let mut page = json!({ "decisions": list });
        if after.is_some() {
            let ids: Vec<i64> = rows.iter().map(|(id, _)| *id).collect();
            page["next"] = next(&ids, limit);
        }
        Ok(page)
    }

    /// `GET /v1/calls`: whole calls (each as [`Self::call`] shows it) in
    /// session id order after `after`, and `next`, the cursor of the
    /// following page (null on the last).
    pub fn calls(&self, after: Option<&str>, limit: Option<u32>) -> Result<Json, EngineError> {
        let limit = clamp_page(limit);
        let ids = self.q().session_ids_after(after.unwrap_or(""), limit)?;
        let mut calls = Vec::with_capacity(ids.len());
        for id in &ids {
            calls.extend(self.call(id)?);
        }
        Ok(json!({ "calls": calls, "next": next(&ids, limit) }))
    }

    /// `GET /v1/events`: the ledger's events in arrival order after `after`
    /// (a `seq`), each with its state, its latest attempt's node, when it
    /// arrived and last changed (a delivered event: when its delivery was
    /// recorded) and its first delivery's raw body as received (the export a
    /// replay is made from; kept as long as the ledger keeps the event), and
    /// `next`, the cursor of the following page (null on the last).
    pub fn events(&self, after: Option<u64>, limit: Option<u32>) -> Result<Json, EngineError> {
        let limit = clamp_page(limit);
        let rows = self.q().events_after(after.unwrap_or(0), limit)?;
        let seqs: Vec<i64> = rows.iter().map(|e| e.seq).collect();
        let events: Vec<Json> = rows
            .into_iter()
            .map(|e| {
                json!({"seq": e.seq, "event_id": e.event_id, "event_type": e.event_type,
                       "call_session_id": e.call_session_id, "state": e.state, "node": e.node,
                       "received_at": format_ms(e.received_at_ms),
                       "updated_at": format_ms(e.updated_at_ms), "body": e.body})
            })
            .collect();
        Ok(json!({ "events": events, "next": next(&seqs, limit) }))
    }

    /// `GET /v1/calls/{id}`. `None` for an unknown call.
    pub fn call(&self, id: &str) -> Result<Option<Json>, EngineError> {
        let q = self.q();
        let Some(session) = q.session(id)? else {
            return Ok(None);
        };
        let legs: Vec<Json> = q
            .legs_of(id)?
            .into_iter()
            .map(|(ccid, state)| json!({"call_control_id": ccid, "state": state}))
            .collect();
        let events: Vec<Json> = q
            .session_history(id)?
            .into_iter()
            .map(|e| {
                json!({"event_id": e.event_id, "event_type": e.event_type, "state": e.state,
                       "received_at": format_ms(e.received_at_ms),
                       "attempts": e.attempts, "epoch": e.epoch, "node": e.node, "result_status": e.result_status})
            })
            .collect();
        Ok(Some(json!({
            "call_session_id": session.id,
            "owner": session.owner,
            "epoch": session.epoch,
            "state": session.state.as_str(),
            "origin_url": session.origin_url,
            "direction": session.direction,
            "created_at": format_ms(session.created_at_ms),
            "fence": session.fence.as_ref().map(|f| json!({
                "granted_at": format_ms(f.at_ms), "command_id": f.command_id, "node": f.node, "epoch": f.epoch
            })),
            "legs": legs,
            "events": events,
        })))
    }

    /// Where a call from `caller` (an override preferring `prefers`) would go
    /// now: to each line of `policy`, then (`line_id` null) to any other
    /// number.
    fn override_next_calls(
        view: &ShardView,
        policy: &RoutingPolicy,
        caller: &str,
        prefers: &str,
        now_ms: i64,
    ) -> Result<Vec<Json>, EngineError> {
        let called = policy
            .by_line
            .iter()
            .map(|(id, line)| (Some(id.as_str()), Some(line.called_number.as_str())))
            .chain([(None, None)]);
        let mut out = Vec::new();
        for (line_id, to) in called {
            let Some(routed) = route(view, Some(caller), to, None, now_ms)? else {
                break;
            };
            let target = routed.selection.chosen;
            out.push(json!({
                "line_id": line_id,
                "next_call_target": target,
                "fallback_in_use": target.as_deref() != Some(prefers),
                "reasons": reasons_json(&routed.selection.reasons),
            }));
        }
        Ok(out)
    }

    /// `GET /v1/status`: the panel contract.
    pub fn status(&self, now_ms: i64) -> Result<Json, EngineError> {
        let view = self.decision_view(now_ms);
        let (policy, registry) = (&view.policy, &view.registry);
        let q = self.q();
        let last_webhook = q.counter("last_webhook_at")?;
        let last_webhook_at = (last_webhook > 0).then(|| format_ms(last_webhook));
        let mut lines = Vec::new();
        if let Some((_, p)) = &policy {
            for (line_id, line) in &p.by_line {
                let routed = route(&view, None, Some(&line.called_number), None, now_ms)?;
                let (target, reasons) = match &routed {
                    Some(r) => (
                        r.selection.chosen.clone(),
                        reasons_json(&r.selection.reasons),
                    ),
                    None => (None, json!({})),
                };
                lines.push(json!({
                    "line_id": line_id,
                    "called_number": line.called_number,
                    "prefers": line.preferred_node,
                    "fallback_node": line.fallback_node,
                    "next_call_target": target,
                    "fallback_in_use": target.as_deref() != Some(line.preferred_node.as_str()),
                    "reasons": reasons,
                }));
            }
        }
        let mut nodes = Vec::new();
        if let Some((_, r)) = registry {
            for (node, state, reasons) in view.nodes(q.all_open_calls()?, now_ms)? {
                let entry = r.nodes.get(node);
                let hb = state.beat.as_ref().map(|b| &b.heartbeat);
                let stale = reasons.contains(&Reason::HeartbeatStale);
                let regressions = state.seq_regressions;
                nodes.push(json!({
                    "node": node,
                    "role": entry.map(|e| e.role),
                    "mode": hb.map(|h| h.mode),
                    "sha": hb.map(|h| h.sha.clone()),
                    "clean": hb.map(|h| !h.dirty),
                    "app_ready": hb.map(|h| h.app_ready),
                    "heartbeat_age_s": state.beat.as_ref().map(|b| (now_ms - b.received_at_ms).max(0) / 1000),
                    "last_seen_at": state.beat.as_ref().map(|b| format_ms(b.received_at_ms)),
                    "stale": stale,
                    "capacity": {
                        "max_calls": effective_max_calls(entry, state.beat.as_deref()),
                        "active_calls": hb.map(|h| h.capacity.active_calls),
                        "open_calls": state.open_calls,
                    },
                    "tunnel_up": hb.map(|h| h.tunnel_up),
                    "routing_hash": hb.map(|h| h.routing_hash.clone()),
                    "eligible": reasons.is_empty(),
                    "reasons": reasons,
                    "seq_regressions": regressions.map_or(0, |(n, _)| n),
                    "seq_regressed_at": regressions.map(|(_, at)| format_ms(at)),
                }));
            }
        }
        let mut overrides = Vec::new();
        if let Some((_, p)) = &policy {
            // Where each caller's next call goes, on every line and to other
            // numbers, while that stays within OVERRIDE_ROUTES routes.
            let within = p.by_caller.len() * (p.by_line.len() + 1) <= OVERRIDE_ROUTES;
            for (caller, o) in &p.by_caller {
                let expired = o.expires_at_ms <= now_ms;
                let next_calls = if within && !expired {
                    Json::Array(Self::override_next_calls(
                        &view,
                        p,
                        caller,
                        &o.preferred_node,
                        now_ms,
                    )?)
                } else {
                    Json::Null
                };
                overrides.push(json!({"caller": caller, "prefers": o.preferred_node,
                       "expires_at": format_ms(o.expires_at_ms), "expired": expired,
                       "note": o.note, "created_at": format_ms(o.created_at_ms),
                       "next_calls": next_calls}));
            }
        }
        let recent = self.decisions(Some(STATUS_DECISIONS), None, None)?;
        let refused = self.refused();
        Ok(json!({
            "engine": {
                "operative": policy.is_some() && registry.is_some() && last_webhook_at.is_some(),
                "last_webhook_at": last_webhook_at,
            },
            "policy_revision": policy.as_ref().map(|(r, _)| *r),
            "nodes_revision": registry.as_ref().map(|(r, _)| *r),
            "routing_hash": policy.as_ref().map(|(_, p)| routing_hash(&p.routing_lines())),
            "lines": lines,
            "nodes": nodes,
            "overrides": overrides,
            "counts": {
                "open_calls": q.count_open_sessions()?,
                "pending": q.count_events(st::PENDING)?,
                "unroutable": q.count_events(st::UNROUTABLE)?,
                "ignored": q.count_events(st::IGNORED)?,
                "sessions": q.count_sessions()?,
                "session_cap": self.config.session_cap,
                "storage_full": refused.storage_full,
                "claims_capacity_exhausted": refused.claims_capacity_exhausted,
                "claims_rate_limited": refused.claims_rate_limited,
            },
            "recent_decisions": recent["decisions"],
        }))
    }
}
