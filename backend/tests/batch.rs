//! `Backend::launch` of several launches on the sim backend and, where a CUDA GPU is present, on the cuda
//! backend (otherwise `SKIPPED (cuda): why`; with `VGPU_REQUIRE_CUDA=1` a missing GPU fails
//! instead): results in order, a failing item failing alone, built-ins that cannot join a
//! batch running alone in its place, guest functions batched with their own device times
//! (and the time per launch beside lone launches), and a kernel that loses the context
//! failing the later items. The context loss runs in a child process (this test binary
//! again): the tests of one process share the GPU's primary context.

use std::time::Instant;

use vgpu_backend::{Backend, BackendError, Launch, LaunchOne, LaunchStats, ModuleImage};
use vgpu_proto::{ArgValue, Status};
use vm_memory::VolatileSlice;

mod common;
use common::*;

fn put_words(b: &dyn Backend, addr: u64, v: &[u32]) {
    let mut buf: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
    b.copy_htod(addr, &VolatileSlice::from(&mut buf[..]))
        .expect("htod");
}

fn get_words(b: &dyn Backend, addr: u64, n: usize) -> Vec<u32> {
    let mut buf = vec![0u8; n * 4];
    b.copy_dtoh(addr, &VolatileSlice::from(&mut buf[..]))
        .expect("dtoh");
    buf.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

fn item(function: u64, args: &[ArgValue]) -> Launch<'_> {
    Launch {
        function,
        config: CFG,
        cluster: vgpu_backend::NO_CLUSTER,
        args,
        blob: &[],
    }
}

fn statuses(results: &[Result<LaunchStats, BackendError>]) -> Vec<Status> {
    results
        .iter()
        .map(|r| r.as_ref().map_or_else(|e| e.status(), |_| Status::Ok))
        .collect()
}

#[test]
fn a_batch_runs_in_order_and_times_each_kernel() {
    each(64 * MIB, |name, b| {
        let n = 4096u32;
        let bytes = u64::from(n) * 4;
        let [a, x, c, d, out] = [0; 5].map(|_| b.alloc(bytes).expect("alloc").addr);
        let xs: Vec<u32> = (0..n).map(|i| (i as f32).to_bits()).collect();
        put_words(b, x, &xs);
        let (fill, add) = (builtin(b, "fill"), builtin(b, "vector_add"));
        let (reduce, spin) = (builtin(b, "reduce_sum"), builtin(b, "spin"));
        let len = ArgValue::U32(n);
        let one = [w(a), ArgValue::U32(1f32.to_bits()), len];
        let add_c = [r(a), r(x), w(c), len];
        let two = [w(a), ArgValue::U32(2f32.to_bits()), len];
        // reduce_sum cannot join a cuda batch (it takes the lane's scratch): it runs alone
        // between the two halves, in its place.
        let sum_c = [r(c), w(out), len];
        let add_d = [r(a), r(x), w(d), len];
        let wait = [ArgValue::U32(200)];
        let items = [
            item(fill, &one),
            item(add, &add_c),
            item(fill, &two),
            item(reduce, &sum_c),
            item(add, &add_d),
            item(spin, &wait),
        ];
        let results = b.launch(&items);
        assert_eq!(statuses(&results), vec![Status::Ok; 6], "{name}");
        for (i, r) in results.iter().enumerate() {
            let ns = r.as_ref().expect("ok").device_ns;
            // On cuda the small fill after vector_add rides along with its run: its time is
            // counted in vector_add's, none of its own.
            if name == "cuda" && i == 2 {
                assert_eq!(ns, 0, "{name}: item 2 rides along with item 1");
            } else {
                assert!(ns > 0, "{name}: item {i} has a device time");
            }
        }
        let spun = results[5].as_ref().expect("spin").device_ns;
        assert!(spun >= 150_000, "{name}: spin 200 us took {spun} ns");
        let cs = get_words(b, c, n as usize);
        let ds = get_words(b, d, n as usize);
        for i in 0..n as usize {
            assert_eq!(cs[i], (i as f32 + 1.0).to_bits(), "{name}: c[{i}]");
            assert_eq!(ds[i], (i as f32 + 2.0).to_bits(), "{name}: d[{i}]");
        }
        let total: f64 = (0..n).map(|i| f64::from(i) + 1.0).sum();
        assert_eq!(get_words(b, out, 1)[0], (total as f32).to_bits(), "{name}");
    });
}

#[test]
fn a_failing_item_fails_alone() {
    each(64 * MIB, |name, b| {
        let n = 256u32;
        let bytes = u64::from(n) * 4;
        let [a, src, idx, dst] = [0; 4].map(|_| b.alloc(bytes).expect("alloc").addr);
        put_words(b, idx, &[9]);
        let (fill, add, gather) = (
            builtin(b, "fill"),
            builtin(b, "vector_add"),
            builtin(b, "gather"),
        );
        let len = ArgValue::U32(n);
        let first = [w(a), ArgValue::U32(5), len];
        let outside = [w(0x10), ArgValue::U32(6), len];
        let short = [r(a), r(a), w(a)];
        // idx[0] = 9 is past src_len = 4: the kernel stops with a fault of its own.
        let past = [r(src), r(idx), w(dst), ArgValue::U32(1), ArgValue::U32(4)];
        let last = [w(a + 64), ArgValue::U32(7), ArgValue::U32(16)];
        let items = [
            item(fill, &first),
            item(fill, &outside),
            item(0xdead_0001, &first),
            item(add, &short),
            item(gather, &past),
            item(fill, &last),
        ];
        let results = b.launch(&items);
        assert_eq!(
            statuses(&results),
            vec![
                Status::Ok,
                Status::BadDevicePointer,
                Status::UnknownFunction,
                Status::BadArgCount,
                Status::KernelFault,
                Status::Ok
            ],
            "{name}"
        );
        let v = get_words(b, a, 32);
        assert!(v[..16].iter().all(|x| *x == 5), "{name}: {v:?}");
        assert!(v[16..].iter().all(|x| *x == 7), "{name}: {v:?}");
        // The backend still works.
        assert!(b.launch(&items[..1])[0].is_ok(), "{name}");
        assert!(b.launch(&[]).is_empty(), "{name}");
    });
}

