//! Who the agent runs as, and who an account named in the configuration is.
//!
//! The agent's own user and group are read from `/proc/self` (owned by the
//! process's effective user and group), so no `unsafe` call to `geteuid`
//! is needed; an account is looked up with `getent passwd`, which asks the
//! same name service the system's own tools use.

use std::os::unix::fs::MetadataExt;
use std::time::Duration;

/// A user and its primary group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    /// The user id.
    pub uid: u32,
    /// The primary group id.
    pub gid: u32,
}

impl Ids {
    /// True for root.
    pub fn is_root(&self) -> bool {
        self.uid == 0
    }
}

/// The agent's effective user and group; the error says what could not be
/// told, in words.
pub fn own() -> Result<Ids, String> {
    let meta = std::fs::metadata("/proc/self")
        .map_err(|e| format!("cannot tell the agent's own user: {e}"))?;
    Ok(Ids {
        uid: meta.uid(),
        gid: meta.gid(),
    })
}

/// An account from the password database.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Account {
    /// Its login name.
    pub name: String,
    /// Its user and primary group.
    pub ids: Ids,
    /// Its home directory.
    pub home: String,
}

/// True for a plausible login name: `^[a-z_][a-z0-9_-]{0,31}$`.
pub fn is_user_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    matches!(bytes.next(), Some(b'a'..=b'z' | b'_'))
        && name.len() <= 32
        && bytes.all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
}

/// Looks `name` up with `getent passwd`.
pub async fn account(name: &str) -> Result<Account, String> {
    if !is_user_name(name) {
        return Err(format!("{name:?} is not a user name"));
    }
    let run = tokio::process::Command::new("getent")
        .args(["passwd", "--", name])
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .map_err(|_| "getent timed out".to_string())?
        .map_err(|e| format!("cannot run getent: {e}"))?;
    if !out.status.success() {
        return Err(format!("no user {name} on this machine"));
    }
    parse_passwd(&String::from_utf8_lossy(&out.stdout))
        .ok_or_else(|| format!("getent passwd {name}: unreadable entry"))
}

/// `name:x:uid:gid:gecos:home:shell`.
fn parse_passwd(line: &str) -> Option<Account> {
    let fields: Vec<&str> = line.trim_end().split(':').collect();
    if fields.len() < 7 {
        return None;
    }
    Some(Account {
        name: fields[0].to_string(),
        ids: Ids {
            uid: fields[2].parse().ok()?,
            gid: fields[3].parse().ok()?,
        },
        home: fields[5].to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwd_lines_and_names() {
        let a =
            parse_passwd("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n").unwrap();
        assert_eq!(
            a.ids,
            Ids {
                uid: 65534,
                gid: 65534
            }
        );
        assert_eq!(a.home, "/nonexistent");
        assert!(parse_passwd("broken:x:1").is_none());
        for ok in ["nobody", "build", "_app-1"] {
            assert!(is_user_name(ok), "{ok}");
        }
        for bad in ["", "-u", "Root", "a b", "x;y", &"a".repeat(33)] {
            assert!(!is_user_name(bad), "{bad}");
        }
    }

    #[test]
    fn the_agent_knows_who_it_is() {
        let me = own().unwrap();
        let here = std::fs::metadata(crate::files::test_dir("identity")).unwrap();
        assert_eq!((me.uid, me.gid), (here.uid(), here.gid()));
    }
}
