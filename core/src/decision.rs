//! Decisions: the evidence record of every routing decision (SPEC §9).

use crate::eligibility::Reason;
use crate::policy::Rule;
use serde::Serialize;
use std::collections::BTreeMap;

/// What a decision did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DecisionOutcome {
    /// A node took a new session.
    Assigned,
    /// A session moved to another node after a definite non-delivery.
    Reassigned,
    /// No node could take the event yet; it is parked.
    Pending,
    /// The parking window closed with no eligible node.
    Rejected,
}

impl DecisionOutcome {
    /// The stable code: `assigned`, `reassigned`, `pending` or `rejected`.
    pub fn as_str(self) -> &'static str {
        match self {
            DecisionOutcome::Assigned => "assigned",
            DecisionOutcome::Reassigned => "reassigned",
            DecisionOutcome::Pending => "pending",
            DecisionOutcome::Rejected => "rejected",
        }
    }
}

/// One decision, as stored and as served by `GET /v1/decisions`.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    /// Sequential id, unique within the Dispatcher.
    pub decision_id: u64,
    /// When it was made (RFC 3339).
    pub at: String,
    /// The session decided.
    pub call_session_id: Option<String>,
    /// The event that caused it.
    pub event_id: Option<String>,
    /// The policy revision in force, if any.
    pub policy_revision: Option<u64>,
    /// The node-registry revision in force, if any.
    pub nodes_revision: Option<u64>,
    /// Which rule resolved the preferred node.
    pub rule: Option<Rule>,
    /// The line `to` matched.
    pub line_id: Option<String>,
    /// The node the policy prefers.
    pub prefers: Option<String>,
    /// The node chosen, or null.
    pub chosen: Option<String>,
    /// The chosen node's SHA at decision time.
    pub chosen_sha: Option<String>,
    /// Whether the chosen node's checkout was clean.
    pub chosen_clean: Option<bool>,
    /// The epoch issued, if any.
    pub epoch: Option<u64>,
    /// Node → reason codes for every node passed over.
    pub reasons: BTreeMap<String, Vec<Reason>>,
    /// What the decision did.
    pub outcome: DecisionOutcome,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_decision_serialises_with_the_contract_codes() {
        let decision = Decision {
            decision_id: 3,
            at: "2026-11-30T00:53:20.123Z".into(),
            call_session_id: Some("s1".into()),
            event_id: Some("e1".into()),
            policy_revision: Some(2),
            nodes_revision: Some(5),
            rule: Some(Rule::CallerOverride),
            line_id: None,
            prefers: Some("M3".into()),
            chosen: Some("M1".into()),
            chosen_sha: Some("a".repeat(40)),
            chosen_clean: Some(true),
            epoch: Some(9),
            reasons: BTreeMap::from([("M3".to_string(), vec![Reason::ModeDrained, Reason::Dirty])]),
            outcome: DecisionOutcome::Assigned,
        };
        assert_eq!(
            serde_json::to_value(&decision).unwrap(),
            json!({"decision_id": 3, "at": "2026-11-30T00:53:20.123Z", "call_session_id": "s1",
                   "event_id": "e1", "policy_revision": 2, "nodes_revision": 5,
                   "rule": "caller_override", "line_id": null, "prefers": "M3", "chosen": "M1",
                   "chosen_sha": "a".repeat(40), "chosen_clean": true, "epoch": 9,
                   "reasons": {"M3": ["mode_drained", "dirty"]}, "outcome": "assigned"})
        );
    }

    #[test]
    fn outcomes_are_snake_case() {
        for (outcome, code) in [
            (DecisionOutcome::Assigned, "assigned"),
            (DecisionOutcome::Reassigned, "reassigned"),
            (DecisionOutcome::Pending, "pending"),
            (DecisionOutcome::Rejected, "rejected"),
        ] {
            assert_eq!(serde_json::to_value(outcome).unwrap(), json!(code));
        }
    }
}
