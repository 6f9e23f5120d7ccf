//! Who runs a release's `build` and `restart` (SPEC §14, v1.4): the
//! configured `deploy.build_user`, an account that cannot read the agent's
//! keys. The code being built is the app repository's; the account that
//! builds it must not be able to copy the node's signing key, the Telnyx
//! API key or the local API token, nor read the state directory.
//!
//! # The checks, before anything is fetched
//!
//! - no `build_user` → refused, unless `build_can_read_keys = true`
//!   (development only: the build then runs as the agent, and every such
//!   deploy logs `deploy_build_can_read_keys`);
//! - a `build_user` that can open any of the key files → refused, unless
//!   the same opt-out is set. "Can open" is decided exactly, not computed
//!   from modes: `test -r` runs *as the build user*, through the same
//!   mechanism that runs the build, on each key file, the local API token
//!   (`state_dir/local-api.token`) and the state directory (where `-x`, the
//!   right to enter it, counts too). So groups, ACLs and root's powers are
//!   all taken into account by the kernel itself; root, or the agent's own
//!   user, is always refused.
//!
//! # How a command runs as the build user
//!
//! - agent is root: `setpriv --reuid=<uid> --regid=<gid> --init-groups --`
//!   (or `runuser -u <user> --` where setpriv is missing), with `HOME`,
//!   `USER` and `LOGNAME` of the account. The user's own supplementary
//!   groups replace root's (std's `CommandExt::uid`/`gid` alone would keep
//!   root's groups);
//! - agent is not root: `sudo -n -u <user> --` (sudo must allow it without a
//!   password; otherwise the check above fails and the deploy is refused);
//! - `build_user` is the agent's own user: run directly (only reachable
//!   with the opt-out, since that user can read the keys).
//!
//! # The checkout during the build
//!
//! A root agent lends the new checkout's work tree (everything but `.git`)
//! to the build user for the build and takes all of it back afterwards
//! ([`Runner::lend`], [`Lent::take_back`]): every file becomes the agent's
//! again, group and other write bits and set-id bits are dropped, so the
//! build user cannot change the release after it was checked, and `.git`
//! must be the very directory it was (the build user cannot write inside
//! it, and may not swap it). A non-root agent cannot lend: its build user
//! can only write where the file modes let it.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::json;
use tokio::process::Command;

use crate::config::{Config, DeployConfig};
use crate::identity::{self, Account, Ids};

/// How long the key check may take (one `sh` as the build user).
const CHECK_TIMEOUT: Duration = Duration::from_secs(20);

/// Prints each argument the running user can read (or, for a directory,
/// enter).
const CAN_OPEN: &str = r#"for f do if [ -r "$f" ] || { [ -d "$f" ] && [ -x "$f" ]; }; then printf '%s\n' "$f"; fi; done"#;

/// How the deploy runs `build` and `restart`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Runner {
    /// As the agent's own user (the development opt-out, no `build_user`).
    Agent,
    /// As another account.
    As {
        /// The account.
        account: Account,
        /// How the agent becomes it.
        via: Via,
    },
}

/// How the agent runs a command as the build user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    /// The build user is the agent's own user.
    Same,
    /// Root: `setpriv --reuid --regid --init-groups`.
    Setpriv,
    /// Root without setpriv: `runuser -u`.
    Runuser,
    /// Not root: `sudo -n -u`.
    Sudo,
}

/// The runner for this deploy, refusing a build user that can open the
/// agent's keys (or a missing one) unless the configuration opts out by
/// name. Runs nothing but the check.
pub async fn resolve(config: &Config, cfg: &DeployConfig) -> Result<Runner, String> {
    let Some(name) = &cfg.build_user else {
        if cfg.build_can_read_keys {
            return Ok(Runner::Agent);
        }
        return Err("no deploy.build_user: the build and restart would run as the agent and could read its keys; name an account that cannot (build_can_read_keys = true opts out, for development only)".into());
    };
    let me = identity::own()?;
    let account = identity::account(name).await?;
    let via = if account.ids.uid == me.uid {
        Via::Same
    } else if !me.is_root() {
        Via::Sudo
    } else if on_path("setpriv") {
        Via::Setpriv
    } else {
        Via::Runuser
    };
    let runner = Runner::As { account, via };
    if cfg.build_can_read_keys {
        return Ok(runner);
    }
    let open = runner.can_open(&secrets(config)).await?;
    if !open.is_empty() {
        return Err(format!(
            "build_user {name} can open {}: a build could copy the node's keys (give the build an account that cannot; build_can_read_keys = true opts out, for development only)",
            open.join(", ")
        ));
    }
    Ok(runner)
}

/// Logs the development opt-out, once per deploy or rollback.
pub fn warn_if_opted_out(cfg: &DeployConfig) {
    if cfg.build_can_read_keys {
        crate::log::warn(
            "deploy_build_can_read_keys",
            json!({"build_user": cfg.build_user, "note": "development only: the build and restart may read the agent's keys"}),
        );
    }
}

