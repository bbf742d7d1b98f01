//! Module memory charged to the share, cubin/fatbin loads on a device without a GPU, and
//! `GET_ATTRIBUTES`, through the queue.

use super::*;

#[test]
fn modules_are_charged_to_the_share_and_refused_past_it() {
    let mem = ram();
    // 2 MiB for an allocation and eight pages for modules.
    let page = vgpu_backend::MODULE_PAGE;
    let share = 2 * MIB + 8 * page;
    let mut h = Harness::new(&mem, share);
    h.alloc(2 * MIB);
    let name = h.put(b"builtin");
    let load = Request::ModuleLoad(ModuleLoadArgs {
        kind: module_kind::BUILTIN,
        flags: 0,
        size: 7,
    });
    let mut handles = Vec::new();
    for _ in 0..8 {
        let r = h.ok(load, &[r(name, 7)]);
        assert_eq!(r[1], page, "result[1] is the charge");
        handles.push(r[0]);
    }
    // The ninth does not fit the share: refused before the backend compiles anything.
    assert_eq!(h.status(load, &[r(name, 7)]), Status::OutOfMemory);
    let info = h.space(DeviceInfo::SIZE);
    h.ok(Request::GetInfo, &[w(info, DeviceInfo::SIZE)]);
    let di = DeviceInfo::decode(&h.read(info, DeviceInfo::SIZE)).expect("info");
    assert_eq!(di.memory_used, share, "modules count in memory_used");
    // Allocations see the modules too.
    assert_eq!(
        h.status(Request::Alloc(AllocArgs { size: 1, flags: 0 }), &[]),
        Status::OutOfMemory
    );
    let m = handles.pop().expect("one");
    h.ok(Request::ModuleUnload(ModuleUnloadArgs { module: m }), &[]);
    h.ok(load, &[r(name, 7)]);
    h.still_works();
}

#[test]
fn binary_modules_are_not_supported_without_a_gpu_and_unknown_kinds_are_invalid() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    let image = h.put(b"\x7fELF\x02\x01");
    let load = |kind| {
        Request::ModuleLoad(ModuleLoadArgs {
            kind,
            flags: 0,
            size: 6,
        })
    };
    assert_eq!(
        h.status(load(module_kind::BINARY), &[r(image, 6)]),
        Status::NotSupported
    );
    assert_eq!(h.status(load(9), &[r(image, 6)]), Status::InvalidArgument);
    h.still_works();
}

#[test]
fn get_attributes_answers_the_sim_values() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_ne!(h.vgpu.config_space().features & features::ATTRIBUTES, 0);
    let a = h.space(DeviceAttributes::SIZE);
    let res = h.ok(Request::GetAttributes, &[w(a, DeviceAttributes::SIZE)]);
    assert_eq!(res[0], DeviceAttributes::SIZE as u64);
    let got = DeviceAttributes::decode(&h.read(a, DeviceAttributes::SIZE)).expect("attributes");
    assert_eq!(
        got,
        DeviceAttributes {
            sm_count: 1,
            ..DeviceAttributes::SIM
        }
    );
    // Too small or readable: refused like GET_INFO's.
    assert_eq!(
        h.status(Request::GetAttributes, &[w(a, 64)]),
        Status::BadLength
    );
    assert_eq!(
        h.status(Request::GetAttributes, &[r(a, DeviceAttributes::SIZE)]),
        Status::BadDescriptor
    );
    h.still_works();
}

#[test]
fn get_function_layout_answers_the_handle_and_the_layout() {
    let mem = ram();
    let mut h = Harness::new(&mem, 32 * MIB);
    assert_ne!(h.vgpu.config_space().features & features::PARAM_LAYOUT, 0);
    let m = h.builtin();
    let name = h.put(b"saxpy");
    let out = h.space(ParamLayout::SIZE);
    let req = Request::GetFunctionLayout(GetFunctionArgs {
        module: m,
        name_len: 5,
    });
    let res = h.ok(req, &[r(name, 5), w(out, ParamLayout::SIZE)]);
    assert_eq!(res[0], h.get_function(m, "saxpy")[0], "the same handle");
    assert_eq!((res[1], res[2]), (4, 32), "count and buffer size");
    let l = ParamLayout::decode(&h.read(out, ParamLayout::SIZE)).expect("layout");
    let got: Vec<_> = (0..4).filter_map(|i| l.get(i)).collect();
    assert_eq!(got, [(0, 4), (8, 8), (16, 8), (24, 8)]);
    assert_eq!(res[3], 0, "no room for the attributes: none written");
    // With room after the layout: the function's attributes too (a sim kernel runs on
    // host threads: no registers, shared, constant or local memory).
    assert_ne!(
        h.vgpu.config_space().features & features::FUNCTION_ATTRIBUTES,
        0
    );
    let both = ParamLayout::SIZE + FunctionAttributes::SIZE;
    let out2 = h.space(both);
    let res = h.ok(req, &[r(name, 5), w(out2, both)]);
    assert_eq!(res[3], FunctionAttributes::SIZE as u64);
    let bytes = h.read(out2, both);
    let a = FunctionAttributes::decode(&bytes[ParamLayout::SIZE..]).expect("attributes");
    assert_eq!(
        a,
        FunctionAttributes {
            max_threads_per_block: 1024,
            ..FunctionAttributes::default()
        }
    );
    assert_eq!(ParamLayout::decode(&bytes).expect("layout"), l);
    // Shapes: the layout descriptor missing, too small, or before the name.
    assert_eq!(h.status(req, &[r(name, 5)]), Status::BadDescriptor);
    assert_eq!(h.status(req, &[r(name, 5), w(out, 64)]), Status::BadLength);
    assert_eq!(
        h.status(req, &[w(out, ParamLayout::SIZE), r(name, 5)]),
        Status::BadDescriptor
    );
    assert_eq!(
        h.status(req, &[r(name, 4), w(out, ParamLayout::SIZE)]),
        Status::BadLength
    );
    // Raw bytes reach the backend, which refuses them for a built-in.
    let f = h.get_function(m, "fill")[0];
    let dst = h.alloc(4096);
    let raw = KernelArg::bytes(&[1, 2]).expect("raw");
    let resp = h.launch(
        f,
        &[KernelArg::ptr(dst, Access::Write), raw, KernelArg::u64(1)],
    );
    assert_eq!(resp.status(), Some(Status::BadArgType));
    let bad = KernelArg {
        kind: ArgKind::Bytes as u32,
        access: 9,
        value: 0,
    };
    let resp = h.launch(
        f,
        &[KernelArg::ptr(dst, Access::Write), bad, KernelArg::u64(1)],
    );
    assert_eq!(resp.status(), Some(Status::BadArgType));
    h.still_works();
}
