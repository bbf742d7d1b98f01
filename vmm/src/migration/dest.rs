//! The destination side: accept one incoming VM, check its description, fill its RAM,
//! restore every vCPU and device, confirm, and wait for the source's commit.

use std::time::Duration;

use super::channel::{Address, Listener, Stream};
use super::snapshot::{VmDescription, VmSnapshot, SNAPSHOT_VERSION};
use super::wire::{apply_ram, read_message, write_error, write_message, Kind, Message, WireError};
use super::{vcpu_state, MigrationError};
use crate::devices::bus::lock;
use crate::vm::Vm;

/// How long the destination waits for the next message of a started migration.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Waits on `addr` for a source and reads the VM's description.
pub fn accept(
    addr: &Address,
    token: Option<&str>,
) -> Result<(Stream, VmDescription), MigrationError> {
    let listener = Listener::bind(addr).map_err(|source| MigrationError::Listen {
        addr: addr.to_string(),
        source,
    })?;
    tracing::info!(%addr, "waiting for an incoming VM");
    let mut stream = listener.accept().map_err(|source| MigrationError::Listen {
        addr: addr.to_string(),
        source,
    })?;
    drop(listener);
    let _ = stream.set_read_timeout(Some(IO_TIMEOUT));
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let mut buf = Vec::new();
    let d = match read_message(&mut stream, &mut buf) {
        Ok(Message::Describe(d)) => d,
        Ok(m) => {
            return Err(fail(
                &mut stream,
                WireError::Unexpected {
                    want: "Describe",
                    got: m.kind(),
                }
                .into(),
            ))
        }
        Err(e) => return Err(fail(&mut stream, e.into())),
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
            let e = MigrationError::Incompatible("the source presented a wrong token".into());
            return Err(fail(&mut stream, e));
        }
    }
    if d.snapshot_version != SNAPSHOT_VERSION {
        let e = MigrationError::Incompatible(format!(
            "snapshot version {} (this vmm reads {SNAPSHOT_VERSION})",
            d.snapshot_version
        ));
        return Err(fail(&mut stream, e));
    }
    Ok((stream, d))
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
