//! Another local user against root's vgpud and vgpuctl (docs/hostile.md, "Local users
//! against vgpud"): a directory that user made first, with links into root's files and a
//! socket posing as vgpud's, is never used. The tests run as root; the other user is
//! uid 65534 (nobody), whose directories the test makes with chown.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use vgpu_tests::daemon::{temp_dir, vgpud_command};

const NOBODY: u32 = 65534;

/// A directory as another user would make it: theirs, `mode`, holding links named like
/// vgpud's files and pointing at root's `victim`.
fn plant(dir: &Path, owner: u32, mode: u32, victim: &Path) {
    std::fs::create_dir_all(dir).expect("dir");
    for name in ["vgpud-state.json.tmp", "vgpu-1.log", "vgpud.lock"] {
        std::os::unix::fs::symlink(victim, dir.join(name)).expect("link");
        std::os::unix::fs::lchown(dir.join(name), Some(owner), Some(owner)).expect("lchown");
    }
    std::os::unix::fs::chown(dir, Some(owner), Some(owner)).expect("chown");
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// Waits up to 15 s for `child` to exit; kills it if it is still running (it serves).
fn exit_or_kill(child: &mut std::process::Child) -> Option<std::process::ExitStatus> {
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(15) {
        if let Ok(Some(st)) = child.try_wait() {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn vgpud_refuses_a_directory_another_user_made_or_may_write_in() {
    let base = temp_dir("local-users");
    let victim = base.join("root-only");
    for (tag, owner, mode) in [("theirs", NOBODY, 0o755), ("open", 0, 0o777)] {
        std::fs::write(&victim, b"root's file").expect("victim");
        let dir = base.join(tag);
        plant(&dir, owner, mode, &victim);
        let sock = dir.join("vgpud.sock").display().to_string();
        let mut child = vgpud_command(&["--socket", &sock, "--sim-gpus", "1"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("vgpud");
        let status = exit_or_kill(&mut child);
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        assert_eq!(
            std::fs::read(&victim).expect("victim"),
            b"root's file",
            "{tag}: vgpud wrote through a link in a directory it does not own alone:\n{err}"
        );
        assert!(
            status.is_some_and(|s| !s.success()),
            "{tag}: vgpud ran in the directory ({status:?}):\n{err}"
        );
        assert!(
            err.contains("refusing the state directory")
                && err.contains(&dir.display().to_string()),
            "{tag}: {err}"
        );
        if owner == NOBODY {
            assert!(err.contains("uid 65534"), "{err}");
        } else {
            assert!(err.contains("mode 0777"), "{err}");
        }
        assert!(
            !dir.join("vgpud.sock").exists(),
            "{tag}: vgpud bound its socket there"
        );
    }
    let _ = std::fs::remove_dir_all(base);
}

/// Root without `XDG_RUNTIME_DIR` (as under sudo): vgpud and vgpuctl on their defaults
/// meet at `/run/vgpud`, never at `/tmp/vgpud-0`, which another user made with a socket
/// posing as vgpud's and links into root's files.
#[test]
fn root_on_default_paths_never_uses_a_directory_another_user_made() {
    let run = Path::new(vgpu_api::client::ROOT_DIR);
    assert!(
        !run.exists(),
        "{} exists: a root vgpud runs on this machine; this test needs it absent",
        run.display()
    );
    let trap = Path::new("/tmp/vgpud-0");
    assert!(
        !trap.exists(),
        "{} exists; remove it (it is what this test plants)",
        trap.display()
    );
    let base = temp_dir("default-paths");
    let victim = base.join("root-only");
    std::fs::write(&victim, b"root's file").expect("victim");
    plant(trap, 0, 0o755, &victim);
    let impostor = UnixListener::bind(trap.join("vgpud.sock")).expect("impostor socket");
    impostor.set_nonblocking(true).expect("nonblocking");
    std::os::unix::fs::chown(trap.join("vgpud.sock"), Some(NOBODY), Some(NOBODY)).expect("chown");
    std::os::unix::fs::chown(trap, Some(NOBODY), Some(NOBODY)).expect("chown");

    let log = base.join("vgpud.log");
    let mut vgpud = vgpud_command(&["--sim-gpus", "1"])
        .env_remove("XDG_RUNTIME_DIR")
        .env_remove("VGPUD_SOCKET")
        .env_remove("VGPUD_CONFIG")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("vgpud");
    let ctl = || {
        Command::new(vgpu_tests::bins::binary("vgpuctl"))
            .arg("gpus")
            .env_remove("XDG_RUNTIME_DIR")
            .env_remove("VGPUD_URL")
            .env_remove("VGPUD_SOCKET")
            .env_remove("VGPUD_TOKEN_FILE")
            .output()
            .expect("vgpuctl")
    };
    let start = Instant::now();
    let out = loop {
        let out = ctl();
        if out.status.success() || start.elapsed() > Duration::from_secs(20) {
            break out;
        }
        if let Ok(Some(st)) = vgpud.try_wait() {
            panic!(
                "vgpud exited ({st}):\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let touched = impostor.accept().is_ok();
    // SAFETY: kill on our own child's pid.
    unsafe { libc::kill(vgpud.id() as i32, libc::SIGTERM) };
    let stopped = exit_or_kill(&mut vgpud);
    let _ = std::fs::remove_dir_all(trap);
    let _ = std::fs::remove_dir_all(run);
    let vlog = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!touched, "vgpuctl talked to the other user's socket");
    assert_eq!(
        std::fs::read(&victim).expect("victim"),
        b"root's file",
        "{vlog}"
    );
    assert!(
        out.status.success(),
        "vgpuctl on its defaults did not reach vgpud on its defaults: {}\n{vlog}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("vgpu-sim-0"));
    assert!(vlog.contains("/run/vgpud/vgpud.sock"), "{vlog}");
    assert!(stopped.is_some_and(|s| s.success()), "{stopped:?}\n{vlog}");
    let _ = std::fs::remove_dir_all(base);
}
