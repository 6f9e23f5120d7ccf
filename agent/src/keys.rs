//! Node signing keys: generating one (`keygen`), loading the configured
//! ones, and rotating from the active key to the configured `next` key.
//!
//! # Rotation
//!
//! The operator adds the next key's public half to the node registry, then
//! names the key as `next_key` in the configuration. Each heartbeat is first
//! signed with the next key; if the edge refuses it (401: the registry does
//! not know the key yet), the same body is sent again at once signed with
//! the active key, so no beat is lost. The first beat the edge accepts under
//! the next key switches every signed request (fence, claims, media) to it,
//! and the switch is persisted in `keys.json` in the state directory. The
//! operator then makes the next key the `key` and removes the old one from
//! the registry.
//!
//! A key file holds the standard base64 of the 32-byte Ed25519 seed and a
//! newline. Key material is never logged or printed; `Debug` shows the key id.

use std::fmt;
use std::fs::OpenOptions;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use callfence_core::encoding::{b64_decode, b64_encode, sha256_hex};
use ed25519_dalek::SigningKey;
use serde::{Deserialize, Serialize};

use crate::config::{Config, KeyRef};
use crate::files::{check_private, write_atomic};
use crate::AgentError;

/// A loaded node key.
pub struct NodeKey {
    /// The key id (`Callfence-Key-Id`).
    pub kid: String,
    /// The private key.
    pub signing: SigningKey,
}

impl fmt::Debug for NodeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NodeKey")
            .field("kid", &self.kid)
            .finish_non_exhaustive()
    }
}

impl NodeKey {
    /// Standard base64 of the public key, as the registry lists it.
    pub fn public_b64(&self) -> String {
        b64_encode(self.signing.verifying_key().as_bytes())
    }
}

/// The key id `keygen` proposes: `k` and the first 10 hex digits of the
/// SHA-256 of the public key (stable, and different for every key).
pub fn key_id_for(public: &[u8; 32]) -> String {
    format!("k{}", &sha256_hex(public)[..10])
}

/// What `keygen` prints.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Generated {
    /// Proposed key id.
    pub key_id: String,
    /// Standard base64 of the public key.
    pub public_key: String,
}

/// Writes a new private key to `out` (created with mode 0600; an existing
/// file is never overwritten).
pub fn keygen(out: &Path) -> Result<Generated, AgentError> {
    let mut seed = [0u8; 32];
    getrandom::fill(&mut seed).map_err(|e| AgentError::new(format!("no randomness: {e}")))?;
    let signing = SigningKey::from_bytes(&seed);
    seed.fill(0);
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(out)
        .map_err(|e| AgentError::new(format!("key file {}: {e}", out.display())))?;
    let mut text = b64_encode(&signing.to_bytes());
    text.push('\n');
    file.write_all(text.as_bytes())
        .and_then(|_| file.sync_all())
        .map_err(|e| AgentError::new(format!("key file {}: {e}", out.display())))?;
    check_private(out, "key file")?;
    let public = signing.verifying_key().to_bytes();
    Ok(Generated {
        key_id: key_id_for(&public),
        public_key: b64_encode(&public),
    })
}

