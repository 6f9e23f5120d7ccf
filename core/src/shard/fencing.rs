//! The answer fence, claims of dialled sessions, and media checks
//! (SPEC §7.4, §8): the guards that keep two nodes from answering one call.
//! A claim is bounded like an assignment: by the node's capacity, by its
//! token bucket, and by `SESSION_CAP`; a refused claim stores no session
//! and evicts nothing (only an admitted one moves the node's bucket).

use super::lease::Undo;
use super::ownership::Ownership;
use super::queries::NewSession;
use super::routing::{DecisionSubject, Target};
use super::rows::{SessionRow, SessionState};
use super::{CallShard, ClaimRequest, EngineError, FenceRequest};
use crate::decision::DecisionOutcome;
use crate::fence::command_id;
use crate::media::{self, MediaClaims, MediaError, MediaKeys};
use crate::node_auth::Caller;
use crate::rate;
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
    /// The claim would take the node over its capacity, by the rule of
    /// eligibility's `capacity_exhausted`, or the node has reported no
    /// capacity yet (409 `capacity_exhausted`). No session is stored.
    CapacityExhausted,
    /// The node's claims are over their token bucket ([`crate::rate::CLAIMS`]):
    /// 429 `rate_limited` with `Retry-After`. Nothing is stored.
    RateLimited {
        /// Seconds until a claim is admitted again.
        retry_after_s: u32,
    },
    /// A new session with the sessions table at `SESSION_CAP` and only live
    /// sessions in it (503 `storage_full`). Nothing is stored or evicted.
    StorageFull,
    /// The claimer's node or key id is not in the current registry (401
    /// `unknown_node_key`).
    NotRegistered,
    /// The node was found full for want of room another shard may hold
    /// (SPEC §16): nothing is stored, its rate not spent; the Dispatcher
    /// asks for the room and serves the claim again as it stands.
    NeedRoom,
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

impl<S: Store> CallShard<S> {
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
            if !self.view.borrow().key_in_force(caller.node, caller.kid) {
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
    /// In order: the key, the node's token bucket, the session (an owner's
    /// re-claim answers the same 200, whatever its capacity), the node's
    /// capacity, and room for a new session under `SESSION_CAP`.
    pub fn handle_claim(
        &self,
        caller: Caller<'_>,
        req: &ClaimRequest,
        now_ms: i64,
    ) -> Result<ClaimReply, EngineError> {
        let node = caller.node;
        let undone = self.unit(|| {
            let view = self.decision_view(now_ms);
            if !view.key_in_force(caller.node, caller.kid) {
                return Ok::<_, Undo>(ClaimReply::NotRegistered);
            }
            let Some((_, registry)) = &view.registry else {
                return Ok(ClaimReply::NotRegistered);
            };
            let Some(entry) = registry.nodes.get(node) else {
                return Ok(ClaimReply::NotRegistered);
            };
            let q = self.q();
            let bucket = format!("claim_tat:{node}");
            match rate::CLAIMS.admit(q.counter(&bucket)?, now_ms) {
                Ok(tat) => q.set_counter(&bucket, tat)?,
                Err(limited) => {
                    return Ok(ClaimReply::RateLimited {
                        retry_after_s: limited.retry_after_s(),
                    })
                }
            }
            let existing = q.session(&req.call_session_id)?;
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
                _ => {}
            }
            if let Some(other) = q.leg_session(&req.call_control_id)? {
                if other != req.call_session_id {
                    return Ok(ClaimReply::AlreadyOwned);
                }
            }
            self.watch_room();
            let state = view.node(node, None)?.unwrap_or_default();
            let full = state.beat.is_none() || state.facts(Some(entry)).capacity_exhausted();
            if full && self.room_short() {
                return Err(Undo::NeedRoom);
            }
            if full {
                return Ok(ClaimReply::CapacityExhausted);
            }
            let row = match existing {
                Some(row) => row,
                None => {
                    let new = NewSession {
                        id: &req.call_session_id,
                        direction: Some("outgoing"),
                        caller: None,
                        called: None,
                        now_ms,
                    };
                    let inserted = match q.insert_session(&new, self.config.session_cap)? {
                        Some(row) => Some(row),
                        None => self.insert_at_cap(&new)?,
                    };
                    let Some(row) = inserted else {
                        return Ok(ClaimReply::StorageFull);
                    };
                    row
                }
            };
            let Ownership::Unowned(unowned) = Ownership::of(row) else {
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
                &view,
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
        });
        let reply = match undone {
            Ok(reply) => reply,
            Err(Undo::NeedRoom) => ClaimReply::NeedRoom,
            Err(Undo::Failed(e)) => return Err(e),
        };
        match reply {
            ClaimReply::CapacityExhausted => {
                self.count_refusal(|r| r.claims_capacity_exhausted += 1)
            }
            ClaimReply::RateLimited { .. } => self.count_refusal(|r| r.claims_rate_limited += 1),
            ClaimReply::StorageFull => self.count_refusal(|r| r.storage_full += 1),
            _ => {}
        }
        Ok(reply)
    }

    /// `POST /v1/media/verify` from `caller`.
    pub fn handle_media_verify(
        &self,
        caller: Caller<'_>,
        token: &str,
        keys: &MediaKeys,
        now_ms: i64,
    ) -> Result<MediaReply, EngineError> {
        if !self.view.borrow().key_in_force(caller.node, caller.kid) {
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
