//! Loaded modules and function handles of one vGPU on the sim device.
//!
//! A function handle is `(module << 16) | (kernel index + 1)`: valid exactly while its
//! module is loaded, so no per-function table is needed.
//!
//! The built-in module declares module variables ([`VARIABLES`]) as a cuda module's image
//! does: zero at load, at device addresses of the vGPU's own space, valid targets of
//! copies, memsets and kernel pointers, charged with the module's footprint and released
//! with it. Their memory is placed at a module's first variable lookup (no guest code
//! runs on the sim, so nothing can touch them before).

use std::collections::BTreeMap;
use std::sync::Mutex;

use vgpu_proto::builtin::{self, KernelSig};

use super::memory::DeviceMemory;
use crate::error::{BackendError, Result};
use crate::module_table::{check_builtin, function_handle, printable, unterminated, ModuleTable};
use crate::sync::lock;
use crate::{module_footprint, FunctionInfo, ModuleGlobal, ModuleImage};

/// The built-in module's variables: name and size. They fit in the module's one-page
/// footprint.
pub const VARIABLES: [(&str, u64); 2] = [("counter", 8), ("table", 1024)];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Module {
    Builtin,
}

/// The module table.
#[derive(Debug, Default)]
pub struct Modules {
    table: ModuleTable<Module>,
    /// Where each module's variables were placed (module -> address of each of
    /// [`VARIABLES`]).
    vars: Mutex<BTreeMap<u64, Vec<u64>>>,
}

impl Modules {
    /// Loads a module, charging its footprint to `mem`.
    pub fn load(&self, mem: &DeviceMemory, image: ModuleImage<'_>) -> Result<u64> {
        let module = match image {
            ModuleImage::Builtin(name) => {
                check_builtin(name)?;
                Module::Builtin
            }
            ModuleImage::Ptx(_) => {
                return Err(BackendError::NotSupported(
                    "the sim backend runs only the built-in kernels; load module \"builtin\", or run on a cuda backend for PTX"
                        .into(),
                ))
            }
            ModuleImage::Binary(_) => {
                return Err(BackendError::NotSupported(
                    "the sim backend has no GPU to run a cubin or fatbin; load module \"builtin\", or run on a cuda backend"
                        .into(),
                ))
            }
        };
        let reservation = self.table.reserve(mem.ledger(), module_footprint(&image))?;
        self.table.insert(module, reservation)
    }

    /// Unloads a module, returning its charge to `mem`.
    pub fn unload(&self, mem: &DeviceMemory, module: u64) -> Result<()> {
        self.table.remove(module, mem.ledger())?;
        for addr in lock(&self.vars).remove(&module).unwrap_or_default() {
            if let Err(e) = mem.free_module(addr) {
                tracing::warn!(module, error = %e, "releasing a module's variable failed");
            }
        }
        Ok(())
    }

    /// Variable `name` of a loaded module: (address, size). Its module's variables are
    /// placed on the first lookup.
    pub fn global(&self, mem: &DeviceMemory, module: u64, name: &[u8]) -> Result<(u64, u64)> {
        let Module::Builtin = self.table.get(module)?;
        let name = unterminated(name);
        let index = VARIABLES
            .iter()
            .position(|(n, _)| n.as_bytes() == name)
            .ok_or_else(|| {
                BackendError::UnknownFunction(format!(
                    "variable \"{}\" in module {module} (the built-in module declares {})",
                    printable(name),
                    VARIABLES.map(|v| v.0).join(", ")
                ))
            })?;
        let mut vars = lock(&self.vars);
        let placed = match vars.entry(module) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => {
                let mut placed = Vec::with_capacity(VARIABLES.len());
                let give_back = |placed: Vec<u64>| {
                    for a in placed {
                        let _ = mem.free_module(a);
                    }
                };
                for (_, size) in VARIABLES {
                    match mem.alloc_module(size) {
                        Ok(a) => placed.push(a),
                        Err(err) => {
                            give_back(placed);
                            return Err(err);
                        }
                    }
                }
                // Unloaded meanwhile (the table lock is not held here): give them back.
                if self.table.get(module).is_err() {
                    give_back(placed);
                    return Err(BackendError::UnknownModule(format!("{module}")));
                }
                e.insert(placed)
            }
        };
        let addr = placed
            .get(index)
            .copied()
            .ok_or_else(|| BackendError::UnknownModule(format!("{module}")))?;
        Ok((addr, VARIABLES[index].1))
    }

    /// Every variable of a loaded module whose variables were placed (none before its
    /// first lookup: nothing can have written them).
    pub fn globals(&self, module: u64) -> Result<Vec<ModuleGlobal>> {
        let Module::Builtin = self.table.get(module)?;
        let Some(placed) = lock(&self.vars).get(&module).cloned() else {
            return Ok(Vec::new());
        };
        Ok(VARIABLES
            .iter()
            .zip(placed)
            .map(|((name, size), addr)| ModuleGlobal {
                name: name.as_bytes().to_vec(),
                addr,
                size: *size,
            })
            .collect())
    }

    /// Looks a function up by name.
    pub fn function(&self, module: u64, name: &[u8]) -> Result<FunctionInfo> {
        let Module::Builtin = self.table.get(module)?;
        let name = unterminated(name);
        let (index, sig) = builtin::all()
            .enumerate()
            .find(|(_, k)| k.name.as_bytes() == name)
            .ok_or_else(|| {
                BackendError::UnknownFunction(format!("\"{}\" in module {module}", printable(name)))
            })?;
        Ok(FunctionInfo {
            handle: function_handle(module, index),
            param_count: sig.params.len() as u32,
        })
    }

    /// The kernel behind a function handle, if its module is loaded.
    pub fn kernel(&self, function: u64) -> Result<&'static KernelSig> {
        let (Module::Builtin, index) = self.table.function(function)?;
        builtin::all()
            .nth(index)
            .ok_or_else(|| BackendError::UnknownFunction(format!("handle {function:#x}")))
    }
}
