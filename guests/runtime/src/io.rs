//! Port I/O and MMIO access. Every port access is a VM exit, so callers should batch.

use core::arch::asm;

/// Writes a byte to an I/O port.
///
/// # Safety
/// The port must be one whose side effects the caller intends (see payload-abi.md).
#[inline(always)]
pub unsafe fn outb(port: u16, value: u8) {
    // SAFETY: `out` touches no memory; the caller vouches for the port's side effects.
    unsafe {
        asm!("out dx, al", in("dx") port, in("al") value, options(nomem, nostack, preserves_flags))
    }
}

/// Writes a 16-bit value to an I/O port.
///
/// # Safety
/// As for [`outb`].
#[inline(always)]
pub unsafe fn outw(port: u16, value: u16) {
    // SAFETY: `out` touches no memory; the caller vouches for the port's side effects.
    unsafe {
        asm!("out dx, ax", in("dx") port, in("ax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Writes a 32-bit value to an I/O port.
///
/// # Safety
/// As for [`outb`].
#[inline(always)]
pub unsafe fn outl(port: u16, value: u32) {
    // SAFETY: `out` touches no memory; the caller vouches for the port's side effects.
    unsafe {
        asm!("out dx, eax", in("dx") port, in("eax") value, options(nomem, nostack, preserves_flags))
    }
}

/// Reads a byte from an I/O port.
///
/// # Safety
/// Reads can have side effects on devices (e.g. clearing status); the caller vouches for it.
#[inline(always)]
pub unsafe fn inb(port: u16) -> u8 {
    let value: u8;
    // SAFETY: `in` touches no memory; the caller vouches for the port's side effects.
    unsafe {
        asm!("in al, dx", out("al") value, in("dx") port, options(nomem, nostack, preserves_flags))
    }
    value
}

/// Reads a 32-bit value from an I/O port.
///
/// # Safety
/// As for [`inb`].
#[inline(always)]
pub unsafe fn inl(port: u16) -> u32 {
    let value: u32;
    // SAFETY: `in` touches no memory; the caller vouches for the port's side effects.
    unsafe {
        asm!("in eax, dx", out("eax") value, in("dx") port, options(nomem, nostack, preserves_flags))
    }
    value
}

/// Volatile 32-bit MMIO read.
///
/// # Safety
/// `addr` must be a 4-byte aligned device register (or RAM) inside the identity map.
#[inline(always)]
pub unsafe fn mmio_read32(addr: u64) -> u32 {
    // SAFETY: the caller guarantees an aligned, mapped register address.
    unsafe { core::ptr::read_volatile(addr as *const u32) }
}

/// Volatile 32-bit MMIO write.
///
/// # Safety
/// As for [`mmio_read32`], and the write's device side effect must be intended.
#[inline(always)]
pub unsafe fn mmio_write32(addr: u64, value: u32) {
    // SAFETY: the caller guarantees an aligned, mapped register address.
    unsafe { core::ptr::write_volatile(addr as *mut u32, value) }
}

/// Volatile 8-bit MMIO read (device config space is byte addressable).
///
/// # Safety
/// As for [`mmio_read32`], without the alignment requirement.
#[inline(always)]
pub unsafe fn mmio_read8(addr: u64) -> u8 {
    // SAFETY: the caller guarantees a mapped register address.
    unsafe { core::ptr::read_volatile(addr as *const u8) }
}

/// Volatile 8-bit MMIO write.
///
/// # Safety
/// As for [`mmio_write32`], without the alignment requirement.
#[inline(always)]
pub unsafe fn mmio_write8(addr: u64, value: u8) {
    // SAFETY: the caller guarantees a mapped register address.
    unsafe { core::ptr::write_volatile(addr as *mut u8, value) }
}

/// Spin-loop hint; also lets a hyperthread sibling run.
#[inline(always)]
pub fn pause() {
    core::hint::spin_loop();
}