/// What the build user must not open: the key files, the local API token
/// and the state directory.
fn secrets(config: &Config) -> Vec<PathBuf> {
    let mut list = vec![config.key.path.clone()];
    list.extend(config.next_key.as_ref().map(|k| k.path.clone()));
    list.extend(config.telnyx_api.as_ref().map(|a| a.key_file.clone()));
    list.push(config.state_dir.join("local-api.token"));
    list.push(config.state_dir.clone());
    list
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).any(|d| d.join(program).is_file()))
        .unwrap_or(false)
}

impl Runner {
    /// `program` prefixed so that it runs as the build user.
    pub fn command(&self, program: &str) -> Command {
        let (account, via) = match self {
            Runner::Agent => return Command::new(program),
            Runner::As { account, via } => (account, *via),
        };
        let mut cmd = match via {
            Via::Same => return Command::new(program),
            Via::Setpriv => {
                let mut c = Command::new("setpriv");
                c.arg(format!("--reuid={}", account.ids.uid))
                    .arg(format!("--regid={}", account.ids.gid))
                    .arg("--init-groups");
                c
            }
            Via::Runuser => {
                let mut c = Command::new("runuser");
                c.args(["-u", &account.name]);
                c
            }
            Via::Sudo => {
                let mut c = Command::new("sudo");
                c.args(["-n", "-u", &account.name]);
                c
            }
        };
        cmd.arg("--")
            .arg(program)
            .env("HOME", &account.home)
            .env("USER", &account.name)
            .env("LOGNAME", &account.name);
        cmd
    }

    /// Which of `paths` this runner's user can open, asked of the kernel
    /// by running `test` as that user.
    async fn can_open(&self, paths: &[PathBuf]) -> Result<Vec<String>, String> {
        let mut cmd = self.command("sh");
        cmd.args(["-c", CAN_OPEN, "sh"])
            .args(paths)
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        let out = tokio::time::timeout(CHECK_TIMEOUT, cmd.output())
            .await
            .map_err(|_| "the build user check did not finish".to_string())?
            .map_err(|e| format!("cannot run a command as the build user: {e}"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!(
                "cannot run a command as the build user ({}): {}",
                out.status,
                err.trim().chars().take(200).collect::<String>()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_string)
            .collect())
    }

    /// Lends the work tree at `dir` (all but `.git`) to the build user,
    /// when the agent is root and the build user another account.
    pub fn lend(&self, dir: &Path) -> Result<Option<Lent>, String> {
        let Runner::As {
            account,
            via: Via::Setpriv | Via::Runuser,
        } = self
        else {
            return Ok(None);
        };
        let me = identity::own()?;
        let git = std::fs::symlink_metadata(dir.join(".git")).map_err(|e| format!(".git: {e}"))?;
        walk(dir, &mut |path, _| {
            if path.parent() == Some(dir) && path.file_name() == Some(".git".as_ref()) {
                return Ok(false);
            }
            chown(path, account.ids)?;
            Ok(true)
        })?;
        Ok(Some(Lent {
            me,
            git: (git.dev(), git.ino()),
        }))
    }
}

/// A work tree lent to the build user; [`Lent::take_back`] after the build.
#[derive(Debug)]
pub struct Lent {
    me: Ids,
    git: (u64, u64),
}

impl Lent {
    /// Makes every file under `dir` the agent's again, without group or
    /// other write bits or set-id bits, and checks that `.git` is the
    /// directory it was.
    pub fn take_back(self, dir: &Path) -> Result<(), String> {
        walk(dir, &mut |path, meta| {
            chown(path, self.me)?;
            if !meta.file_type().is_symlink() {
                let mode = meta.permissions().mode() & 0o7777 & !0o7022;
                std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
                    .map_err(|e| format!("chmod {}: {e}", path.display()))?;
            }
            Ok(true)
        })?;
        let git = std::fs::symlink_metadata(dir.join(".git")).map_err(|e| format!(".git: {e}"))?;
        if !git.is_dir() || (git.dev(), git.ino()) != self.git {
            return Err("the build replaced the checkout's .git".into());
        }
        Ok(())
    }
}

fn chown(path: &Path, ids: Ids) -> Result<(), String> {
    std::os::unix::fs::lchown(path, Some(ids.uid), Some(ids.gid))
        .map_err(|e| format!("chown {}: {e}", path.display()))
}

/// Visits `dir` and everything under it without following symlinks;
/// `visit` answers whether to go into a directory.
fn walk(
    dir: &Path,
    visit: &mut dyn FnMut(&Path, &std::fs::Metadata) -> Result<bool, String>,
) -> Result<(), String> {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(path) = stack.pop() {
        let meta =
            std::fs::symlink_metadata(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        if !visit(&path, &meta)? || !meta.is_dir() {
            continue;
        }
        let entries = std::fs::read_dir(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        for entry in entries {
            stack.push(
                entry
                    .map_err(|e| format!("{}: {e}", path.display()))?
                    .path(),
            );
        }
    }
    Ok(())
}
