//! Built-in kernel arguments, as both backends read them: the check against the kernel's
//! signature (count, kinds, access modes) and typed accessors for checked arguments.

use vgpu_proto::builtin::{KernelSig, Param};
use vgpu_proto::ArgValue;

use crate::error::{BackendError, Result};

/// Checks `args` against the kernel's parameter list (count, kinds, access modes).
pub(crate) fn check_args(sig: &'static KernelSig, args: &[ArgValue]) -> Result<()> {
    if args.len() != sig.params.len() {
        return Err(BackendError::BadArgCount {
            kernel: sig.name,
            expected: sig.params.len(),
            got: args.len(),
        });
    }
    for (index, (arg, (param, want))) in args.iter().zip(sig.params.iter()).enumerate() {
        let bad = |reason: String| BackendError::BadArgType {
            kernel: sig.name,
            index,
            param,
            reason,
        };
        if !want.accepts(arg.kind()) {
            return Err(bad(format!("expects {want:?}, got {:?}", arg.kind())));
        }
        if let (Param::Ptr(needed), ArgValue::Ptr { access, .. }) = (want, arg) {
            if !access.covers(*needed) {
                return Err(bad(format!(
                    "the kernel needs {needed:?} access, the pointer declares {access:?}"
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn int(args: &[ArgValue], i: usize) -> u64 {
    match args.get(i) {
        Some(ArgValue::U32(v)) => u64::from(*v),
        Some(ArgValue::U64(v)) => *v,
        _ => 0,
    }
}

pub(crate) fn f32_arg(args: &[ArgValue], i: usize) -> f32 {
    match args.get(i) {
        Some(ArgValue::F32(v)) => *v,
        _ => 0.0,
    }
}

pub(crate) fn word(args: &[ArgValue], i: usize) -> u32 {
    match args.get(i) {
        Some(ArgValue::U32(v)) => *v,
        Some(ArgValue::F32(v)) => v.to_bits(),
        _ => 0,
    }
}

pub(crate) fn ptr(args: &[ArgValue], i: usize) -> u64 {
    match args.get(i) {
        Some(ArgValue::Ptr { addr, .. }) => *addr,
        _ => 0,
    }
}
