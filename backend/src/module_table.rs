//! The module table both backends keep: handles of loaded modules (never reused, so a
//! stale handle never names a newer module), a limit on how many are loaded at once, the
//! built-in module's name check, and the function-handle encoding
//! `(module << 16) | (index + 1)`, valid exactly while its module is loaded.

use std::collections::BTreeMap;
use std::sync::Mutex;

use vgpu_proto::BUILTIN_MODULE;

use crate::error::{BackendError, Result};
use crate::sync::lock;

/// Most modules one vGPU may have loaded at once.
pub const MAX_MODULES: usize = 64;

/// Module loads over a vGPU's life before handles run out.
const MAX_LOADS: u64 = 1 << 48;

#[derive(Debug)]
struct Table<M> {
    next: u64,
    loaded: BTreeMap<u64, M>,
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
            }),
        }
    }
}

impl<M: Clone> ModuleTable<M> {
    /// Adds a loaded module; its handle (never 0).
    pub fn insert(&self, module: M) -> Result<u64> {
        let mut t = lock(&self.table);
        if t.loaded.len() >= MAX_MODULES {
            return Err(BackendError::TooMany {
                what: "loaded modules",
                limit: MAX_MODULES,
            });
        }
        // Handles are never reused; 2^48 loads would be needed to run out.
        if t.next >= MAX_LOADS {
            return Err(BackendError::TooMany {
                what: "module loads over the vGPU's life",
                limit: MAX_LOADS as usize,
            });
        }
        let handle = t.next;
        t.next += 1;
        t.loaded.insert(handle, module);
        tracing::debug!(handle, "module loaded");
        Ok(handle)
    }

    /// Takes the module out of the table; the caller drops it outside the table's lock.
    pub fn remove(&self, module: u64) -> Result<M> {
        let removed = lock(&self.table).loaded.remove(&module);
        removed.ok_or_else(|| unknown_module(module))
    }

    /// The module behind `module`.
    pub fn get(&self, module: u64) -> Result<M> {
        let found = lock(&self.table).loaded.get(&module).cloned();
        found.ok_or_else(|| unknown_module(module))
    }

    /// The module and index a function handle names, if the module is loaded.
    pub fn function(&self, function: u64) -> Result<(M, usize)> {
        let unknown = || BackendError::UnknownFunction(format!("handle {function:#x}"));
        let module = function >> 16;
        let index = (function & 0xffff).checked_sub(1).ok_or_else(unknown)? as usize;
        let found = lock(&self.table).loaded.get(&module).cloned();
        found.map(|m| (m, index)).ok_or_else(unknown)
    }

    /// Drops every module (the backend is going away), outside the table's lock.
    pub fn clear(&self) {
        let all = std::mem::take(&mut lock(&self.table).loaded);
        drop(all);
    }
}

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
