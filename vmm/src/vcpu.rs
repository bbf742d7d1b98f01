//! vCPU threads: each runs KVM_RUN and dispatches port and MMIO exits to the buses.

use std::os::unix::thread::JoinHandleExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use kvm_bindings::{kvm_fpu, kvm_mp_state, CpuId, KVM_MAX_CPUID_ENTRIES, KVM_MP_STATE_RUNNABLE};
use kvm_ioctls::{VcpuExit, VcpuFd, VmFd};
use vm_memory::{Bytes, GuestAddress, GuestMemoryMmap};

use crate::arch::{assist, cpuid, regs};
use crate::cpuid_profile::CpuProfile;
use crate::devices::bus::Bus;
use crate::devices::legacy::ExitState;
use crate::idle::IdleWake;
use crate::layout;
use crate::vcpu_control::VcpuControl;

/// Exit code the vmm uses when the guest crashed (triple fault, failed entry, internal
/// error); documented in docs/payload-abi.md.
pub const GUEST_CRASH_EXIT: i32 = 125;

/// Why a vCPU could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum VcpuError {
    #[error("cannot create vCPU {0}: {1}")]
    Create(u8, kvm_ioctls::Error),
    #[error("cannot configure vCPU {0} ({1}): {2}")]
    Configure(u8, &'static str, kvm_ioctls::Error),
    #[error("cannot start the thread of vCPU {0}: {1}")]
    Spawn(u8, std::io::Error),
}

/// Everything a vCPU thread shares with the rest of the VM.
pub struct VcpuContext {
    pub pio: Arc<Bus>,
    pub mmio: Arc<Bus>,
    pub exit: Arc<ExitState>,
    pub stop: Arc<AtomicBool>,
    /// Guest RAM, to show the instruction bytes at a crash.
    pub mem: GuestMemoryMmap,
    /// Finish `int3`/`int n` the emulator refuses (Linux guests; see arch/assist.rs).
    pub assist_software_interrupts: bool,
    /// Pause and resume requests (migration).
    pub control: Arc<VcpuControl>,
    /// The vCPU starts parked (it had parked itself before a migration).
    pub start_parked: bool,
    /// Ends an idle early when a device interrupts (the idle port).
    pub idle: Arc<IdleWake>,
}

/// How a vCPU starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Entry {
    /// A payload: every vCPU at `rip` in ring 3 (docs/payload-abi.md).
    Payload { rip: u64, cr3: u64 },
    /// A Linux kernel: the boot vCPU at `rip` in ring 0 with `rsi` = the zero page; the
    /// others wait for INIT/SIPI from the kernel.
    Linux { rip: u64, cr3: u64, zero_page: u64 },
}

/// Creates and configures vCPU `index` of `count`.
pub fn create(
    vm: &VmFd,
    supported: &CpuId,
    index: u8,
    count: u8,
    entry: Entry,
    profile: CpuProfile,
) -> Result<VcpuFd, VcpuError> {
    let vcpu = vm
        .create_vcpu(u64::from(index))
        .map_err(|e| VcpuError::Create(index, e))?;
    let cfg = |what| move |e| VcpuError::Configure(index, what, e);
    let cpuid = profile.apply(cpuid::for_vcpu(supported.clone(), index, count));
    vcpu.set_cpuid2(&cpuid).map_err(cfg("cpuid"))?;
    if let Ok(back) = vcpu.get_cpuid2(KVM_MAX_CPUID_ENTRIES) {
        // Some KVMs (kvm_pvm) keep their own idea of the guest's CPUID: say what stuck.
        let leaf = |c: &CpuId, f: u32| {
            c.as_slice()
                .iter()
                .find(|e| e.function == f && e.index == 0)
                .map_or(0, |e| e.ecx)
        };
        tracing::debug!(
            vcpu = index,
            ?profile,
            set_leaf1_ecx = format_args!("{:#x}", leaf(&cpuid, 1)),
            kvm_leaf1_ecx = format_args!("{:#x}", leaf(&back, 1)),
            set_entries = cpuid.as_slice().len(),
            kvm_entries = back.as_slice().len(),
            "CPUID set and as KVM reports it back"
        );
    }
    let fpu = kvm_fpu {
        fcw: 0x37f,
        mxcsr: 0x1f80,
        ..Default::default()
    };
    match entry {
        Entry::Payload { rip, cr3 } => {
            let sregs = vcpu.get_sregs().map_err(cfg("get sregs"))?;
            vcpu.set_sregs(&regs::long_mode_sregs(sregs, cr3))
                .map_err(cfg("sregs"))?;
            vcpu.set_regs(&regs::entry_regs(rip, index))
                .map_err(cfg("regs"))?;
            vcpu.set_fpu(&fpu).map_err(cfg("fpu"))?;
            // With the in-kernel irqchip, application processors wait for INIT/SIPI;
            // payloads have no APIC code, so every vCPU starts at the entry point at once.
            vcpu.set_mp_state(kvm_mp_state {
                mp_state: KVM_MP_STATE_RUNNABLE,
            })
            .map_err(cfg("mp state"))?;
        }
        Entry::Linux { .. } if index > 0 => {
            // Application processors stay in wait-for-SIPI, as on a real machine.
        }
        Entry::Linux {
            rip,
            cr3,
            zero_page,
        } => {
            let sregs = vcpu.get_sregs().map_err(cfg("get sregs"))?;
            vcpu.set_sregs(&regs::linux_sregs(sregs, cr3))
                .map_err(cfg("sregs"))?;
            vcpu.set_regs(&regs::linux_regs(
                rip,
                zero_page,
                crate::boot::linux::BOOT_STACK,
            ))
            .map_err(cfg("regs"))?;
            vcpu.set_fpu(&fpu).map_err(cfg("fpu"))?;
        }
    }
    Ok(vcpu)
}

