//! The destination side: accept one incoming VM, check its description, fill its RAM,
//! restore every vCPU and device, confirm, and wait for the source's commit.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::channel::{Address, Listener, Stream};
use super::snapshot::{VmDescription, VmSnapshot, SNAPSHOT_VERSION};
use super::wire::{apply_ram, read_message, write_error, write_message, Kind, Message, WireError};
use super::{vcpu_state, MigrationError};
use crate::devices::bus::lock;
use crate::vm::Vm;

/// How long the destination waits for the next message of a started migration.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// How long a connection gets to present the VM's description before it is closed and
/// the next one awaited.
const FIRST_MESSAGE_WAIT: Duration = Duration::from_secs(5);

/// Most connections screened at once; one more is closed on arrival.
const SCREENING: usize = 16;

/// Waits on `addr` for the source and reads the VM's description. A connection that
/// does not open with a description carrying `token` (anyone who found the port first)
/// is told why and closed, and the listener waits for the next one: only the source
/// that was given the token ends the wait. Connections are screened side by side, so one
/// that says nothing does not hold the source up. vgpud cancels a move whose source does
/// not come (docs/migration.md).
pub fn accept(
    addr: &Address,
    token: Option<&str>,
) -> Result<(Stream, VmDescription), MigrationError> {
    let listen_err = |source| MigrationError::Listen {
        addr: addr.to_string(),
        source,
    };
    let listener = Listener::bind(addr).map_err(listen_err)?;
    listener.set_nonblocking(true).map_err(listen_err)?;
    tracing::info!(%addr, "waiting for an incoming VM");
    let (found, arrived) = std::sync::mpsc::channel();
    let screening = Arc::new(AtomicUsize::new(0));
    let (mut stream, d) = loop {
        if let Ok(source) = arrived.try_recv() {
            break source;
        }
        let candidate = match listener.accept() {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
            Err(e) => return Err(listen_err(e)),
        };
        if screening.load(Ordering::Acquire) >= SCREENING {
            tracing::debug!(%addr, "closed a connection: {SCREENING} are being screened");
            continue;
        }
        screening.fetch_add(1, Ordering::AcqRel);
        let (found, count, token) = (found.clone(), screening.clone(), token.map(str::to_owned));
        let a = addr.to_string();
        let spawned = std::thread::Builder::new()
            .name("migrate-screen".into())
            .spawn(move || {
                screen(candidate, token.as_deref(), &found, &a);
                count.fetch_sub(1, Ordering::AcqRel);
            });
        if spawned.is_err() {
            screening.fetch_sub(1, Ordering::AcqRel);
        }
    };
    drop(listener);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    if d.snapshot_version != SNAPSHOT_VERSION {
        let e = MigrationError::Incompatible(format!(
            "snapshot version {} (this vmm reads {SNAPSHOT_VERSION})",
            d.snapshot_version
        ));
        return Err(fail(&mut stream, e));
    }
    Ok((stream, d))
}

/// Reads the description `stream` opens with: passes it on to `found` when it carries
/// `token`, else tells the connection why and closes it.
fn screen(
    mut stream: Stream,
    token: Option<&str>,
    found: &std::sync::mpsc::Sender<(Stream, VmDescription)>,
    addr: &str,
) {
    let _ = stream.set_read_timeout(Some(FIRST_MESSAGE_WAIT));
    let _ = stream.set_write_timeout(Some(FIRST_MESSAGE_WAIT));
    match description(&mut stream, token) {
        Ok(d) => {
            let _ = found.send((stream, d));
        }
        Err(e) => {
            tracing::warn!(%addr, error = %e, "closed a connection that is not the VM's source; still waiting for it");
            let _ = fail(&mut stream, e);
        }
    }
}

/// The description a connection opens with, if it carries `token`.
fn description(stream: &mut Stream, token: Option<&str>) -> Result<VmDescription, MigrationError> {
    let mut buf = Vec::new();
    let d = match read_message(stream, &mut buf)? {
        Message::Describe(d) => d,
        m => {
            return Err(WireError::Unexpected {
                want: "Describe",
                got: m.kind(),
            }
            .into())
        }
    };
    if let Some(want) = token {
        let given = d.token.as_deref().unwrap_or("").as_bytes();
        let same = given.len() == want.len()
            && given
                .iter()
                .zip(want.as_bytes())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0;
        if !same {
            return Err(MigrationError::Incompatible(
                "the source presented a wrong token".into(),
            ));
        }
    }
    Ok(d)
}

/// Tells the source why, best effort, and passes the error on.
pub fn fail(stream: &mut Stream, e: MigrationError) -> MigrationError {
    let _ = write_error(stream, &e.to_string());
    e
}

/// Receives RAM and state into `vm` (built empty from the description), restores it,
/// confirms, and returns once the source committed: `vm` may then run.
pub fn receive(stream: &mut Stream, vm: &mut Vm) -> Result<(), MigrationError> {
    match receive_inner(stream, vm) {
        Ok(()) => Ok(()),
        Err(e @ MigrationError::Wire(WireError::Peer(_))) => Err(e),
        Err(e) => Err(fail(stream, e)),
    }
}

