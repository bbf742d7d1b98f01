//! The Rust program of the GPU machine's `cuda-programs` step (ci/gpu/suite.sh): cudarc's
//! driver API loads a PTX vector add, runs it and checks every element, with whatever
//! libcuda the loader finds: the real driver (natively) or the vGPU library (the step sets
//! `LD_LIBRARY_PATH` to it and `VGPU_SOCKET` to a cuda worker). Ignored in `cargo test`:
//! it needs a GPU behind whichever library it gets.

use std::ffi::{c_void, CString};

use cudarc::driver::{result, CudaContext, DevicePtr};

/// `vecadd(a, b, c, n)`: `c[i] = a[i] + b[i]` for `i < n`.
const VECADD_PTX: &str = r#"
.version 7.8
.target sm_90
.address_size 64
.visible .entry vecadd(.param .u64 a, .param .u64 b, .param .u64 c, .param .u32 n)
{
    .reg .pred %p;
    .reg .b32 %r<5>;
    .reg .f32 %f<4>;
    .reg .b64 %d<10>;
    ld.param.u64 %d0, [a];
    ld.param.u64 %d1, [b];
    ld.param.u64 %d2, [c];
    ld.param.u32 %r4, [n];
    mov.u32 %r0, %ctaid.x;
    mov.u32 %r1, %ntid.x;
    mov.u32 %r2, %tid.x;
    mad.lo.u32 %r3, %r0, %r1, %r2;
    setp.ge.u32 %p, %r3, %r4;
    @%p bra DONE;
    mul.wide.u32 %d3, %r3, 4;
    cvta.to.global.u64 %d4, %d0;
    cvta.to.global.u64 %d5, %d1;
    cvta.to.global.u64 %d6, %d2;
    add.u64 %d7, %d4, %d3;
    add.u64 %d8, %d5, %d3;
    add.u64 %d9, %d6, %d3;
    ld.global.f32 %f0, [%d7];
    ld.global.f32 %f1, [%d8];
    add.rn.f32 %f2, %f0, %f1;
    st.global.f32 [%d9], %f2;
DONE:
    ret;
}
"#;

#[test]
#[ignore = "needs a CUDA GPU (natively, or behind a cuda vgpu-worker): ci/gpu/suite.sh cuda-programs"]
fn cudarc_vecadd_from_ptx() {
    let ctx = CudaContext::new(0).expect("context");
    let stream = ctx.new_stream().expect("stream");
    let n = 1usize << 20;
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 0.5 * i as f32).collect();
    let a = stream.clone_htod(&ha).expect("a");
    let b = stream.clone_htod(&hb).expect("b");
    let c = stream.alloc_zeros::<f32>(n).expect("c");
    let image = CString::new(VECADD_PTX).expect("ptx");
    // SAFETY: NUL-terminated PTX text; the module outlives the launch below.
    let module = unsafe { result::module::load_data(image.as_ptr().cast()) }.expect("module");
    let name = CString::new("vecadd").expect("name");
    // SAFETY: a live module.
    let f = unsafe { result::module::get_function(module, name) }.expect("function");
    let (pa, ga) = a.device_ptr(&stream);
    let (pb, gb) = b.device_ptr(&stream);
    let (pc, gc) = c.device_ptr(&stream);
    let (mut pa, mut pb, mut pc, mut n32) = (pa, pb, pc, n as u32);
    let mut params: [*mut c_void; 4] = [
        (&mut pa as *mut u64).cast(),
        (&mut pb as *mut u64).cast(),
        (&mut pc as *mut u64).cast(),
        (&mut n32 as *mut u32).cast(),
    ];
    // SAFETY: vecadd's four parameters, each pointing to a live value of its type.
    unsafe {
        result::launch_kernel(
            f,
            (n.div_ceil(256) as u32, 1, 1),
            (256, 1, 1),
            0,
            stream.cu_stream(),
            &mut params,
        )
    }
    .expect("launch");
    drop((ga, gb, gc));
    let out = stream.clone_dtoh(&c).expect("dtoh");
    for (i, v) in out.iter().enumerate() {
        assert_eq!(*v, 1.5 * i as f32, "element {i}");
    }
    // SAFETY: no launch uses the module any more (the copy above synchronised).
    unsafe { result::module::unload(module) }.expect("unload");
    println!("VECADD OK cudarc n={n}");
}
