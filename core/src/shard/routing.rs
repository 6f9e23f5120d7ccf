//! Routing: resolve the policy, select a node on the directory's view, and
//! record the decision with its evidence. The same code serves live calls,
//! reassignment, the alarm, the preview and the status view. Resolution and
//! selection are pure functions of a [`ShardView`](super::view::ShardView): they read no table.

use super::rows::SessionRow;
use super::view::ShardView;
use super::{CallShard, EngineError};
use crate::decision::{Decision, DecisionOutcome};
use crate::eligibility::{self, LineRef};
use crate::metrics::Count;
use crate::policy::{Resolution, RoutingPolicy, Rule};
use crate::registry::NodeRegistry;
use crate::selection::{select, Selection};
use crate::store::Store;
use crate::time::format_ms;
use std::collections::BTreeMap;

/// Where a session is assigned: the node and its registered origin.
pub(crate) struct Target {
    pub node: String,
    pub origin: String,
}

/// A routing answer for one call.
#[derive(Debug, Clone)]
pub(crate) struct Routed {
    pub resolution: Resolution,
    pub selection: Selection,
    pub policy_revision: u64,
    pub nodes_revision: u64,
    /// The chosen node's origin URL (from the registry) and beat SHA.
    pub chosen_origin: Option<String>,
    pub chosen_sha: Option<String>,
    pub chosen_clean: Option<bool>,
}

/// Where a call shard's number sits in its decision ids and event `seq`s.
const SHARD_SHIFT: u32 = 40;

impl Routed {
    /// The chosen node and the origin URL it is assigned with, if any.
    pub(crate) fn target(&self) -> Option<Target> {
        let (node, origin) = self
            .selection
            .chosen
            .clone()
            .zip(self.chosen_origin.clone())?;
        Some(Target { node, origin })
    }
}

/// What a decision is about, for the evidence record.
pub(crate) struct DecisionSubject<'a> {
    pub session: Option<&'a str>,
    pub event: Option<&'a str>,
}

/// Resolves and selects for a call from `caller` to `called` (both already
/// normalised) on the directory's `view`. `None` when the policy or the
/// registry is absent. `except` is the session being decided, which never
/// counts against a node's capacity.
pub(crate) fn route(
    view: &ShardView,
    caller: Option<&str>,
    called: Option<&str>,
    except: Option<&SessionRow>,
    now_ms: i64,
) -> Result<Option<Routed>, EngineError> {
    let (Some((policy_revision, policy)), Some((nodes_revision, registry))) =
        (&view.policy, &view.registry)
    else {
        return Ok(None);
    };
    route_under(
        (*policy_revision, policy),
        (*nodes_revision, registry),
        view,
        caller,
        called,
        except,
        now_ms,
    )
    .map(Some)
}

/// [`route`] under a given policy and registry (the preview of a draft
/// policy uses the one being edited instead of the one in force), with the
/// nodes' states of `view`.
pub(crate) fn route_under(
    (policy_revision, policy): (u64, &RoutingPolicy),
    (nodes_revision, registry): (u64, &NodeRegistry),
    view: &ShardView,
    caller: Option<&str>,
    called: Option<&str>,
    except: Option<&SessionRow>,
    now_ms: i64,
) -> Result<Routed, EngineError> {
    let resolution = policy.resolve(caller, called, now_ms);
    let line = called
        .and_then(|to| policy.line_for(to))
        .map(|(line_id, line)| LineRef {
            line_id,
            called_number: &line.called_number,
        });
    let mut chosen_beat = None;
    let selection = select(
        &resolution,
        &policy.default_node,
        registry,
        |node, candidacy| {
            let state = view.node(node, except)?.unwrap_or_default();
            let reasons = eligibility::check(
                &state.facts(registry.nodes.get(node)),
                candidacy,
                line,
                now_ms,
            );
            if reasons.is_empty() {
                chosen_beat = state.beat.clone();
            }
            Ok::<_, EngineError>(reasons)
        },
    )?;
    Ok(Routed {
        chosen_origin: selection
            .chosen
            .as_ref()
            .and_then(|n| registry.nodes.get(n))
            .map(|e| e.origin_url.clone()),
        chosen_clean: chosen_beat.as_ref().map(|b| !b.heartbeat.dirty),
        chosen_sha: chosen_beat.map(|b| b.heartbeat.sha.clone()),
        resolution,
        selection,
        policy_revision,
        nodes_revision,
    })
}

