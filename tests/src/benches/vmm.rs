//! The VMM core's figures, each beside its anchor from the same run: how long
//! the vmm takes from start to the payload's `main`, and the vhost-user doorbell round trip,
//! both against the raw cost of one KVM exit to userspace.

use crate::bench::{bench_value, median, Figure, VM_DEADLINE};
use crate::bins::payload;
use crate::echo::EchoServer;
use crate::run::run_payload;

/// Runs the VMM figures; `runs` VM starts are timed.
pub fn run(runs: usize) -> Vec<Figure> {
    if !crate::bins::have_kvm() {
        eprintln!("vgpu-bench vmm: /dev/kvm is not available; nothing to measure");
        std::process::exit(2);
    }

    // Anchor: one KVM exit to userspace (a port write the vmm answers).
    let exits = run_payload(
        &payload("kvm-exits"),
        &["--payload-arg", "n=200000"],
        VM_DEADLINE,
    );
    let exit_ns =
        bench_value(&exits, "kvm_exit_cost").unwrap_or_else(|| fail("kvm-exits", &exits.stdout));

    // vmm start to the payload's main (first port I/O), median of `runs`.
    let hello = payload("hello");
    let starts: Vec<f64> = (0..runs)
        .map(|_| {
            let out = run_payload(&hello, &["--timing"], VM_DEADLINE);
            out.stderr
                .lines()
                .find_map(|l| l.strip_prefix("vmm-timing: first_guest_io_us="))
                .and_then(|v| v.trim().parse::<f64>().ok())
                .unwrap_or_else(|| fail("hello --timing", &out.stderr))
                / 1000.0
        })
        .collect();

    // vhost-user doorbell round trip: guest kick, echo backend completes, guest sees the
    // used ring.
    let dir = std::env::temp_dir().join(format!("vgpu-bench-vmm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let sock = dir.join("echo.sock");
    let server = EchoServer::start(&sock).expect("echo backend");
    let arg = format!("socket={}", sock.display());
    let echo = run_payload(
        &payload("vhost-echo"),
        &["--vgpu", &arg, "--payload-arg", "iters=20000"],
        VM_DEADLINE,
    );
    let rt_ns =
        bench_value(&echo, "vhost_roundtrip").unwrap_or_else(|| fail("vhost-echo", &echo.stdout));
    server.join();
    let _ = std::fs::remove_dir_all(&dir);

    vec![
        Figure {
            name: "vmm start to payload main".into(),
            value: median(starts),
            unit: "ms".into(),
            anchor_name: "one KVM exit".into(),
            anchor: exit_ns / 1e6,
            anchor_unit: "ms".into(),
        },
        Figure {
            name: "vhost-user doorbell round trip".into(),
            value: rt_ns / 1000.0,
            unit: "us".into(),
            anchor_name: "one KVM exit".into(),
            anchor: exit_ns / 1000.0,
            anchor_unit: "us".into(),
        },
    ]
}

fn fail(what: &str, output: &str) -> ! {
    eprintln!("vgpu-bench vmm: {what} printed no figure:\n{output}");
    std::process::exit(1);
}
