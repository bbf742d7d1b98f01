//! Storage namespaces in a vGPU's spec: validation (each error names its field)
//! and the worker's `--storage` arguments. The worker opens the namespaces; vgpud only
//! checks what an operator can get wrong before a VM depends on it.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

use crate::api::StorageAttachment;

use super::error::ApiError;

/// Most namespaces one vGPU may have.
pub const MAX_NAMESPACES: usize = 16;

/// `path` resolved (symlinks and `..` followed) when it lies under `root` (resolved the
/// same way); else why not, naming the root and the option that sets it.
pub(super) fn under_root(path: &Path, root: &Path, option: &str) -> Result<PathBuf, String> {
    let real =
        std::fs::canonicalize(path).map_err(|e| format!("cannot use {}: {e}", path.display()))?;
    let real_root = std::fs::canonicalize(root)
        .map_err(|e| format!("{option} {} is unusable: {e}", root.display()))?;
    if real.starts_with(&real_root) {
        Ok(real)
    } else {
        Err(format!(
            "{} is outside {option} {}: vgpud only opens files under it (symlinks and .. included)",
            path.display(),
            root.display()
        ))
    }
}

/// Checks `list` (the `storage` field of a vGPU spec); with a `root` (`--storage-root`),
/// every backing file must lie under it.
pub(super) fn validate(
    list: &[StorageAttachment],
    root: Option<&Path>,
    state_dir: &Path,
) -> Result<(), ApiError> {
    if list.len() > MAX_NAMESPACES {
        return Err(ApiError::bad(
            "storage",
            format!(
                "{} namespaces; a vGPU takes at most {MAX_NAMESPACES}",
                list.len()
            ),
        ));
    }
    for (i, s) in list.iter().enumerate() {
        let field = |f: &str| format!("storage[{i}].{f}");
        if s.namespace == 0 || s.namespace > 65535 {
            return Err(ApiError::bad(
                &field("namespace"),
                format!("namespace id {}: give 1..=65535", s.namespace),
            ));
        }
        if list[..i].iter().any(|o| o.namespace == s.namespace) {
            return Err(ApiError::bad(
                &field("namespace"),
                format!(
                    "namespace {} is given twice; give each id once",
                    s.namespace
                ),
            ));
        }
        check_path(s).map_err(|why| ApiError::bad(&field("path"), why))?;
        if let Some(root) = root {
            under_root(Path::new(&s.path), root, "--storage-root")
                .map_err(|why| ApiError::bad(&field("path"), why))?;
        }
        outside_state_dir(Path::new(&s.path), state_dir)
            .map_err(|why| ApiError::bad(&field("path"), why))?;
    }
    Ok(())
}

/// A storage file is opened by the vGPU's worker, which runs as its own user and cannot
/// enter vgpud's state directory (0700): refuse one inside it now, not with a
/// `DEVICE_ERROR` in the guest later.
fn outside_state_dir(path: &Path, state_dir: &Path) -> Result<(), String> {
    let (Ok(file), Ok(state)) = (path.canonicalize(), state_dir.canonicalize()) else {
        return Ok(());
    };
    if file.starts_with(&state) {
        return Err(format!(
            "{} is inside vgpud's state directory {}, which only vgpud may enter; workers open storage files as their own users, so keep them elsewhere (e.g. under --storage-root)",
            path.display(),
            state.display()
        ));
    }
    Ok(())
}

