//! vgpud's own directories and the files it creates in them. A directory another user
//! made first, or may write in, is refused: its files could be links into root's files,
//! its socket another user's (docs/hostile.md, "Local users against vgpud").

use std::fs::File;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::error::DaemonError;

/// The default state directory (and the API socket's): `/run/vgpud` for root,
/// `$XDG_RUNTIME_DIR/vgpud` for anyone else.
pub fn default_state_dir() -> Result<PathBuf, DaemonError> {
    vgpu_api::client::default_dir().map_err(DaemonError::Option)
}

/// Creates `dir` (mode 0700, with its parents) or checks the existing one: it must be
/// owned by vgpud's uid and writable by no one else. An existing one that others may
/// read is tightened to 0700.
pub fn prepare_dir(dir: &Path, what: &'static str) -> Result<(), DaemonError> {
    let io_err = |source| DaemonError::StateDir {
        path: dir.to_owned(),
        source,
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io_err)?;
    let meta = std::fs::metadata(dir).map_err(io_err)?;
    // SAFETY: geteuid has no preconditions and cannot fail.
    let me = unsafe { libc::geteuid() };
    check_dir(dir, what, meta.uid(), meta.mode(), me)?;
    if meta.mode() & 0o777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(io_err)?;
        tracing::info!(dir = %dir.display(), "{what} tightened to mode 0700 (was {:04o})", meta.mode() & 0o7777);
    }
    Ok(())
}

/// The check of [`prepare_dir`] on a directory's owner and mode, for vgpud running as `me`.
fn check_dir(
    dir: &Path,
    what: &'static str,
    owner: u32,
    mode: u32,
    me: u32,
) -> Result<(), DaemonError> {
    let why = if owner != me {
        format!("it belongs to uid {owner}, not to vgpud's uid {me}")
    } else if mode & 0o022 != 0 {
        format!(
            "group or others may write in it (mode {:04o})",
            mode & 0o7777
        )
    } else {
        return Ok(());
    };
    Err(DaemonError::SharedDir {
        what,
        path: dir.to_owned(),
        why,
    })
}

/// Creates `path` afresh for writing, mode 0600: whatever was at that name (an old log, or
/// a link planted there) is unlinked first, and the file is created exclusively without
/// following a link, so a write never lands in another file.
pub fn create_file(path: &Path) -> std::io::Result<File> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_of_others_or_open_to_others_are_refused() {
        let d = Path::new("/x");
        assert!(check_dir(d, "state directory", 1000, 0o40700, 1000).is_ok());
        assert!(check_dir(d, "state directory", 1000, 0o40755, 1000).is_ok());
        let e = check_dir(d, "state directory", 65534, 0o40700, 0).expect_err("other owner");
        assert!(e.to_string().contains("uid 65534"), "{e}");
        let e = check_dir(d, "socket directory", 0, 0o41777, 0).expect_err("sticky /tmp");
        assert!(e.to_string().contains("mode 1777"), "{e}");
        assert!(check_dir(d, "state directory", 0, 0o40770, 0).is_err());
    }

    #[test]
    fn created_files_never_follow_a_planted_link() {
        let dir = std::env::temp_dir().join(format!("vgpud-private-test-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("dir");
        let victim = dir.join("victim");
        std::fs::write(&victim, b"keep").expect("victim");
        let log = dir.join("vgpu-1.log");
        std::os::unix::fs::symlink(&victim, &log).expect("link");
        std::io::Write::write_all(&mut create_file(&log).expect("create"), b"log").expect("write");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"keep");
        assert_eq!(std::fs::read(&log).expect("log"), b"log");
        assert!(!std::fs::symlink_metadata(&log)
            .expect("meta")
            .file_type()
            .is_symlink());
        let _ = std::fs::remove_dir_all(dir);
    }
}
