//! The module table both backends keep: handles of loaded modules (never reused, so a
//! stale handle never names a newer module), limits on how many are loaded at once and on
//! the memory they hold, the built-in module's name check, and the function-handle encoding
//! `(module << 16) | (index + 1)`, valid exactly while its module is loaded.
//!
//! A module's memory (its [`footprint`](crate::module_footprint)) is reserved in the table
//! and charged to the vGPU's device memory *before* the module is compiled, and returned
//! when it is unloaded, so a guest cannot hold device memory in modules beyond its share.

use std::collections::BTreeMap;
use std::sync::Mutex;

use vgpu_proto::BUILTIN_MODULE;

use crate::error::{BackendError, Result};
use crate::sync::lock;

/// Most modules one vGPU may have loaded at once: a bound on the table, sized for real
/// programs (a CUDA runtime program loads each library it uses, PyTorch hundreds); the
/// memory they hold is bounded by the share and `MAX_MODULE_MEMORY`.
pub const MAX_MODULES: usize = 4096;

/// Most bytes of module memory one vGPU may hold at once (counted in whole pages).
pub const MAX_MODULE_MEMORY: u64 = 1 << 30;

/// Module loads over a vGPU's life before handles run out.
const MAX_LOADS: u64 = 1 << 48;

#[derive(Debug)]
struct Table<M> {
    next: u64,
    /// Loaded modules and the bytes each is charged.
    loaded: BTreeMap<u64, (M, u64)>,
    /// Modules reserved but not yet inserted (being compiled).
    pending: usize,
    /// Bytes charged by loaded and reserved modules.
    bytes: u64,
}

/// Where a backend charges module memory: its device memory accounts.
pub(crate) trait ModuleCharge {
    /// Charges `bytes` against the device memory the vGPU may use.
    fn charge_module(&self, bytes: u64) -> Result<()>;
    /// Returns a charge.
    fn uncharge_module(&self, bytes: u64);
}

impl ModuleCharge for crate::space::Ledger {
    fn charge_module(&self, bytes: u64) -> Result<()> {
        self.charge(bytes)
    }
    fn uncharge_module(&self, bytes: u64) {
        self.uncharge(bytes)
    }
}

/// A module's place and memory, reserved and charged before it is compiled. Dropped
/// without [`ModuleTable::insert`], it gives both back.
pub(crate) struct Reservation<'a, M> {
    table: &'a ModuleTable<M>,
    charge: &'a dyn ModuleCharge,
    bytes: u64,
    taken: bool,
}

impl<M> Drop for Reservation<'_, M> {
    fn drop(&mut self) {
        if !self.taken {
            let mut t = lock(&self.table.table);
            t.pending = t.pending.saturating_sub(1);
            t.bytes = t.bytes.saturating_sub(self.bytes);
            drop(t);
            self.charge.uncharge_module(self.bytes);
        }
    }
}

/// Loaded modules by handle; `M` is what a backend keeps of one.
#[derive(Debug)]
pub(crate) struct ModuleTable<M> {
    table: Mutex<Table<M>>,
}

impl<M> Default for ModuleTable<M> {
    fn default() -> Self {
        Self {
            table: Mutex::new(Table {
                next: 1,
                loaded: BTreeMap::new(),
                pending: 0,
                bytes: 0,
            }),
        }
    }
}