const NOP_PTX: &str = r#"
.version 8.0
.target sm_90
.address_size 64
.visible .entry nop()
{
    ret;
}
.visible .entry poke(.param .u64 p)
{
    .reg .b64 %rd<2>;
    .reg .b32 %r<2>;
    ld.param.u64 %rd1, [p];
    mov.u32 %r1, 1;
    st.global.u32 [%rd1], %r1;
    ret;
}
"#;

/// The loaded module's `nop` and `poke` functions.
fn nop_and_poke(b: &dyn Backend) -> (u64, u64) {
    let m = b
        .modules()
        .module_load(ModuleImage::Ptx(NOP_PTX.as_bytes()))
        .expect("PTX module");
    (
        b.modules().get_function(m, b"nop").expect("nop").handle,
        b.modules().get_function(m, b"poke").expect("poke").handle,
    )
}

#[test]
fn guest_functions_run_as_one_batch_on_cuda() {
    if let Some(why) = cuda_skip() {
        eprintln!("SKIPPED (cuda): {why}");
        return;
    }
    let b = cuda(16 * MIB);
    let (nop, poke) = nop_and_poke(&b);
    let a = b.alloc(4096).expect("alloc").addr;
    let target = [ArgValue::U64(a)];
    let mut items: Vec<Launch<'_>> = (0..31).map(|_| item(nop, &[])).collect();
    items.insert(7, item(poke, &target));
    let results = b.launch(&items);
    assert_eq!(statuses(&results), vec![Status::Ok; 32]);
    assert_eq!(get_words(&b, a, 1)[0], 1, "the poke ran");
    // Time per launch: lone launches beside batches of 32, same kernel, same backend.
    let nops: Vec<Launch<'_>> = (0..32).map(|_| item(nop, &[])).collect();
    let rounds = 50;
    let t = Instant::now();
    for _ in 0..rounds * 32 {
        b.launch_one(nop, &CFG, &[]).expect("lone launch");
    }
    let lone = t.elapsed().as_secs_f64() * 1e6 / f64::from(rounds * 32);
    let t = Instant::now();
    for _ in 0..rounds {
        assert!(b.launch(&nops).iter().all(Result::is_ok));
    }
    let batched = t.elapsed().as_secs_f64() * 1e6 / f64::from(rounds * 32);
    println!(
        "backend_batched_null_launch: {batched:.2} us | anchor: {lone:.2} us (one launch each) | ratio: {:.3}",
        batched / lone
    );
    assert!(
        batched < lone * 0.9,
        "a batch of 32 costs {batched:.2} us a launch, lone launches {lone:.2} us"
    );
}

const CHILD: &str = "VGPU_BATCH_FAULT_CHILD";

#[test]
fn a_kernel_that_loses_the_context_fails_it_and_the_later_items() {
    if std::env::var_os(CHILD).is_some() {
        let b = cuda(16 * MIB);
        let (nop, poke) = nop_and_poke(&b);
        let fill = builtin(&b, "fill");
        let outside = [ArgValue::U64(0x10)];
        let a = b.alloc(4096).expect("alloc").addr;
        let zero = [w(a), ArgValue::U32(0), ArgValue::U32(16)];
        // The small fill rides along with the faulting poke's run and fails with it.
        let items = [
            item(nop, &[]),
            item(poke, &outside),
            item(fill, &zero),
            item(nop, &[]),
        ];
        for (i, s) in statuses(&b.launch(&items)).iter().enumerate() {
            println!("item {i}: {s:?}");
        }
        // Nothing is given back to a lost context: the process ends with it.
        std::mem::forget(b);
        return;
    }
    if let Some(why) = cuda_skip() {
        eprintln!("SKIPPED (cuda): {why}");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "a_kernel_that_loses_the_context_fails_it_and_the_later_items",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .expect("child");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("child: {text}{}", String::from_utf8_lossy(&out.stderr));
    let line = |i: usize| {
        // The test harness prints "test NAME ... " without a newline before the child's
        // first line: look for the item anywhere in a line.
        let key = format!("item {i}: ");
        text.lines()
            .find_map(|l| l.split_once(key.as_str()).map(|(_, v)| v.trim()))
            .unwrap_or("missing")
            .to_string()
    };
    let got = [line(0), line(1), line(2), line(3)];
    // Once the context is lost the driver cannot tell which queued kernel faulted: the
    // first not seen finished is answered KERNEL_FAULT, every later one DEVICE_ERROR.
    let fault = got.iter().position(|s| s == "KernelFault");
    assert!(matches!(fault, Some(0 | 1)), "{got:?}");
    assert!(
        got[..fault.unwrap_or(0)].iter().all(|s| s == "Ok"),
        "{got:?}"
    );
    assert_eq!(got[2], "DeviceError", "the fill after the poke: {got:?}");
    assert_eq!(got[3], "DeviceError", "{got:?}");
}
