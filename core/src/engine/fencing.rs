//! The answer fence, claims of dialled sessions, and media checks
//! (SPEC §7.4, §8): the guards that keep two nodes from answering one call.

use super::routing::DecisionSubject;
use super::rows::{SessionRow, SessionState};
use super::{ClaimRequest, Engine, EngineError, FenceRequest};
use crate::decision::DecisionOutcome;
use crate::fence::command_id;
use crate::media::{self, MediaClaims, MediaError, MediaKeys};
use crate::store::{Store, Value};
use crate::time::format_ms;

pub use crate::wire::{FenceGrant, FenceRefusal, MediaRefusal};

/// The answer to a fence request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceReply {
    /// Granted.
    Granted(FenceGrant),
    /// Refused.
    Refused(FenceRefusal),
}

/// The answer to a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimReply {
    /// The node owns the session at this epoch (200).
    Claimed {
        /// The session.
        call_session_id: String,
        /// Its epoch.
        epoch: u64,
    },
    /// Another node owns it, or it is an inbound session the policy decides
    /// (409 `already_owned`).
    AlreadyOwned,
    /// The claimer is not in the current registry (401 `unknown_node_key`).
    NotRegistered,
}

/// The answer to a media check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MediaReply {
    /// Valid (200).
    Valid {
        /// The session.
        call_session_id: String,
        /// The epoch.
        epoch: u64,
    },
    /// Refused (409).
    Invalid(MediaRefusal),
}

