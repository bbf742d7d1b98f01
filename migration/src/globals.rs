//! Module variables across a move (docs/migration.md, "Module variables").
//!
//! A module's variables (`__device__`, `__constant__`) live in memory the backend placed
//! when it loaded the module, not in the vGPU's allocations: a move reloads the module on
//! the target, reads every variable's bytes on the source and writes them into the
//! reloaded module's variable of the same name before the vGPU resumes.
//!
//! The target's driver places the reloaded variables where it likes, so the guest keeps
//! the address it was first given: [`Migratable`] answers `module_global` with that
//! address and translates copies, memsets, range checks and launch pointer arguments that
//! fall inside a moved variable to where it lives now. A variable's address passed as a
//! plain integer or stored in device memory is not translated (a kernel reaches its own
//! module's variables by name, so only such hand-passed pointers are affected).

use std::collections::BTreeMap;
use std::sync::atomic::Ordering;

use vgpu_backend::sync::lock;
use vgpu_backend::{ArgValue, Backend, BackendError};
use vm_memory::VolatileSlice;

use crate::migratable::Migratable;
use crate::MigrationError;

/// A module variable whose address the guest holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Var {
    /// The guest's module handle.
    pub(crate) module: u64,
    pub(crate) name: Vec<u8>,
    pub(crate) size: u64,
    /// Where it lives on the backend serving now.
    pub(crate) real: u64,
    /// The guest's address range is held on the backend serving now by an allocation of
    /// ours (the variable moved away from inside the vGPU's address range: nothing else
    /// may be placed where the guest still reaches the variable).
    pub(crate) held: bool,
}

/// One variable's bytes read on the source, ready for the target.
#[derive(Debug)]
pub(crate) struct Carried {
    /// The guest's module handle.
    pub(crate) module: u64,
    pub(crate) name: Vec<u8>,
    /// The address the guest knows it by.
    pub(crate) guest: u64,
    pub(crate) bytes: Vec<u8>,
}

/// Most bytes a move reads of one module's variables at once (their memory is charged to
/// the vGPU with the module, so this only bounds a single read buffer).
const READ_CHUNK: usize = 4 << 20;

/// Reads `len` bytes at `addr` on `b` into a fresh buffer, in chunks.
pub(crate) fn read_bytes(b: &dyn Backend, addr: u64, len: u64) -> Result<Vec<u8>, BackendError> {
    let len = usize::try_from(len).map_err(|_| BackendError::BadPointer { addr, len })?;
    let mut out = Vec::new();
    out.try_reserve_exact(len)
        .map_err(|_| BackendError::HostOutOfMemory {
            requested: len as u64,
        })?;
    out.resize(len, 0);
    let mut at = 0;
    while at < len {
        let n = (len - at).min(READ_CHUNK);
        let slice = VolatileSlice::from(&mut out[at..at + n]);
        b.copy_dtoh(addr + at as u64, &slice)?;
        at += n;
    }
    Ok(out)
}

impl Migratable {
    /// The guest's address of variable `name` of module `module` now living at
    /// `real` (`size` bytes): the one it was given before, else `real`. A stale address of
    /// a moved variable that `real` now overlaps stops being translated.
    pub(crate) fn guest_var(&self, module: u64, name: &[u8], real: u64, size: u64) -> u64 {
        let mut vars = lock(&self.vars);
        if let Some((g, _)) = vars
            .iter()
            .find(|(_, v)| v.module == module && v.name == name)
        {
            return *g;
        }
        if size == 0 {
            return real;
        }
        let end = real.saturating_add(size);
        let stale: Vec<u64> = vars
            .iter()
            .filter(|(g, v)| **g < end && real < g.saturating_add(v.size))
            .map(|(g, _)| *g)
            .collect();
        for g in stale {
            tracing::warn!(
                addr = format_args!("{g:#x}"),
                "a moved module variable's old address is now another variable's; look it up again"
            );
            vars.remove(&g);
        }
        vars.insert(
            real,
            Var {
                module,
                name: name.to_vec(),
                size,
                real,
                held: false,
            },
        );
        real
    }

    /// Where guest address `addr` (`len` bytes from it) lives now: translated when it
    /// lies inside a moved variable, else unchanged.
    pub(crate) fn real_addr(&self, addr: u64, len: u64) -> u64 {
        if !self.vars_moved.load(Ordering::Acquire) {
            return addr;
        }
        let vars = lock(&self.vars);
        match vars.range(..=addr).next_back() {
            Some((g, v))
                if v.real != *g
                    && addr - g < v.size
                    && addr.checked_add(len).is_some_and(|e| e <= g + v.size) =>
            {
                v.real + (addr - g)
            }
            _ => addr,
        }
    }