/// Loads one key file, refusing one that group or others can read.
pub fn load(key: &KeyRef) -> Result<NodeKey, AgentError> {
    check_private(&key.path, "key file")?;
    let text = std::fs::read_to_string(&key.path)
        .map_err(|e| AgentError::new(format!("key file {}: {e}", key.path.display())))?;
    let bytes = b64_decode(text.trim())
        .filter(|b| b.len() == 32)
        .ok_or_else(|| {
            AgentError::new(format!(
                "key file {} does not hold a base64 32-byte Ed25519 seed",
                key.path.display()
            ))
        })?;
    let mut seed = [0u8; 32];
    seed.copy_from_slice(&bytes);
    let signing = SigningKey::from_bytes(&seed);
    seed.fill(0);
    Ok(NodeKey {
        kid: key.id.clone(),
        signing,
    })
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct RotationState {
    signing_kid: String,
}

/// The configured keys and which one signs.
#[derive(Debug)]
pub struct KeyRing {
    active: NodeKey,
    next: Option<NodeKey>,
    promoted: Mutex<bool>,
    state_path: PathBuf,
}

impl KeyRing {
    /// Loads the configured keys and the persisted rotation state.
    pub fn load(config: &Config) -> Result<KeyRing, AgentError> {
        let active = load(&config.key)?;
        let next = config.next_key.as_ref().map(load).transpose()?;
        Ok(Self::from_keys(
            active,
            next,
            config.state_dir.join("keys.json"),
        ))
    }

    /// Builds a ring from loaded keys; `state_path` records a promotion.
    pub fn from_keys(active: NodeKey, next: Option<NodeKey>, state_path: PathBuf) -> KeyRing {
        let persisted = std::fs::read(&state_path)
            .ok()
            .and_then(|b| serde_json::from_slice::<RotationState>(&b).ok());
        let promoted = match (&next, persisted) {
            (Some(n), Some(s)) => s.signing_kid == n.kid,
            _ => false,
        };
        KeyRing {
            active,
            next,
            promoted: Mutex::new(promoted),
            state_path,
        }
    }

    fn is_promoted(&self) -> bool {
        *self.promoted.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The key that signs fence, claim and media requests.
    pub fn current(&self) -> &NodeKey {
        match &self.next {
            Some(next) if self.is_promoted() => next,
            _ => &self.active,
        }
    }

    /// The keys to sign a heartbeat with, in order: the next key first while
    /// one is configured, then the active key as the same-beat fallback.
    pub fn beat_order(&self) -> Vec<&NodeKey> {
        match &self.next {
            Some(next) => vec![next, &self.active],
            None => vec![&self.active],
        }
    }

    /// Records that the edge accepted a beat signed with `kid`; returns true
    /// when this switched the ring to the next key.
    pub fn accepted(&self, kid: &str) -> bool {
        let Some(next) = &self.next else { return false };
        if kid != next.kid {
            return false;
        }
        let mut promoted = self.promoted.lock().unwrap_or_else(|p| p.into_inner());
        if *promoted {
            return false;
        }
        *promoted = true;
        let state = RotationState {
            signing_kid: next.kid.clone(),
        };
        if let Ok(bytes) = serde_json::to_vec(&state) {
            if let Err(e) = write_atomic(&self.state_path, &bytes, 0o600) {
                crate::log::warn(
                    "key_rotation_not_persisted",
                    serde_json::json!({"error": e.to_string()}),
                );
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::test_dir;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keygen_writes_an_owner_only_key_that_loads_back() {
        let dir = test_dir("keygen");
        let path = dir.join("node.key");
        let g = keygen(&path).unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        assert!(g.key_id.starts_with('k') && g.key_id.len() == 11);
        let key = load(&KeyRef {
            id: g.key_id.clone(),
            path: path.clone(),
        })
        .unwrap();
        assert_eq!(key.public_b64(), g.public_key);
        assert!(keygen(&path).is_err(), "never overwrites");
        assert!(!format!("{key:?}").contains(&b64_encode(&key.signing.to_bytes())));
    }

    #[test]
    fn rotation_switches_after_acceptance_and_survives_a_restart() {
        let dir = test_dir("rotation");
        let mk = |kid: &str, b: u8| NodeKey {
            kid: kid.into(),
            signing: SigningKey::from_bytes(&[b; 32]),
        };
        let state = dir.join("keys.json");
        let ring = KeyRing::from_keys(mk("old", 1), Some(mk("new", 2)), state.clone());
        assert_eq!(ring.current().kid, "old");
        let order: Vec<_> = ring.beat_order().iter().map(|k| k.kid.clone()).collect();
        assert_eq!(order, ["new", "old"]);
        assert!(!ring.accepted("old"));
        assert_eq!(ring.current().kid, "old");
        assert!(ring.accepted("new"));
        assert_eq!(ring.current().kid, "new");
        let again = KeyRing::from_keys(mk("old", 1), Some(mk("new", 2)), state);
        assert_eq!(again.current().kid, "new");
    }
}
