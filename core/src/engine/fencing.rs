//! The answer fence, claims of dialled sessions, and media checks
//! (SPEC §7.4, §8): the guards that keep two nodes from answering one call.

use super::nodes::Caller;
use super::ownership::{Ownership, Target};
use super::routing::DecisionSubject;
use super::rows::{SessionRow, SessionState};
use super::{ClaimRequest, Engine, EngineError, FenceRequest};
use crate::decision::DecisionOutcome;
use crate::fence::command_id;
use crate::media::{self, MediaClaims, MediaError, MediaKeys};
use crate::store::Store;
use crate::time::format_ms;

pub use crate::wire::{FenceGrant, FenceRefusal, MediaRefusal};

/// The answer to a fence request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FenceReply {
    /// Granted.
    Granted(FenceGrant),
    /// Refused (409).
    Refused(FenceRefusal),
    /// The caller's node or key id is not in the current registry (401
    /// `unknown_node_key`).
    UnknownNodeKey,
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
    /// The claimer's node or key id is not in the current registry (401
    /// `unknown_node_key`).
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
    /// The caller's node or key id is not in the current registry (401
    /// `unknown_node_key`).
    UnknownNodeKey,
}

impl<S: Store> Engine<S> {
    /// `POST /v1/fence` from `caller` (signature already verified).
    pub fn handle_fence(
        &self,
        caller: Caller<'_>,
        req: &FenceRequest,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<FenceReply, EngineError> {
        let node = caller.node;
        self.unit(|| {
            if !self.key_in_force(caller)? {
                return Ok(FenceReply::UnknownNodeKey);
            }
            let found = self
                .q()
                .session_with_leg(&req.call_session_id, &req.call_control_id)?;
            let Some((session, leg_session)) = found else {
                return Ok(FenceReply::Refused(FenceRefusal::UnknownCall));
            };
            if leg_session.as_deref() != Some(session.id.as_str()) {
                return Ok(FenceReply::Refused(FenceRefusal::UnknownCall));
            }
            let owned = match Ownership::of(session) {
                Ownership::Fenced(f) => {
                    let fence = f.fence();
                    if fence.node == node && fence.epoch == req.epoch {
                        return Ok(FenceReply::Granted(grant(
                            &f.row().id,
                            node,
                            fence.epoch,
                            &fence.command_id,
                            fence.at_ms,
                            false,
                            keys,
                        )));
                    }
                    return Ok(FenceReply::Refused(refusal(f.row(), node)));
                }
                Ownership::Ended(_) => return Ok(FenceReply::Refused(FenceRefusal::CallEnded)),
                Ownership::Unowned(u) => return Ok(FenceReply::Refused(refusal(u.row(), node))),
                Ownership::Owned(o) => o,
            };
            if owned.owner() != node || owned.epoch() != req.epoch {
                return Ok(FenceReply::Refused(refusal(owned.row(), node)));
            }
            let id = command_id(&req.call_control_id, req.epoch);
            let fenced = owned.fence(&self.q(), &id, now_ms)?;
            Ok(FenceReply::Granted(grant(
                &fenced.row().id,
                node,
                req.epoch,
                &id,
                now_ms,
                true,
                keys,
            )))
        })
    }

    /// `POST /v1/claims`: `caller` dialled this leg and owns its session.
    pub fn handle_claim(
        &self,
        caller: Caller<'_>,
        req: &ClaimRequest,
        now_ms: i64,
    ) -> Result<ClaimReply, EngineError> {
        let node = caller.node;
        self.unit(|| {
            if !self.key_in_force(caller)? {
                return Ok(ClaimReply::NotRegistered);
            }
            let Some((_, registry)) = self.registry()? else {
                return Ok(ClaimReply::NotRegistered);
            };
            let Some(entry) = registry.nodes.get(node) else {
                return Ok(ClaimReply::NotRegistered);
            };
            let q = self.q();
            match q.session(&req.call_session_id)? {
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
                _ => {}
            }
            if let Some(other) = q.leg_session(&req.call_control_id)? {
                if other != req.call_session_id {
                    return Ok(ClaimReply::AlreadyOwned);
                }
            }
            let Ownership::Unowned(unowned) =
                Ownership::of(q.note_outgoing(&req.call_session_id, now_ms)?)
            else {
                return Ok(ClaimReply::AlreadyOwned);
            };
            q.track_leg(&req.call_control_id, &req.call_session_id, None, now_ms)?;
            let ids = q.counters(&["epoch", "decision"], &[])?;
            let target = Target {
                node: node.to_owned(),
                origin: entry.origin_url.clone(),
            };
            let owned = unowned.assign(&q, &target, ids[0], true, now_ms)?;
            let subject = DecisionSubject {
                session: Some(&req.call_session_id),
                event: None,
            };
            self.record_decision(
                Some(ids[1]),
                subject,
                None,
                Some(node),
                Some(owned.epoch()),
                DecisionOutcome::Assigned,
                now_ms,
            )?;
            Ok(ClaimReply::Claimed {
                call_session_id: req.call_session_id.clone(),
                epoch: owned.epoch(),
            })
        })
    }

    /// `POST /v1/media/verify` from `caller`.
    pub fn handle_media_verify(
        &self,
        caller: Caller<'_>,
        token: &str,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<MediaReply, EngineError> {
        if !self.key_in_force(caller)? {
            return Ok(MediaReply::UnknownNodeKey);
        }
        let node = caller.node;
        let claims = match media::verify(keys, token, now_ms) {
            Ok(c) => c,
            Err(MediaError::Expired) => return Ok(MediaReply::Invalid(MediaRefusal::Expired)),
            Err(_) => return Ok(MediaReply::Invalid(MediaRefusal::BadToken)),
        };
        if claims.node != node {
            return Ok(MediaReply::Invalid(MediaRefusal::NotOwner));
        }
        let Some(session) = self.q().session(&claims.call_session_id)? else {
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