    /// A launch's arguments with pointers into moved variables translated; `None` when
    /// none is.
    pub(crate) fn real_args(&self, args: &[ArgValue]) -> Option<Vec<ArgValue>> {
        if !self.vars_moved.load(Ordering::Acquire) {
            return None;
        }
        let mut changed = false;
        let out = args
            .iter()
            .map(|a| match *a {
                ArgValue::Ptr { addr, access } => {
                    let real = self.real_addr(addr, 0);
                    changed |= real != addr;
                    ArgValue::Ptr { addr: real, access }
                }
                other => other,
            })
            .collect();
        changed.then_some(out)
    }

    /// Forgets the variables of an unloaded module (and gives back the ranges held for
    /// them on `b`).
    pub(crate) fn forget_vars(&self, b: &dyn Backend, module: u64) {
        lock(&self.vars).retain(|g, v| {
            if v.module != module {
                return true;
            }
            if v.held {
                if let Err(e) = b.free(*g) {
                    tracing::warn!(addr = format_args!("{g:#x}"), error = %e, "releasing a moved variable's old range failed");
                }
            }
            false
        });
    }

    /// Reads every variable of every loaded module on `source` (guest handle -> source
    /// handle in `modules`). Called stopped.
    pub(crate) fn read_vars(
        &self,
        source: &dyn Backend,
        modules: &[(u64, u64)],
    ) -> Result<Vec<Carried>, MigrationError> {
        let mut out = Vec::new();
        for (h, real) in modules {
            let all = source
                .modules()
                .module_globals(*real)
                .map_err(MigrationError::Source)?;
            for g in all.into_iter().filter(|g| g.size > 0) {
                let guest = lock(&self.vars)
                    .iter()
                    .find(|(_, v)| v.module == *h && v.name == g.name)
                    .map_or(g.addr, |(a, _)| *a);
                let bytes = read_bytes(source, g.addr, g.size).map_err(MigrationError::Source)?;
                out.push(Carried {
                    module: *h,
                    name: g.name,
                    guest,
                    bytes,
                });
            }
        }
        Ok(out)
    }

    /// Records where carried variables live on `b`, the backend serving from now on:
    /// `placed` is (guest address, variable) of each. A guest range inside the vGPU's
    /// address range that the variable left is held on `b` so no allocation lands there.
    pub(crate) fn moved_vars(&self, b: &dyn Backend, placed: Vec<(u64, Var)>) {
        let mut vars = lock(&self.vars);
        let mut moved = false;
        let va = self.info.va_base..self.info.va_base.saturating_add(self.info.va_size);
        for (guest, mut v) in placed {
            moved |= guest != v.real;
            if guest != v.real && va.contains(&guest) {
                // Fails where the range is some other variable's memory on `b` already:
                // nothing can be allocated there then either.
                v.held = b
                    .relocation()
                    .is_some_and(|r| r.alloc_at(guest, v.size).is_ok());
            }
            vars.insert(guest, v);
        }
        if moved {
            self.vars_moved.store(true, Ordering::Release);
        }
    }
}

/// Looks every carried variable up on `target` (`new_mod`: guest module handle -> target
/// handle) and checks it has the source's size: (target address, the variable) of each.
pub(crate) fn place_vars(
    target: &dyn Backend,
    new_mod: &BTreeMap<u64, u64>,
    carried: &[Carried],
) -> Result<Vec<(u64, Var)>, MigrationError> {
    let mut out = Vec::with_capacity(carried.len());
    for c in carried {
        let module = new_mod.get(&c.module).copied().unwrap_or(0);
        let what = || {
            format!(
                "module {}'s variable \"{}\"",
                c.module,
                String::from_utf8_lossy(&c.name)
            )
        };
        let (real, size) = target
            .modules()
            .module_global(module, &c.name)
            .map_err(|source| MigrationError::Target {
                what: format!("looking up {}", what()),
                source,
            })?;
        if size != c.bytes.len() as u64 {
            return Err(MigrationError::Target {
                what: what(),
                source: BackendError::InvalidArgument(format!(
                    "it is {size} bytes on the target and {} on the source",
                    c.bytes.len()
                )),
            });
        }
        out.push((
            c.guest,
            Var {
                module: c.module,
                name: c.name.clone(),
                size,
                real,
                held: false,
            },
        ));
    }
    Ok(out)
}

/// Writes the carried bytes into the target's variables (`placed`, from [`place_vars`]).
pub(crate) fn write_vars(
    target: &dyn Backend,
    carried: &mut [Carried],
    placed: &[(u64, Var)],
) -> Result<(), MigrationError> {
    for (c, (_, v)) in carried.iter_mut().zip(placed) {
        let slice = VolatileSlice::from(&mut c.bytes[..]);
        target
            .copy_htod(v.real, &slice)
            .map_err(|source| MigrationError::Target {
                what: format!(
                    "writing module {}'s variable \"{}\"",
                    c.module,
                    String::from_utf8_lossy(&c.name)
                ),
                source,
            })?;
    }
    Ok(())
}