/// Starts the thread of vCPU `index`.
pub fn spawn(mut vcpu: VcpuFd, index: u8, ctx: VcpuContext) -> Result<JoinHandle<()>, VcpuError> {
    let control = ctx.control.clone();
    let handle = std::thread::Builder::new()
        .name(format!("vcpu{index}"))
        .spawn(move || {
            run(&mut vcpu, index, &ctx);
            ctx.control.exited(usize::from(index));
        })
        .map_err(|e| VcpuError::Spawn(index, e))?;
    control.register_thread(usize::from(index), handle.as_pthread_t());
    Ok(handle)
}

/// A parked vCPU: it stays out of KVM until the VM ends, saving its state at each pause.
fn park(vcpu: &mut VcpuFd, index: u8, ctx: &VcpuContext) {
    tracing::debug!(vcpu = index, "vCPU parked");
    while !ctx.stop.load(Ordering::SeqCst) && !ctx.control.stopping() {
        if ctx.control.pause_requested() && !ctx.control.pause_point(vcpu, usize::from(index), true)
        {
            return;
        }
        // The kick signal that stops the VM also cuts this wait short.
        ctx.control.idle_wait(Duration::from_millis(50));
    }
}

/// What a vCPU thread does after an exit.
enum Next {
    Run,
    /// The vCPU parked itself (port 0xF5): it stops until the VM ends.
    Park,
    /// The VM ends with this exit code.
    End(i32),
}

