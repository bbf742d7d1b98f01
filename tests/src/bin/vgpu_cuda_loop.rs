//! `vgpu-cuda-loop`: a CUDA driver-API program as a container would run it on a process
//! vGPU. It loads the vGPU library (`libcuda.so.1`, here the built `libvgpu_cuda.so`)
//! with `dlopen`, resolves every entry point through `cuGetProcAddress_v2` (as cuda-python
//! does), and runs a closed loop of built-in kernels for a while: per round `--spins`
//! `spin` kernels (round-robin on `--streams` streams) and a `vector_add` of two vectors uploaded once, whose result it reads
//! back and checks element by element (so the inputs must survive migrations too).
//!
//! With `--state 1` it also keeps state in a module variable, as frameworks' libraries
//! do: `counter` (8 bytes; the built-in module's where the device declares it, else a PTX
//! module's on a GPU), which each round reads back and checks, then advances with a copy
//! to the address `cuModuleGetGlobal` answered once at the start and, on a GPU, with a
//! kernel that increments it by name. A migration that lost the variable's value (or its
//! address) is a wrong result.
//!
//! It prints one line at the end and exits 0 when every result was right, 1 on a wrong
//! element, 3 when a CUDA call failed (the vGPU went away: the call's error name is
//! printed), 2 on bad usage.
//!
//! Usage: vgpu-cuda-loop LIBRARY [--secs S] [--spin-us U] [--spins K] [--streams S] [--n N]
//! [--state 0|1]
//! (`VGPU_SOCKET` names the vGPU's socket.)

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::process::ExitCode;
use std::ptr::null_mut;
use std::time::{Duration, Instant};

type R = c_uint;
type Ptr = *mut c_void;
type GetProc = unsafe extern "C" fn(*const c_char, *mut Ptr, c_int, u64, *mut c_int) -> R;
type Launch = unsafe extern "C" fn(
    Ptr,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    c_uint,
    Ptr,
    *mut Ptr,
    *mut Ptr,
) -> R;

/// Why the loop stopped early.
enum Stop {
    /// A CUDA call failed.
    Cuda(String),
    /// A wrong result.
    Wrong(String),
}

/// The loaded library's entry points.
struct Cuda {
    get_proc: GetProc,
}

impl Cuda {
    fn load(path: &str) -> Result<Self, String> {
        let c = CString::new(path).map_err(|_| "the library path has a NUL".to_owned())?;
        // SAFETY: `c` is a valid C string; dlopen has no other preconditions.
        let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
        if lib.is_null() {
            return Err(format!("cannot dlopen {path}"));
        }
        // SAFETY: `lib` is a live handle (never closed: the program keeps the library).
        let sym = unsafe { libc::dlsym(lib, c"cuGetProcAddress_v2".as_ptr()) };
        if sym.is_null() {
            return Err(format!("{path} has no cuGetProcAddress_v2"));
        }
        // SAFETY: cuGetProcAddress_v2 has exactly the GetProc C signature.
        let get_proc = unsafe { std::mem::transmute::<*mut c_void, GetProc>(sym) };
        Ok(Self { get_proc })
    }

    /// Entry point `name` (its CUDA 13.0 base name).
    fn sym(&self, name: &CStr) -> Result<Ptr, String> {
        let mut p: Ptr = null_mut();
        let mut status = -1;
        // SAFETY: a valid name and out pointers.
        let r = unsafe { (self.get_proc)(name.as_ptr(), &mut p, 13000, 0, &mut status) };
        if r != 0 || status != 0 || p.is_null() {
            return Err(format!("cuGetProcAddress({name:?}) answered {r}"));
        }
        Ok(p)
    }

    /// The CUDA error name of `r`.
    fn error_name(&self, r: R) -> String {
        let Ok(p) = self.sym(c"cuGetErrorName") else {
            return format!("error {r}");
        };
        // SAFETY: cuGetErrorName's C signature.
        let f: unsafe extern "C" fn(R, *mut *const c_char) -> R = unsafe { std::mem::transmute(p) };
        let mut s: *const c_char = std::ptr::null();
        // SAFETY: a valid out pointer; the library answers a static string.
        if unsafe { f(r, &mut s) } != 0 || s.is_null() {
            return format!("error {r}");
        }
        // SAFETY: a NUL-terminated static string from the library.
        let name = unsafe { CStr::from_ptr(s) }.to_string_lossy().into_owned();
        format!("{name} ({r})")
    }
}