fn receive_inner(stream: &mut Stream, vm: &mut Vm) -> Result<(), MigrationError> {
    let mut buf = Vec::new();
    let snapshot = loop {
        match read_message(stream, &mut buf)? {
            Message::Ram { gpa, data } => apply_ram(&vm.handles().mem, gpa, data)?,
            Message::State(s) => break s,
            Message::Error(e) => return Err(WireError::Peer(e).into()),
            m => {
                return Err(WireError::Unexpected {
                    want: "Ram or State",
                    got: m.kind(),
                }
                .into())
            }
        }
    };
    restore(vm, &snapshot)?;
    write_message(stream, Kind::Ready, &[])?;
    match read_message(stream, &mut buf)? {
        Message::Commit => Ok(()),
        Message::Error(e) => Err(WireError::Peer(e).into()),
        m => Err(WireError::Unexpected {
            want: "Commit",
            got: m.kind(),
        }
        .into()),
    }
}

/// Restores everything but RAM into a VM that has not run.
pub fn restore(vm: &mut Vm, s: &VmSnapshot) -> Result<(), MigrationError> {
    if s.version != SNAPSHOT_VERSION {
        return Err(MigrationError::Incompatible(format!(
            "snapshot version {} (this vmm reads {SNAPSHOT_VERSION})",
            s.version
        )));
    }
    let h = vm.handles().clone();
    if s.vcpus.len() != vm.vcpu_fds().len() {
        return Err(vcpu_state::StateError::VcpuCount {
            got: s.vcpus.len(),
            want: vm.vcpu_fds().len(),
        }
        .into());
    }
    if s.devices.len() != h.transports.len() {
        return Err(MigrationError::Incompatible(format!(
            "{} vGPU devices in the stream, {} given here with --vgpu",
            s.devices.len(),
            h.transports.len()
        )));
    }
    vcpu_state::restore_vm(&h.vm, &s.kvm)?;
    for (fd, state) in vm.vcpu_fds().iter().zip(&s.vcpus) {
        vcpu_state::restore_vcpu(fd, state)?;
    }
    vm.set_start_parked(s.vcpus.iter().map(|v| v.parked).collect());
    lock(&h.serial)
        .restore(&(&s.serial).into())
        .map_err(|e| MigrationError::Device(e.to_string()))?;
    for (t, d) in h.transports.iter().zip(&s.devices) {
        lock(t)
            .restore(&d.transport, &d.vrings)
            .map_err(|e| MigrationError::Device(e.to_string()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::migration::wire::write_json;

    fn describe(token: Option<&str>) -> VmDescription {
        VmDescription {
            snapshot_version: SNAPSHOT_VERSION,
            memory: 64 << 20,
            vcpus: 1,
            vgpus: 1,
            linux: false,
            cpu_profile: "host".into(),
            token: token.map(str::to_owned),
        }
    }

    /// Another local user connects to the destination's port before the source: a
    /// connection that says nothing, one with garbage and one with a wrong token are
    /// closed, and the source with the right token still gets in.
    #[test]
    fn connections_without_the_token_do_not_end_the_wait() {
        let path = std::env::temp_dir().join(format!("vmm-dest-test-{}.sock", std::process::id()));
        let addr = Address::Unix(path.clone());
        let a = addr.clone();
        let waiting = std::thread::spawn(move || accept(&a, Some("the-right-token")));
        let connect = || loop {
            match Stream::connect(&addr) {
                Ok(s) => return s,
                Err(_) => std::thread::sleep(Duration::from_millis(10)),
            }
        };
        // Says nothing and hangs up; another says nothing and stays.
        drop(connect());
        let _silent = connect();
        // Garbage.
        let mut s = connect();
        let _ = std::io::Write::write_all(&mut s, &[0xff; 64]);
        drop(s);
        // A description with a wrong token: told why.
        let mut s = connect();
        write_json(&mut s, Kind::Describe, &describe(Some("a-guessed-token"))).expect("write");
        let mut buf = Vec::new();
        match read_message(&mut s, &mut buf) {
            Ok(Message::Error(e)) => assert!(e.contains("wrong token"), "{e}"),
            other => panic!("the impostor got {other:?}"),
        }
        drop(s);
        assert!(!waiting.is_finished(), "the wait ended on an impostor");
        // The source, not held up by the silent one.
        let t0 = std::time::Instant::now();
        let mut s = connect();
        write_json(&mut s, Kind::Describe, &describe(Some("the-right-token"))).expect("write");
        let (_, d) = waiting.join().expect("thread").expect("the source got in");
        assert!(
            t0.elapsed() < FIRST_MESSAGE_WAIT,
            "held up {:?}",
            t0.elapsed()
        );
        assert_eq!(d.token.as_deref(), Some("the-right-token"));
        assert!(
            !path.exists(),
            "the listener is closed once the source is in"
        );
    }
}
