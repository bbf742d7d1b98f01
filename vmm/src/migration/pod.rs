//! KVM's state structs as byte blobs in the snapshot: each is a plain C struct whose layout
//! the kernel's UAPI headers fix (x86-64, little-endian), so its bytes are its portable
//! form. A blob of the wrong length is refused, never reinterpreted.

use kvm_bindings::{
    kvm_clock_data, kvm_fpu, kvm_irqchip, kvm_lapic_state, kvm_mp_state, kvm_pit_state2, kvm_regs,
    kvm_sregs, kvm_vcpu_events, kvm_xcrs, kvm_xsave,
};

/// A KVM UAPI struct made only of integers and arrays of integers (and unions of them), so
/// every byte pattern of its size is a valid value.
///
/// # Safety
/// Implement only for `#[repr(C)]` types without pointers, references, `bool`s, enums or
/// other types with invalid bit patterns.
pub unsafe trait Pod: Default {}

// SAFETY: each of these is a `#[repr(C)]` bindgen struct of the KVM UAPI made of integer
// fields, integer arrays and unions of those; any bit pattern is a valid value.
unsafe impl Pod for kvm_regs {}
// SAFETY: as above.
unsafe impl Pod for kvm_sregs {}
// SAFETY: as above.
unsafe impl Pod for kvm_fpu {}
// SAFETY: as above (the trailing flexible array is zero-sized).
unsafe impl Pod for kvm_xsave {}
// SAFETY: as above.
unsafe impl Pod for kvm_xcrs {}
// SAFETY: as above.
unsafe impl Pod for kvm_lapic_state {}
// SAFETY: as above.
unsafe impl Pod for kvm_vcpu_events {}
// SAFETY: as above.
unsafe impl Pod for kvm_mp_state {}
// SAFETY: as above.
unsafe impl Pod for kvm_clock_data {}
// SAFETY: as above.
unsafe impl Pod for kvm_irqchip {}
// SAFETY: as above.
unsafe impl Pod for kvm_pit_state2 {}

/// The bytes of `v`.
pub fn to_bytes<T: Pod>(v: &T) -> Vec<u8> {
    let n = std::mem::size_of::<T>();
    let mut out = vec![0u8; n];
    // SAFETY: `v` is a valid `T` of `n` bytes and `out` holds `n` bytes; the regions do
    // not overlap. KVM structs come zero-initialised (Default) before the kernel fills
    // them, so their padding bytes are initialised too.
    unsafe { std::ptr::copy_nonoverlapping((v as *const T).cast::<u8>(), out.as_mut_ptr(), n) };
    out
}

/// A `T` from exactly `size_of::<T>()` bytes; `None` for any other length.
pub fn from_bytes<T: Pod>(bytes: &[u8]) -> Option<T> {
    let n = std::mem::size_of::<T>();
    if bytes.len() != n {
        return None;
    }
    let mut v = T::default();
    // SAFETY: `bytes` holds exactly `n` bytes, `v` is a `T` of `n` bytes, and `T: Pod`
    // makes every bit pattern a valid `T`.
    unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), (&mut v as *mut T).cast::<u8>(), n) };
    Some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_length_check() {
        let regs = kvm_regs {
            rip: 0x1234,
            rsp: 0x8000,
            ..Default::default()
        };
        let b = to_bytes(&regs);
        assert_eq!(b.len(), std::mem::size_of::<kvm_regs>());
        let back: kvm_regs = from_bytes(&b).unwrap();
        assert_eq!(back.rip, 0x1234);
        assert_eq!(back.rsp, 0x8000);
        assert!(from_bytes::<kvm_regs>(&b[1..]).is_none());
        assert!(from_bytes::<kvm_xsave>(&b).is_none());
    }
}