/// Calls entry point `$name` as `fn($t...) -> R` with the arguments; a failure stops the
/// loop with the call's name and error.
macro_rules! cu {
    ($cuda:expr, $name:literal, fn($($t:ty),*) $(, $a:expr)*) => {{
        let p = $cuda.sym($name).map_err(Stop::Cuda)?;
        // SAFETY: `$name`'s C signature is the one named here.
        let f: unsafe extern "C" fn($($t),*) -> R = unsafe { std::mem::transmute(p) };
        // SAFETY: the arguments match that signature and outlive the call.
        let r = unsafe { f($($a),*) };
        if r != 0 {
            return Err(Stop::Cuda(format!("{:?} failed: {}", $name, $cuda.error_name(r))));
        }
    }};
}

/// The options.
struct Opts {
    library: String,
    secs: f64,
    spin_us: u64,
    spins: u32,
    streams: u32,
    n: usize,
    state: bool,
}

fn opts() -> Result<Opts, String> {
    let mut args = std::env::args().skip(1);
    let library = args.next().ok_or(
        "usage: vgpu-cuda-loop LIBRARY [--secs S] [--spin-us U] [--spins K] [--streams S] [--n N] [--state 0|1]",
    )?;
    let mut o = Opts {
        library,
        secs: 5.0,
        spin_us: 2000,
        spins: 4,
        streams: 1,
        n: 1 << 16,
        state: false,
    };
    while let Some(flag) = args.next() {
        let v = args.next().ok_or(format!("{flag} needs a value"))?;
        let bad = || format!("{flag} {v}: not a number");
        match flag.as_str() {
            "--secs" => o.secs = v.parse().map_err(|_| bad())?,
            "--spin-us" => o.spin_us = v.parse().map_err(|_| bad())?,
            "--spins" => o.spins = v.parse().map_err(|_| bad())?,
            "--streams" => o.streams = v.parse().map_err(|_| bad())?,
            "--n" => o.n = v.parse().map_err(|_| bad())?,
            "--state" => o.state = v.parse::<u8>().map_err(|_| bad())? != 0,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(o)
}

/// The loop; the number of rounds whose results were right.
fn run(cuda: &Cuda, o: &Opts, rounds: &mut u64) -> Result<(), Stop> {
    let n = o.n;
    let bytes = n * 4;
    cu!(cuda, c"cuInit", fn(c_uint), 0);
    let mut dev: c_int = 0;
    cu!(cuda, c"cuDeviceGet", fn(*mut c_int, c_int), &mut dev, 0);
    let mut ctx: Ptr = null_mut();
    cu!(
        cuda,
        c"cuCtxCreate",
        fn(*mut Ptr, Ptr, c_uint, c_int),
        &mut ctx,
        null_mut(),
        0,
        dev
    );
    let mut module: Ptr = null_mut();
    let image = c"vgpu:builtin";
    cu!(
        cuda,
        c"cuModuleLoadData",
        fn(*mut Ptr, *const c_void),
        &mut module,
        image.as_ptr().cast()
    );
    let (mut vadd, mut spin): (Ptr, Ptr) = (null_mut(), null_mut());
    cu!(
        cuda,
        c"cuModuleGetFunction",
        fn(*mut Ptr, Ptr, *const c_char),
        &mut vadd,
        module,
        c"vector_add".as_ptr()
    );
    cu!(
        cuda,
        c"cuModuleGetFunction",
        fn(*mut Ptr, Ptr, *const c_char),
        &mut spin,
        module,
        c"spin".as_ptr()
    );
    let (mut a, mut b, mut c) = (0u64, 0u64, 0u64);
    for d in [&mut a, &mut b, &mut c] {
        cu!(cuda, c"cuMemAlloc", fn(*mut u64, usize), d, bytes);
    }
    let ha: Vec<f32> = (0..n).map(|i| i as f32).collect();
    let hb: Vec<f32> = (0..n).map(|i| 0.5 * (i % 4096) as f32).collect();
    cu!(
        cuda,
        c"cuMemcpyHtoD",
        fn(u64, *const c_void, usize),
        a,
        ha.as_ptr().cast(),
        bytes
    );
    cu!(
        cuda,
        c"cuMemcpyHtoD",
        fn(u64, *const c_void, usize),
        b,
        hb.as_ptr().cast(),
        bytes
    );
    let launch: Launch = {
        let p = cuda.sym(c"cuLaunchKernel").map_err(Stop::Cuda)?;
        // SAFETY: cuLaunchKernel's C signature.
        unsafe { std::mem::transmute::<Ptr, Launch>(p) }
    };
    // The spins go round-robin on `--streams` streams (the vGPU's queues), so that some
    // are always waiting for the GPU.
    let mut streams: Vec<Ptr> = Vec::new();
    for _ in 0..o.streams {
        let mut s: Ptr = null_mut();
        cu!(cuda, c"cuStreamCreate", fn(*mut Ptr, c_uint), &mut s, 0);
        streams.push(s);
    }
    let go = |f: Ptr, grid: c_uint, stream: Ptr, params: *mut Ptr| -> Result<(), Stop> {
        // SAFETY: `params` points at the kernel's arguments, alive for the call.
        let r = unsafe { launch(f, grid, 1, 1, 256, 1, 1, 0, stream, params, null_mut()) };
        match r {
            0 => Ok(()),
            r => Err(Stop::Cuda(format!(
                "cuLaunchKernel failed: {}",
                cuda.error_name(r)
            ))),
        }
    };
    let mut state = if o.state {
        Some(State::new(cuda, module)?)
    } else {
        None
    };
    let mut hc = vec![0f32; n];
    let end = Instant::now() + Duration::from_secs_f64(o.secs);
    while Instant::now() < end {
        if let Some(st) = state.as_mut() {
            st.round(cuda, &go, *rounds)?;
        }
        let mut us = o.spin_us;
        for k in 0..o.spins as usize {
            let mut p: [Ptr; 1] = [(&mut us as *mut u64).cast()];
            let stream = streams.get(k % streams.len().max(1)).copied();
            go(spin, 1, stream.unwrap_or(null_mut()), p.as_mut_ptr())?;
        }
        cu!(cuda, c"cuCtxSynchronize", fn());
        cu!(cuda, c"cuMemsetD32", fn(u64, c_uint, usize), c, 0, n);
        let mut n64 = n as u64;
        let mut p: [Ptr; 4] = [
            (&mut a as *mut u64).cast(),
            (&mut b as *mut u64).cast(),
            (&mut c as *mut u64).cast(),
            (&mut n64 as *mut u64).cast(),
        ];
        let grid = c_uint::try_from(n.div_ceil(256)).unwrap_or(c_uint::MAX);
        go(vadd, grid, null_mut(), p.as_mut_ptr())?;
        cu!(cuda, c"cuCtxSynchronize", fn());
        cu!(
            cuda,
            c"cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            hc.as_mut_ptr().cast(),
            c,
            bytes
        );
        for i in 0..n {
            let want = ha[i] + hb[i];
            if hc[i] != want {
                return Err(Stop::Wrong(format!(
                    "element {i} is {}, want {want} (round {})",
                    hc[i],
                    *rounds + 1
                )));
            }
        }
        *rounds += 1;
    }
    Ok(())
}

/// A module with a `counter` variable and a kernel whose first thread increments it, for
/// a device that runs PTX.
const COUNTER_PTX: &CStr = c".version 7.8
.target sm_90
.address_size 64
.visible .global .align 8 .u64 counter;
.visible .entry bump()
{
    .reg .pred %p<1>;
    .reg .b32 %r<1>;
    .reg .b64 %d<2>;
    mov.u32 %r0, %tid.x;
    setp.ne.u32 %p0, %r0, 0;
    @%p0 bra DONE;
    ld.global.u64 %d0, [counter];
    add.u64 %d1, %d0, 1;
    st.global.u64 [counter], %d1;
DONE:
    ret;
}
";

/// State kept in a module variable (`--state 1`).
struct State {
    /// The variable's address, from `cuModuleGetGlobal` once.
    addr: u64,
    /// The kernel that increments it (a GPU's PTX module only).
    bump: Option<Ptr>,
    /// What the variable must hold now.
    want: u64,
}

impl State {
    fn new(cuda: &Cuda, builtin: Ptr) -> Result<Self, Stop> {
        let get = cuda.sym(c"cuModuleGetGlobal").map_err(Stop::Cuda)?;
        // SAFETY: cuModuleGetGlobal's C signature.
        let get: unsafe extern "C" fn(*mut u64, *mut usize, Ptr, *const c_char) -> R =
            unsafe { std::mem::transmute(get) };
        let (mut addr, mut size) = (0u64, 0usize);
        // SAFETY: valid out pointers and a NUL-terminated name.
        let r = unsafe { get(&mut addr, &mut size, builtin, c"counter".as_ptr()) };
        let mut bump = None;
        if r != 0 {
            // No built-in variable: a PTX module declares it (a cuda device).
            let mut m: Ptr = null_mut();
            cu!(
                cuda,
                c"cuModuleLoadData",
                fn(*mut Ptr, *const c_void),
                &mut m,
                COUNTER_PTX.as_ptr().cast()
            );
            cu!(
                cuda,
                c"cuModuleGetGlobal",
                fn(*mut u64, *mut usize, Ptr, *const c_char),
                &mut addr,
                &mut size,
                m,
                c"counter".as_ptr()
            );
            let mut f: Ptr = null_mut();
            cu!(
                cuda,
                c"cuModuleGetFunction",
                fn(*mut Ptr, Ptr, *const c_char),
                &mut f,
                m,
                c"bump".as_ptr()
            );
            bump = Some(f);
        }
        if size != 8 {
            return Err(Stop::Wrong(format!("counter is {size} bytes, not 8")));
        }
        let want = 0x5eed_0000_0000_0000u64;
        cu!(
            cuda,
            c"cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            addr,
            (&want as *const u64).cast(),
            8
        );
        Ok(Self { addr, bump, want })
    }

    /// Reads the variable back and checks it, then advances it.
    fn round(
        &mut self,
        cuda: &Cuda,
        go: &dyn Fn(Ptr, c_uint, Ptr, *mut Ptr) -> Result<(), Stop>,
        round: u64,
    ) -> Result<(), Stop> {
        let mut got = 0u64;
        cu!(
            cuda,
            c"cuMemcpyDtoH",
            fn(*mut c_void, u64, usize),
            (&mut got as *mut u64).cast(),
            self.addr,
            8
        );
        if got != self.want {
            return Err(Stop::Wrong(format!(
                "the module variable holds {got:#x}, want {:#x} (round {})",
                self.want,
                round + 1
            )));
        }
        self.want += 1;
        cu!(
            cuda,
            c"cuMemcpyHtoD",
            fn(u64, *const c_void, usize),
            self.addr,
            (&self.want as *const u64).cast(),
            8
        );
        if let Some(f) = self.bump {
            // No parameters (an empty array, as CUDA programs pass).
            let mut none: [Ptr; 1] = [null_mut()];
            go(f, 1, null_mut(), none.as_mut_ptr())?;
            cu!(cuda, c"cuCtxSynchronize", fn());
            self.want += 1;
        }
        Ok(())
    }
}

fn main() -> ExitCode {
    let o = match opts() {
        Ok(o) => o,
        Err(e) => {
            eprintln!("vgpu-cuda-loop: {e}");
            return ExitCode::from(2);
        }
    };
    let cuda = match Cuda::load(&o.library) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("vgpu-cuda-loop: {e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let mut rounds = 0;
    let result = run(&cuda, &o, &mut rounds);
    let secs = started.elapsed().as_secs_f64();
    match result {
        Ok(()) => {
            println!("vgpu-cuda-loop: {rounds} rounds in {secs:.1} s, every result right");
            ExitCode::SUCCESS
        }
        Err(Stop::Wrong(why)) => {
            println!("vgpu-cuda-loop: WRONG RESULT after {rounds} good rounds: {why}");
            ExitCode::from(1)
        }
        Err(Stop::Cuda(why)) => {
            println!("vgpu-cuda-loop: CUDA error after {rounds} good rounds in {secs:.1} s: {why}");
            ExitCode::from(3)
        }
    }
}