fn run(vcpu: &mut VcpuFd, index: u8, ctx: &VcpuContext) {
    if ctx.start_parked {
        park(vcpu, index, ctx);
        return;
    }
    loop {
        if ctx.stop.load(Ordering::SeqCst) {
            return;
        }
        if ctx.control.pause_requested()
            && !ctx.control.pause_point(vcpu, usize::from(index), false)
        {
            return;
        }
        // Noted before the guest runs: an interrupt after this may be for a completion the
        // guest has not seen when it asks to idle.
        let idle_since = ctx.idle.generation();
        match vcpu.run() {
            Ok(VcpuExit::InternalError) => {
                // SAFETY: the vCPU just exited with KVM_EXIT_INTERNAL_ERROR, so `internal`
                // is the active member of the exit union.
                let suberror = unsafe { vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
                if ctx.assist_software_interrupts
                    && assist::complete_software_interrupt(vcpu, suberror, &ctx.mem)
                {
                    continue;
                }
                eprintln!("vmm: KVM internal error on vCPU {index} (an instruction the nested KVM cannot emulate?)");
                report_internal_error(vcpu, index, &ctx.mem);
                ctx.exit.request(GUEST_CRASH_EXIT);
                return;
            }
            Ok(exit) => match handle_exit(exit, index, ctx, idle_since) {
                Next::Run => {}
                Next::Park => {
                    park(vcpu, index, ctx);
                    return;
                }
                Next::End(code) => {
                    if code == GUEST_CRASH_EXIT {
                        report_crash_state(vcpu, index, &ctx.mem);
                    }
                    ctx.exit.request(code);
                    return;
                }
            },
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => {}
            Err(e) => {
                tracing::error!(vcpu = index, "KVM_RUN failed: {e}");
                ctx.exit.request(GUEST_CRASH_EXIT);
                return;
            }
        }
    }
}

/// Up to 16 instruction bytes at the guest's `rip`, through the guest's page tables.
fn code_bytes(vcpu: &VcpuFd, rip: u64, mem: &GuestMemoryMmap) -> Option<Vec<u8>> {
    let t = vcpu.translate_gva(rip).ok()?;
    if t.valid == 0 {
        return None;
    }
    // Stop at the end of the page: the next one may not be contiguous.
    let n = (0x1000 - (t.physical_address & 0xfff) as usize).min(16);
    let mut bytes = vec![0u8; n];
    mem.read_slice(&mut bytes, GuestAddress(t.physical_address))
        .ok()?;
    Some(bytes)
}

/// Prints where a crashed vCPU stood (rip, its code bytes, control registers).
fn report_crash_state(vcpu: &VcpuFd, index: u8, mem: &GuestMemoryMmap) {
    let regs = vcpu.get_regs().unwrap_or_default();
    let sregs = vcpu.get_sregs().unwrap_or_default();
    eprintln!(
        "vmm: vCPU {index} at rip {:#x} (cpl {}), code {:02x?}, cr0 {:#x} cr3 {:#x} cr4 {:#x} efer {:#x}",
        regs.rip,
        sregs.cs.dpl,
        code_bytes(vcpu, regs.rip, mem).unwrap_or_default(),
        sregs.cr0,
        sregs.cr3,
        sregs.cr4,
        sregs.efer
    );
}

/// Says what KVM could not do, with the guest's instruction pointer, so a crash report is
/// actionable.
fn report_internal_error(vcpu: &mut VcpuFd, index: u8, mem: &GuestMemoryMmap) {
    report_crash_state(vcpu, index, mem);
    let regs = vcpu.get_regs().unwrap_or_default();
    let rip = regs.rip;
    let sregs = vcpu.get_sregs().unwrap_or_default();
    tracing::error!(
        ?regs,
        cr0 = sregs.cr0,
        cr4 = sregs.cr4,
        efer = sregs.efer,
        "registers at the internal error"
    );
    let run = vcpu.get_kvm_run();
    // SAFETY: the vCPU just exited with KVM_EXIT_INTERNAL_ERROR, so `internal` is the
    // active member of the exit union.
    let internal = unsafe { run.__bindgen_anon_1.internal };
    let n = (internal.ndata as usize).min(internal.data.len());
    eprintln!(
        "vmm: vCPU {index} KVM internal error: suberror {} at rip {rip:#x}, data {:x?}",
        internal.suberror,
        &internal.data[..n]
    );
}

/// Handles one exit.
fn handle_exit(exit: VcpuExit<'_>, index: u8, ctx: &VcpuContext, idle_since: u64) -> Next {
    match exit {
        VcpuExit::IoOut(layout::PARK_PORT, _) => Next::Park,
        VcpuExit::IoOut(layout::IDLE_PORT, data) => {
            let mut v = [0u8; 4];
            let n = data.len().min(4);
            v[..n].copy_from_slice(&data[..n]);
            let us = u32::from_le_bytes(v).min(layout::IDLE_MAX_US);
            ctx.idle
                .wait(idle_since, Duration::from_micros(u64::from(us)));
            Next::Run
        }
        VcpuExit::IoOut(port, data) => {
            ctx.exit.note_io();
            if !ctx.pio.write(u64::from(port), data) {
                tracing::debug!(port, "write to an empty port");
            }
            Next::Run
        }
        VcpuExit::IoIn(port, data) => {
            ctx.exit.note_io();
            if !ctx.pio.read(u64::from(port), data) {
                data.fill(0xff);
            }
            Next::Run
        }
        VcpuExit::MmioRead(addr, data) => {
            if !ctx.mmio.read(addr, data) {
                tracing::debug!(addr, "read of unmapped MMIO");
                data.fill(0xff);
            }
            Next::Run
        }
        VcpuExit::MmioWrite(addr, data) => {
            if !ctx.mmio.write(addr, data) {
                tracing::debug!(addr, "write to unmapped MMIO");
            }
            Next::Run
        }
        VcpuExit::Hlt => {
            // With the in-kernel irqchip HLT stays in KVM; without one, park politely.
            std::thread::sleep(Duration::from_millis(1));
            Next::Run
        }
        VcpuExit::Intr => Next::Run,
        VcpuExit::Shutdown => {
            tracing::error!(vcpu = index, "the guest triple-faulted; stopping the VM");
            eprintln!("vmm: guest crashed (triple fault on vCPU {index})");
            Next::End(GUEST_CRASH_EXIT)
        }
        VcpuExit::FailEntry(reason, cpu) => {
            eprintln!("vmm: KVM could not enter vCPU {index} (reason {reason:#x}, cpu {cpu})");
            Next::End(GUEST_CRASH_EXIT)
        }
        VcpuExit::InternalError => {
            eprintln!("vmm: KVM internal error on vCPU {index} (an instruction the nested KVM cannot emulate?)");
            Next::End(GUEST_CRASH_EXIT)
        }
        VcpuExit::SystemEvent(kind, _) => {
            tracing::info!(vcpu = index, kind, "guest system event");
            Next::End(0)
        }
        other => {
            eprintln!("vmm: unexpected exit on vCPU {index}: {other:?}");
            Next::End(GUEST_CRASH_EXIT)
        }
    }
}

/// Checks the vCPU count against the layout.
pub fn check_count(n: u8) -> bool {
    (1..=layout::MAX_VCPUS).contains(&n)
}