/// Sends one carried variable as `Variable` messages of at most `MAX_DATA` bytes.
pub(crate) fn send_var(conn: &mut impl std::io::Write, c: &Carried) -> Result<(), MigrationError> {
    use crate::wire::{Message, MAX_DATA, MAX_NAME};
    if c.name.is_empty() || c.name.len() > MAX_NAME {
        return Err(MigrationError::Stream(format!(
            "module {}'s variable name is {} bytes; the stream carries 1 to {MAX_NAME}",
            c.module,
            c.name.len()
        )));
    }
    let size = c.bytes.len() as u64;
    for (i, chunk) in c.bytes.chunks(MAX_DATA).enumerate() {
        Message::Variable {
            module: c.module,
            addr: c.guest,
            size,
            offset: (i * MAX_DATA) as u64,
            name: &c.name,
            bytes: chunk,
        }
        .write(conn)
        .map_err(|e| MigrationError::Stream(e.to_string()))?;
    }
    Ok(())
}

/// Most module variables a destination accepts.
pub const MAX_VARIABLES: usize = 1 << 16;

/// One `Variable` message as the destination received it.
pub(crate) struct Incoming<'a> {
    pub(crate) module: u64,
    pub(crate) addr: u64,
    pub(crate) size: u64,
    pub(crate) offset: u64,
    pub(crate) name: &'a [u8],
    pub(crate) bytes: &'a [u8],
}

/// Takes one `Variable` message on a destination: the module must have been received
/// (`loaded`: guest handle -> this backend's handle), the variable must exist in this
/// backend's copy of the module with exactly the size the source claims, the bytes must
/// lie inside it, and its guest range must not overlap another variable's. The bytes are
/// written at once; `vars` (guest address -> variable) grows by at most
/// [`MAX_VARIABLES`].
pub(crate) fn receive_var(
    backend: &dyn Backend,
    loaded: impl Fn(u64) -> Option<u64>,
    vars: &mut BTreeMap<u64, Var>,
    scratch: &mut Vec<u8>,
    v: Incoming<'_>,
) -> Result<u64, MigrationError> {
    let bad = |why: String| MigrationError::Stream(why);
    let label = || {
        format!(
            "module {}'s variable \"{}\"",
            v.module,
            String::from_utf8_lossy(v.name)
        )
    };
    let real = match vars.get(&v.addr) {
        Some(known) => {
            if known.module != v.module || known.name != v.name || known.size != v.size {
                return Err(bad(format!(
                    "{} at {:#x} differs from the variable sent there before",
                    label(),
                    v.addr
                )));
            }
            known.real
        }
        None => {
            let module = loaded(v.module)
                .ok_or_else(|| bad(format!("{}: no such module was sent", label())))?;
            let end = v
                .addr
                .checked_add(v.size)
                .filter(|_| v.size > 0)
                .ok_or_else(|| {
                    bad(format!(
                        "{}: {:#x}+{:#x} is no range",
                        label(),
                        v.addr,
                        v.size
                    ))
                })?;
            if vars.len() >= MAX_VARIABLES {
                return Err(bad(format!("more than {MAX_VARIABLES} module variables")));
            }
            if vars
                .iter()
                .any(|(g, o)| *g < end && v.addr < g.saturating_add(o.size))
                || vars
                    .values()
                    .any(|o| o.module == v.module && o.name == v.name)
            {
                return Err(bad(format!(
                    "{} overlaps or repeats another variable",
                    label()
                )));
            }
            let (real, size) =
                backend
                    .modules()
                    .module_global(module, v.name)
                    .map_err(|source| MigrationError::Target {
                        what: format!("looking up {}", label()),
                        source,
                    })?;
            if size != v.size {
                return Err(bad(format!(
                    "{} is {size} bytes in this module; the source sent {} bytes for it",
                    label(),
                    v.size
                )));
            }
            vars.insert(
                v.addr,
                Var {
                    module: v.module,
                    name: v.name.to_vec(),
                    size,
                    real,
                    held: false,
                },
            );
            real
        }
    };
    if v.offset
        .checked_add(v.bytes.len() as u64)
        .is_none_or(|e| e > v.size)
    {
        return Err(bad(format!(
            "{}: bytes at offset {:#x} run past its {} bytes",
            label(),
            v.offset,
            v.size
        )));
    }
    scratch.clear();
    scratch.extend_from_slice(v.bytes);
    let slice = VolatileSlice::from(&mut scratch[..]);
    backend
        .copy_htod(real + v.offset, &slice)
        .map_err(|source| MigrationError::Target {
            what: format!("writing {}", label()),
            source,
        })?;
    Ok(v.bytes.len() as u64)
}

/// Refuses variables whose guest range overlaps an allocation (`allocs`: address -> size).
pub(crate) fn check_apart(
    vars: &BTreeMap<u64, Var>,
    allocs: &BTreeMap<u64, u64>,
) -> Result<(), MigrationError> {
    for (g, v) in vars {
        let end = g.saturating_add(v.size);
        if let Some((a, s)) = allocs.range(..end).next_back() {
            if *g < a.saturating_add(*s) {
                return Err(MigrationError::Stream(format!(
                    "module {}'s variable at {g:#x} overlaps the allocation at {a:#x}",
                    v.module
                )));
            }
        }
    }
    Ok(())
}
