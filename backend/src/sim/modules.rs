//! Loaded modules and function handles of one vGPU on the sim device.
//!
//! A function handle is `(module << 16) | (kernel index + 1)`: valid exactly while its
//! module is loaded, so no per-function table is needed.

use vgpu_proto::builtin::{self, KernelSig};

use super::memory::DeviceMemory;
use crate::error::{BackendError, Result};
use crate::module_table::{check_builtin, function_handle, printable, unterminated, ModuleTable};
use crate::{module_footprint, FunctionInfo, ModuleImage};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Module {
    Builtin,
}

/// The module table.
#[derive(Debug, Default)]
pub struct Modules {
    table: ModuleTable<Module>,
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
        self.table.remove(module, mem.ledger()).map(|_| ())
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