impl<M: Clone> ModuleTable<M> {
    /// Reserves a place for a module of `bytes` (whole pages) and charges them to `charge`,
    /// before the module is compiled: refused when the vGPU has `MAX_MODULES` modules, when
    /// its modules would hold more than `MAX_MODULE_MEMORY`, or when `charge` refuses.
    pub fn reserve<'a>(
        &'a self,
        charge: &'a dyn ModuleCharge,
        bytes: u64,
    ) -> Result<Reservation<'a, M>> {
        {
            let mut t = lock(&self.table);
            if t.loaded.len() + t.pending >= MAX_MODULES {
                return Err(BackendError::TooMany {
                    what: "loaded modules",
                    limit: MAX_MODULES,
                });
            }
            let total = t
                .bytes
                .checked_add(bytes)
                .filter(|b| *b <= MAX_MODULE_MEMORY);
            let Some(total) = total else {
                return Err(BackendError::ModuleLimit {
                    requested: bytes,
                    why: format!(
                        "the vGPU's modules hold {} bytes, at most {MAX_MODULE_MEMORY} are allowed",
                        t.bytes
                    ),
                });
            };
            t.pending += 1;
            t.bytes = total;
        }
        let mut r = Reservation {
            table: self,
            charge,
            bytes,
            taken: false,
        };
        if let Err(e) = charge.charge_module(bytes) {
            // Nothing was charged: only the table's reservation is given back.
            r.charge = &NO_CHARGE;
            return Err(match e {
                BackendError::OutOfMemory {
                    requested,
                    available,
                    capacity,
                } => BackendError::ModuleLimit {
                    requested,
                    why: format!(
                        "the vGPU's device memory has {available} of {capacity} bytes free"
                    ),
                },
                other => other,
            });
        }
        Ok(r)
    }

    /// Adds a compiled module in its reserved place; its handle (never 0).
    pub fn insert(&self, module: M, mut reservation: Reservation<'_, M>) -> Result<u64> {
        let mut t = lock(&self.table);
        // Handles are never reused; 2^48 loads would be needed to run out.
        if t.next >= MAX_LOADS {
            // The reservation gives itself back, which takes the table's lock.
            drop(t);
            drop(reservation);
            return Err(BackendError::TooMany {
                what: "module loads over the vGPU's life",
                limit: MAX_LOADS as usize,
            });
        }
        reservation.taken = true;
        t.pending = t.pending.saturating_sub(1);
        let handle = t.next;
        t.next += 1;
        t.loaded.insert(handle, (module, reservation.bytes));
        tracing::debug!(handle, bytes = reservation.bytes, "module loaded");
        Ok(handle)
    }

    /// Takes the module out of the table and returns its charge to `charge`; the caller
    /// drops the module outside the table's lock.
    pub fn remove(&self, module: u64, charge: &dyn ModuleCharge) -> Result<M> {
        let removed = {
            let mut t = lock(&self.table);
            let removed = t.loaded.remove(&module);
            if let Some((_, bytes)) = &removed {
                t.bytes = t.bytes.saturating_sub(*bytes);
            }
            removed
        };
        let (m, bytes) = removed.ok_or_else(|| unknown_module(module))?;
        charge.uncharge_module(bytes);
        Ok(m)
    }

    /// The module behind `module`.
    pub fn get(&self, module: u64) -> Result<M> {
        let found = lock(&self.table)
            .loaded
            .get(&module)
            .map(|(m, _)| m.clone());
        found.ok_or_else(|| unknown_module(module))
    }

    /// The module and index a function handle names, if the module is loaded.
    pub fn function(&self, function: u64) -> Result<(M, usize)> {
        let unknown = || BackendError::UnknownFunction(format!("handle {function:#x}"));
        let module = function >> 16;
        let index = (function & 0xffff).checked_sub(1).ok_or_else(unknown)? as usize;
        let found = lock(&self.table)
            .loaded
            .get(&module)
            .map(|(m, _)| m.clone());
        found.map(|m| (m, index)).ok_or_else(unknown)
    }

    /// Drops every module (the backend is going away), outside the table's lock, and
    /// returns their charges to `charge`.
    pub fn clear(&self, charge: &dyn ModuleCharge) {
        let all = {
            let mut t = lock(&self.table);
            let all = std::mem::take(&mut t.loaded);
            let freed: u64 = all.values().map(|(_, b)| *b).sum();
            t.bytes = t.bytes.saturating_sub(freed);
            all
        };
        let freed: u64 = all.values().map(|(_, b)| *b).sum();
        drop(all);
        charge.uncharge_module(freed);
    }
}

/// A charge that charges nothing.
struct NoCharge;

impl ModuleCharge for NoCharge {
    fn charge_module(&self, _bytes: u64) -> Result<()> {
        Ok(())
    }
    fn uncharge_module(&self, _bytes: u64) {}
}

static NO_CHARGE: NoCharge = NoCharge;

fn unknown_module(module: u64) -> BackendError {
    BackendError::UnknownModule(format!("handle {module}"))
}

/// The handle of function `index` of `module`.
pub(crate) fn function_handle(module: u64, index: usize) -> u64 {
    (module << 16) | (index as u64 + 1)
}

/// A guest-supplied name without its terminating NUL.
pub(crate) fn unterminated(name: &[u8]) -> &[u8] {
    name.strip_suffix(&[0]).unwrap_or(name)
}

/// The first 64 bytes of a guest-supplied name, for messages.
pub(crate) fn printable(name: &[u8]) -> String {
    String::from_utf8_lossy(name.get(..64).unwrap_or(name)).into_owned()
}

/// Checks that a built-in module image names the built-in module.
pub(crate) fn check_builtin(name: &[u8]) -> Result<()> {
    let name = unterminated(name);
    if name != BUILTIN_MODULE.as_bytes() {
        return Err(BackendError::UnknownModule(format!(
            "\"{}\"",
            printable(name)
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// Device memory of `cap` bytes.
    struct Counter {
        used: AtomicU64,
        cap: u64,
    }

    impl ModuleCharge for Counter {
        fn charge_module(&self, bytes: u64) -> Result<()> {
            crate::space::charge(&self.used, self.cap, bytes)
        }
        fn uncharge_module(&self, bytes: u64) {
            self.used.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    #[test]
    fn reservations_charge_before_and_give_back_on_failure_and_unload() {
        let mem = Counter {
            used: AtomicU64::new(0),
            cap: 3 * 4096,
        };
        let t: ModuleTable<u32> = ModuleTable::default();
        // A compile that fails: the reservation is dropped, the charge comes back.
        drop(t.reserve(&mem, 4096).expect("reserve"));
        assert_eq!(mem.used.load(Ordering::Acquire), 0);
        let a = t
            .insert(1, t.reserve(&mem, 8192).expect("a"))
            .expect("insert a");
        assert_eq!(mem.used.load(Ordering::Acquire), 8192);
        let e = t
            .reserve(&mem, 8192)
            .map(drop)
            .expect_err("over the memory");
        assert!(matches!(e, BackendError::ModuleLimit { .. }), "{e}");
        assert_eq!(
            mem.used.load(Ordering::Acquire),
            8192,
            "a refusal charges nothing"
        );
        let e = t
            .reserve(&mem, MAX_MODULE_MEMORY)
            .map(drop)
            .expect_err("over the module cap");
        assert!(e.to_string().contains("at most"), "{e}");
        assert_eq!(t.remove(a, &mem).expect("remove"), 1);
        assert_eq!(mem.used.load(Ordering::Acquire), 0);
        let b = t
            .insert(2, t.reserve(&mem, 4096).expect("b"))
            .expect("insert b");
        t.clear(&mem);
        assert_eq!(mem.used.load(Ordering::Acquire), 0);
        assert!(t.get(b).is_err());
    }
}
