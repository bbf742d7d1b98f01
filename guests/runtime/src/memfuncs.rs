//! memcpy & co. The payloads link without libc (-nostdlib), but the compiler emits calls
//! to these for copies, zeroing and comparisons. Written as string instructions in asm
//! so the optimiser cannot recognise them as a memcpy loop and call itself.

use core::arch::asm;

/// # Safety
/// `dest` and `src` valid for `n` bytes and not overlapping (the C contract).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees both ranges are valid; the ABI guarantees DF is clear,
    // so `rep movsb` copies forward exactly `n` bytes.
    unsafe {
        asm!(
            "rep movsb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            inout("rsi") src => _,
            options(nostack, preserves_flags)
        );
    }
    dest
}

/// # Safety
/// `dest` and `src` valid for `n` bytes; they may overlap.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize).wrapping_sub(src as usize) >= n {
        // dest is below src or the ranges are disjoint: a forward copy never reads a byte
        // it already overwrote.
        // SAFETY: as for memcpy; forward order is safe for this overlap direction.
        return unsafe { memcpy(dest, src, n) };
    }
    // dest overlaps the tail of src: copy backwards from the last byte.
    // SAFETY: n > 0 here (otherwise the branch above is taken), so dest + n - 1 and
    // src + n - 1 are inside the caller-guaranteed ranges; DF is restored before returning
    // as the ABI requires.
    unsafe {
        asm!(
            "std",
            "rep movsb",
            "cld",
            inout("rcx") n => _,
            inout("rdi") dest.add(n - 1) => _,
            inout("rsi") src.add(n - 1) => _,
            options(nostack)
        );
    }
    dest
}

/// # Safety
/// `dest` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    // SAFETY: the caller guarantees the range; DF is clear per the ABI. C semantics: the
    // value is converted to unsigned char, hence the truncation.
    unsafe {
        asm!(
            "rep stosb",
            inout("rcx") n => _,
            inout("rdi") dest => _,
            in("al") c as u8,
            options(nostack, preserves_flags)
        );
    }
    dest
}

/// # Safety
/// `a` and `b` valid for `n` bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    if n == 0 {
        return 0;
    }
    let mut pa = a;
    let mut pb = b;
    // SAFETY: the caller guarantees both ranges. `repe cmpsb` stops after the first
    // differing byte or after n bytes, leaving rsi/rdi one past the last byte compared.
    unsafe {
        asm!(
            "repe cmpsb",
            inout("rcx") n => _,
            inout("rsi") pa,
            inout("rdi") pb,
            options(nostack, readonly)
        );
    }
    // The last compared pair is the first difference, or equal if there was none.
    // SAFETY: at least one byte was compared, so pa - 1 and pb - 1 are inside the ranges.
    let (x, y) = unsafe { (*pa.sub(1), *pb.sub(1)) };
    i32::from(x) - i32::from(y)
}

/// # Safety
/// As for [`memcmp`]; only zero/non-zero is meaningful.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as memcmp.
    unsafe { memcmp(a, b, n) }
}
