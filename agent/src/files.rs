//! Durable small files: atomic replacement (temp file, fsync, rename, fsync
//! of the directory) and the permission rules for secrets and the state
//! directory.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use crate::AgentError;

/// Replaces `path` with `bytes` so that a reader (or a crash) sees either
/// the old content or the new, never a mix. The file gets `mode`.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "path has no file name"))?;
    let tmp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    {
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(mode)
            .open(&tmp)?;
        file.write_all(bytes)?;
        file.sync_all()?;
    }
    if let Err(e) = fs::rename(&tmp, path) {
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    File::open(dir)?.sync_all()
}

/// Refuses a secret file that group or others may read or write (the SPEC
/// asks for mode 0600).
pub fn check_private(path: &Path, what: &str) -> Result<(), AgentError> {
    let meta = fs::metadata(path)
        .map_err(|e| AgentError::new(format!("{what} {}: {e}", path.display())))?;
    if !meta.is_file() {
        return Err(AgentError::new(format!(
            "{what} {} is not a regular file",
            path.display()
        )));
    }
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(AgentError::new(format!(
            "{what} {} has mode {mode:04o}: it must be readable by its owner only (chmod 600)",
            path.display()
        )));
    }
    Ok(())
}

/// Creates the state directory if needed, owner-only.
pub fn ensure_state_dir(path: &Path) -> Result<(), AgentError> {
    fs::create_dir_all(path)
        .map_err(|e| AgentError::new(format!("state dir {}: {e}", path.display())))?;
    let meta = fs::metadata(path)
        .map_err(|e| AgentError::new(format!("state dir {}: {e}", path.display())))?;
    if meta.permissions().mode() & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(0o700))
            .map_err(|e| AgentError::new(format!("state dir {}: {e}", path.display())))?;
    }
    Ok(())
}

/// A fresh scratch directory for unit tests (the system temp dir is fine
/// here: only the configured state directory must avoid it).
#[cfg(test)]
pub(crate) fn test_dir(name: &str) -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "callfence-agent-{name}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).unwrap();
    dir
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_replaces_and_keeps_the_mode() {
        let dir = test_dir("atomic");
        let path = dir.join("f");
        write_atomic(&path, b"one", 0o600).unwrap();
        write_atomic(&path, b"two", 0o600).unwrap();
        assert_eq!(fs::read(&path).unwrap(), b"two");
        assert_eq!(
            fs::metadata(&path).unwrap().permissions().mode() & 0o777,
            0o600
        );
        let leftovers: Vec<_> = fs::read_dir(&dir).unwrap().collect();
        assert_eq!(leftovers.len(), 1, "no temp file left behind");
    }

    #[test]
    fn a_readable_secret_is_refused() {
        let dir = test_dir("private");
        let path = dir.join("k");
        fs::write(&path, "x").unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        let err = check_private(&path, "key file").unwrap_err();
        assert!(err.0.contains("0644"), "{err}");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        check_private(&path, "key file").unwrap();
    }
}