impl<S: Store> Engine<S> {
    /// `POST /v1/fence` from `node` (signature already verified).
    pub fn handle_fence(
        &self,
        node: &str,
        req: &FenceRequest,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<FenceReply, EngineError> {
        self.store.atomically(|| {
            let Some(session) = self.load_session(&req.call_session_id)? else {
                return Ok(FenceReply::Refused(FenceRefusal::UnknownCall));
            };
            if self.session_of_leg(&req.call_control_id)?.as_deref() != Some(session.id.as_str()) {
                return Ok(FenceReply::Refused(FenceRefusal::UnknownCall));
            }
            if let Some(fence) = &session.fence {
                if fence.node == node && fence.epoch == req.epoch {
                    return Ok(FenceReply::Granted(grant(&session.id, node, fence.epoch, &fence.command_id, fence.at_ms, false, keys)));
                }
                return Ok(FenceReply::Refused(refusal(&session, node)));
            }
            if session.state == SessionState::Ended {
                return Ok(FenceReply::Refused(FenceRefusal::CallEnded));
            }
            if session.owner.as_deref() != Some(node) || session.epoch != Some(req.epoch) {
                return Ok(FenceReply::Refused(refusal(&session, node)));
            }
            let id = command_id(&req.call_control_id, req.epoch);
            self.exec(
                "UPDATE sessions SET fence_node = ?, fence_epoch = ?, fence_at = ?, command_id = ?, \
                 state = CASE WHEN state = 'assigned' THEN 'answered' ELSE state END, updated_at = ? \
                 WHERE call_session_id = ? AND fence_node IS NULL AND owner = ? AND epoch = ?",
                &[
                    node.into(),
                    req.epoch.into(),
                    Value::Int(now_ms),
                    id.as_str().into(),
                    Value::Int(now_ms),
                    session.id.as_str().into(),
                    node.into(),
                    req.epoch.into(),
                ],
            )?;
            Ok(FenceReply::Granted(grant(&session.id, node, req.epoch, &id, now_ms, true, keys)))
        })
    }

    /// `POST /v1/claims`: `node` dialled this leg and owns its session.
    pub fn handle_claim(
        &self,
        node: &str,
        req: &ClaimRequest,
        now_ms: i64,
    ) -> Result<ClaimReply, EngineError> {
        self.store.atomically(|| {
            let Some((_, registry)) = self.registry()? else {
                return Ok(ClaimReply::NotRegistered);
            };
            let Some(entry) = registry.nodes.get(node) else {
                return Ok(ClaimReply::NotRegistered);
            };
            let existing = self.load_session(&req.call_session_id)?;
            match &existing {
                Some(s) if s.owner.as_deref() == Some(node) => {
                    return Ok(ClaimReply::Claimed {
                        call_session_id: s.id.clone(),
                        epoch: s.epoch.unwrap_or(0),
                    });
                }
                // Only a session already known to be outgoing may be claimed:
                // anything else is decided by the policy, never by a node.
                Some(s) if s.owner.is_some() || !s.is_outgoing() => {
                    return Ok(ClaimReply::AlreadyOwned);
                }
                Some(_) => {}
                None => {
                    self.exec(
                        "INSERT INTO sessions (call_session_id, state, direction, created_at, updated_at) VALUES (?, 'pending_assignment', 'outgoing', ?, ?)",
                        &[req.call_session_id.as_str().into(), Value::Int(now_ms), Value::Int(now_ms)],
                    )?;
                }
            }
            if let Some(other) = self.session_of_leg(&req.call_control_id)? {
                if other != req.call_session_id {
                    return Ok(ClaimReply::AlreadyOwned);
                }
            }
            self.exec(
                "INSERT INTO legs (call_control_id, call_session_id, state, updated_at) VALUES (?, ?, 'open', ?) ON CONFLICT (call_control_id) DO NOTHING",
                &[req.call_control_id.as_str().into(), req.call_session_id.as_str().into(), Value::Int(now_ms)],
            )?;
            self.exec(
                "UPDATE sessions SET direction = 'outgoing' WHERE call_session_id = ?",
                &[req.call_session_id.as_str().into()],
            )?;
            let epoch = self.next_epoch()?;
            self.set_owner(&req.call_session_id, node, epoch, &entry.origin_url, now_ms)?;
            let subject = DecisionSubject {
                session: Some(&req.call_session_id),
                event: None,
            };
            self.record_decision(subject, None, Some(node), Some(epoch), DecisionOutcome::Assigned, now_ms)?;
            Ok(ClaimReply::Claimed {
                call_session_id: req.call_session_id.clone(),
                epoch,
            })
        })
    }

    /// `POST /v1/media/verify` from `node`.
    pub fn handle_media_verify(
        &self,
        node: &str,
        token: &str,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<MediaReply, EngineError> {
        let claims = match media::verify(keys, token, now_ms) {
            Ok(c) => c,
            Err(MediaError::Expired) => return Ok(MediaReply::Invalid(MediaRefusal::Expired)),
            Err(_) => return Ok(MediaReply::Invalid(MediaRefusal::BadToken)),
        };
        if claims.node != node {
            return Ok(MediaReply::Invalid(MediaRefusal::NotOwner));
        }
        let Some(session) = self.load_session(&claims.call_session_id)? else {
            return Ok(MediaReply::Invalid(MediaRefusal::BadToken));
        };
        let refusal = if session.epoch != Some(claims.epoch) {
            Some(MediaRefusal::StaleEpoch)
        } else if session.owner.as_deref() != Some(node) {
            Some(MediaRefusal::NotOwner)
        } else if !session
            .fence
            .as_ref()
            .is_some_and(|f| f.epoch == claims.epoch && f.node == node)
        {
            Some(MediaRefusal::NotFenced)
        } else if session.state == SessionState::Ended {
            Some(MediaRefusal::CallEnded)
        } else {
            None
        };
        Ok(match refusal {
            Some(r) => MediaReply::Invalid(r),
            None => MediaReply::Valid {
                call_session_id: session.id,
                epoch: claims.epoch,
            },
        })
    }
}

/// Why a node that is not (or no longer) the fenced owner is refused.
fn refusal(session: &SessionRow, node: &str) -> FenceRefusal {
    let owner = session
        .fence
        .as_ref()
        .map(|f| f.node.as_str())
        .or(session.owner.as_deref());
    if owner != Some(node) {
        FenceRefusal::NotOwner
    } else {
        FenceRefusal::StaleEpoch
    }
}

fn grant(
    session: &str,
    node: &str,
    epoch: u64,
    command_id: &str,
    at_ms: i64,
    first: bool,
    keys: &MediaKeys,
) -> FenceGrant {
    let claims = MediaClaims::for_grant(session, node, epoch, at_ms);
    FenceGrant {
        granted: true,
        first,
        epoch,
        command_id: command_id.to_owned(),
        media_token: media::mint(keys, &claims),
        granted_at: format_ms(at_ms),
    }
}