/// Routes an existing session by the numbers of its first event; the
/// session never counts against a node's capacity in its own decision.
pub(crate) fn route_session(
    view: &ShardView,
    session: &SessionRow,
    now_ms: i64,
) -> Result<Option<Routed>, EngineError> {
    route(
        view,
        session.caller.as_deref(),
        session.called.as_deref(),
        Some(session),
        now_ms,
    )
}

impl<S: Store> CallShard<S> {
    /// The deployment-wide number of this shard's `counted`-th decision or
    /// event (SPEC §16: decision ids unique across shards; an event's `seq`
    /// likewise, so the paged reads merge): `global`'s are its count, as
    /// before call shards; shard k's carry k above bit 40 (below 2^53, so a
    /// JSON number holds it exactly). A shard's numbers grow with its count.
    pub(crate) fn shard_scoped(&self, counted: u64) -> u64 {
        (u64::from(self.index) << SHARD_SHIFT) | counted
    }

    /// Stores a decision built from a routing answer (or from a claim when
    /// `routed` is `None`) under the id of its count `id` (drawn now when
    /// `None`) and returns that id.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn record_decision(
        &self,
        view: &ShardView,
        id: Option<u64>,
        subject: DecisionSubject<'_>,
        routed: Option<&Routed>,
        claim_node: Option<&str>,
        epoch: Option<u64>,
        outcome: DecisionOutcome,
        now_ms: i64,
    ) -> Result<u64, EngineError> {
        let counted = match id {
            Some(id) => id,
            None => self.q().counters(&["decision"], &[])?[0],
        };
        let decision_id = self.shard_scoped(counted);
        let (claim_sha, claim_clean) = match claim_node {
            Some(node) => {
                let beat = view.beat(node);
                (
                    beat.as_ref().map(|b| b.heartbeat.sha.clone()),
                    beat.as_ref().map(|b| !b.heartbeat.dirty),
                )
            }
            None => (None, None),
        };
        let decision = match routed {
            Some(r) => Decision {
                decision_id,
                at: format_ms(now_ms),
                call_session_id: subject.session.map(str::to_owned),
                event_id: subject.event.map(str::to_owned),
                policy_revision: Some(r.policy_revision),
                nodes_revision: Some(r.nodes_revision),
                rule: Some(r.resolution.rule),
                line_id: r.resolution.line_id.clone(),
                prefers: Some(r.resolution.prefers.clone()),
                chosen: r.selection.chosen.clone(),
                chosen_sha: r.chosen_sha.clone(),
                chosen_clean: r.chosen_clean,
                epoch,
                reasons: r.selection.reasons.clone(),
                outcome,
            },
            None => Decision {
                decision_id,
                at: format_ms(now_ms),
                call_session_id: subject.session.map(str::to_owned),
                event_id: subject.event.map(str::to_owned),
                policy_revision: view.policy.as_ref().map(|(r, _)| *r),
                nodes_revision: view.registry.as_ref().map(|(r, _)| *r),
                rule: claim_node.map(|_| Rule::Claim),
                line_id: None,
                prefers: claim_node.map(str::to_owned),
                chosen: if outcome == DecisionOutcome::Assigned {
                    claim_node.map(str::to_owned)
                } else {
                    None
                },
                chosen_sha: claim_sha,
                chosen_clean: claim_clean,
                epoch,
                reasons: BTreeMap::new(),
                outcome,
            },
        };
        let body =
            serde_json::to_string(&decision).map_err(|e| EngineError::Corrupt(e.to_string()))?;
        self.q()
            .insert_decision(decision_id, now_ms, subject.session, subject.event, &body)?;
        let rule = decision.rule.as_ref().map_or("none", Rule::as_str);
        self.metrics
            .stage(Count::Decision(rule, decision.outcome.as_str()));
        Ok(decision_id)
    }

    /// Records a decision that gave nobody the call (`pending`, `rejected`).
    pub(crate) fn record_unassigned(
        &self,
        view: &ShardView,
        subject: DecisionSubject<'_>,
        routed: Option<&Routed>,
        outcome: DecisionOutcome,
        now_ms: i64,
    ) -> Result<u64, EngineError> {
        self.record_decision(view, None, subject, routed, None, None, outcome, now_ms)
    }
}