fn check_path(s: &StorageAttachment) -> Result<(), String> {
    let path = Path::new(&s.path);
    if !path.is_absolute() {
        return Err(format!(
            "{:?} is not an absolute path; give the backing file's absolute path on the daemon's host",
            s.path
        ));
    }
    let meta = std::fs::metadata(path).map_err(|e| format!("cannot use {:?}: {e}", s.path))?;
    let ft = meta.file_type();
    if !(ft.is_file() || ft.is_block_device()) {
        return Err(format!(
            "{:?} is not a regular file or block device",
            s.path
        ));
    }
    let mut f = std::fs::OpenOptions::new()
        .read(true)
        .write(!s.read_only)
        .open(path)
        .map_err(|e| {
            format!(
                "cannot open {:?} for {}: {e}; check its permissions",
                s.path,
                if s.read_only {
                    "reading"
                } else {
                    "reading and writing"
                }
            )
        })?;
    let size = std::io::Seek::seek(&mut f, std::io::SeekFrom::End(0))
        .map_err(|e| format!("cannot size {:?}: {e}", s.path))?;
    if size < 512 {
        return Err(format!(
            "{:?} holds {size} bytes; a namespace needs at least one 512-byte block",
            s.path
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn att(namespace: u32, path: &str) -> StorageAttachment {
        StorageAttachment {
            namespace,
            path: path.into(),
            read_only: true,
        }
    }

    #[test]
    fn bad_namespaces_name_their_field() {
        let dir = std::env::temp_dir();
        let good = dir.join(format!("vgpud-storage-test-{}", std::process::id()));
        std::fs::write(&good, vec![7u8; 4096]).expect("write");
        let empty = dir.join(format!("vgpud-storage-empty-{}", std::process::id()));
        std::fs::write(&empty, b"").expect("write");
        let g = good.display().to_string();
        let e = empty.display().to_string();
        let state = dir.join(format!("vgpud-storage-state-{}", std::process::id()));
        std::fs::create_dir_all(&state).expect("mkdir");
        let in_state = state.join("ns.bin");
        std::fs::write(&in_state, vec![1u8; 4096]).expect("write");
        let err = validate(&[att(1, &in_state.display().to_string())], None, &state)
            .expect_err("inside the state directory");
        assert_eq!(err.field.as_deref(), Some("storage[0].path"), "{err:?}");
        assert!(err.error.contains("state directory"), "{err:?}");
        assert!(validate(&[att(1, &g), att(2, &g)], None, &state).is_ok());
        for (list, field, says) in [
            (vec![att(0, &g)], "storage[0].namespace", "1..=65535"),
            (
                vec![att(1, &g), att(1, &g)],
                "storage[1].namespace",
                "twice",
            ),
            (vec![att(1, "rel/path")], "storage[0].path", "absolute"),
            (
                vec![att(1, "/nonexistent/x")],
                "storage[0].path",
                "cannot use",
            ),
            (vec![att(1, &g), att(2, &e)], "storage[1].path", "512-byte"),
            (vec![att(1, "/")], "storage[0].path", "regular file"),
        ] {
            let err = validate(&list, None, &state).expect_err("invalid");
            assert_eq!(err.field.as_deref(), Some(field), "{err:?}");
            assert!(err.error.contains(says), "{err:?}");
        }
        assert_eq!(att(3, "/a:b").to_arg(), "3=/a:b:ro");
        // Under a root: a file inside passes; outside, `..` and a symlink out are refused.
        let root = dir.join(format!("vgpud-storage-root-{}", std::process::id()));
        std::fs::create_dir_all(&root).expect("mkdir");
        let inside = root.join("ns.bin");
        std::fs::write(&inside, vec![1u8; 4096]).expect("write");
        let link = root.join("out.bin");
        let _ = std::fs::remove_file(&link);
        std::os::unix::fs::symlink(&good, &link).expect("symlink");
        let inside_s = inside.display().to_string();
        assert!(validate(&[att(1, &inside_s)], Some(&root), &state).is_ok());
        for p in [
            g.clone(),
            format!(
                "{}/../{}",
                root.display(),
                good.file_name().and_then(|f| f.to_str()).unwrap_or("")
            ),
            link.display().to_string(),
        ] {
            let err = validate(&[att(1, &p)], Some(&root), &state).expect_err("outside");
            assert_eq!(err.field.as_deref(), Some("storage[0].path"), "{err:?}");
            assert!(err.error.contains("outside --storage-root"), "{err:?}");
        }
        let _ = std::fs::remove_dir_all(&root);
        let _ = std::fs::remove_dir_all(&state);
        let _ = std::fs::remove_file(good);
        let _ = std::fs::remove_file(empty);
    }
}
