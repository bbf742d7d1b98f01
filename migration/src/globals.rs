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

use std::collections::{BTreeMap, HashMap};
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
    /// The address the guest knows it by, if it looked the variable up (else only
    /// kernels reach it, by name).
    pub(crate) guest: Option<u64>,
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
        // Guest ranges are disjoint: those overlapping `[real, end)` are the last ones
        // starting before `end`.
        let stale: Vec<u64> = vars
            .range(..end)
            .rev()
            .take_while(|(g, v)| real < g.saturating_add(v.size))
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
        // The guest's addresses by (module, name).
        let known: HashMap<(u64, Vec<u8>), u64> = lock(&self.vars)
            .iter()
            .map(|(g, v)| ((v.module, v.name.clone()), *g))
            .collect();
        for (h, real) in modules {
            let all = source
                .modules()
                .module_globals(*real)
                .map_err(MigrationError::Source)?;
            for g in all.into_iter().filter(|g| g.size > 0) {
                let guest = known.get(&(*h, g.name.clone())).copied();
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
    /// `placed` is (guest address, variable) of each; those the guest holds no address of
    /// need no record. A guest range inside the vGPU's address range that the variable
    /// left is held on `b` so no allocation lands there.
    pub(crate) fn moved_vars(&self, b: &dyn Backend, placed: Vec<(Option<u64>, Var)>) {
        let mut vars = lock(&self.vars);
        let mut moved = false;
        let va = self.info.va_base..self.info.va_base.saturating_add(self.info.va_size);
        for (guest, mut v) in placed.into_iter().filter_map(|(g, v)| g.map(|g| (g, v))) {
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
) -> Result<Vec<(Option<u64>, Var)>, MigrationError> {
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
    placed: &[(Option<u64>, Var)],
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
            // 0 (never a device address): the guest holds none for it.
            addr: c.guest.unwrap_or(0),
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
/// lie inside it, and its guest range (where the guest holds an address: `addr` not 0)
/// must not overlap another variable's. The bytes are written at once; `vars` grows by at
/// most [`MAX_VARIABLES`].
pub(crate) fn receive_var(
    backend: &dyn Backend,
    loaded: impl Fn(u64) -> Option<u64>,
    vars: &mut Received,
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
    let key = (v.module, v.name.to_vec());
    let real = match vars.by_name.get(&key) {
        Some((guest, known)) => {
            if *guest != v.addr || known.size != v.size {
                return Err(bad(format!(
                    "{} comes again at {:#x} with {} bytes, unlike before",
                    label(),
                    v.addr,
                    v.size
                )));
            }
            known.real
        }
        None => {
            let module = loaded(v.module)
                .ok_or_else(|| bad(format!("{}: no such module was sent", label())))?;
            if vars.by_name.len() >= MAX_VARIABLES {
                return Err(bad(format!("more than {MAX_VARIABLES} module variables")));
            }
            if v.size == 0 {
                return Err(bad(format!("{} has no bytes", label())));
            }
            if v.addr != 0 {
                let end = v.addr.checked_add(v.size).ok_or_else(|| {
                    bad(format!(
                        "{}: {:#x}+{:#x} is no range",
                        label(),
                        v.addr,
                        v.size
                    ))
                })?;
                // Guest ranges are disjoint: only the last one starting before `end` can
                // overlap.
                if vars
                    .guests
                    .range(..end)
                    .next_back()
                    .is_some_and(|(g, size)| v.addr < g.saturating_add(*size))
                {
                    return Err(bad(format!("{} overlaps another variable", label())));
                }
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
            if v.addr != 0 {
                vars.guests.insert(v.addr, size);
            }
            vars.by_name.insert(
                key,
                (
                    v.addr,
                    Var {
                        module: v.module,
                        name: v.name.to_vec(),
                        size,
                        real,
                        held: false,
                    },
                ),
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

/// The module variables a destination received so far.
#[derive(Debug, Default)]
pub(crate) struct Received {
    /// By (module, name): the guest's address (0: none) and the variable here.
    by_name: BTreeMap<(u64, Vec<u8>), (u64, Var)>,
    /// The guest's ranges (address -> size).
    guests: BTreeMap<u64, u64>,
}

impl Received {
    /// How many arrived.
    pub(crate) fn len(&self) -> usize {
        self.by_name.len()
    }

    /// Those the guest holds an address of: (that address, the variable here).
    pub(crate) fn take(&mut self) -> Vec<(Option<u64>, Var)> {
        self.guests.clear();
        std::mem::take(&mut self.by_name)
            .into_values()
            .map(|(g, v)| ((g != 0).then_some(g), v))
            .collect()
    }

    /// The guest ranges (address, size, module).
    pub(crate) fn ranges(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.by_name
            .values()
            .filter(|(g, _)| *g != 0)
            .map(|(g, v)| (*g, v.size, v.module))
    }
}

/// Refuses variables whose guest range overlaps an allocation (`allocs`: address -> size).
pub(crate) fn check_apart(
    vars: &Received,
    allocs: &BTreeMap<u64, u64>,
) -> Result<(), MigrationError> {
    for (g, size, module) in vars.ranges() {
        let end = g.saturating_add(size);
        if let Some((a, s)) = allocs.range(..end).next_back() {
            if g < a.saturating_add(*s) {
                return Err(MigrationError::Stream(format!(
                    "module {module}'s variable at {g:#x} overlaps the allocation at {a:#x}"
                )));
            }
        }
    }
    Ok(())
}
