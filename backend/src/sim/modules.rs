//! Loaded modules and function handles of one vGPU on the sim device.
//!
//! A function handle is `(module << 16) | (kernel index + 1)`: valid exactly while its
//! module is loaded, so no per-function table is needed.

use std::collections::BTreeMap;
use std::sync::Mutex;

use vgpu_proto::builtin::{self, KernelSig};
use vgpu_proto::BUILTIN_MODULE;

use crate::error::{BackendError, Result};
use crate::sync::lock;
use crate::{FunctionInfo, ModuleImage};

/// Most modules one vGPU may have loaded at once.
pub const MAX_MODULES: usize = 64;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Module {
    Builtin,
}

#[derive(Debug)]
struct Table {
    next: u64,
    loaded: BTreeMap<u64, Module>,
}

/// The module table.
#[derive(Debug)]
pub struct Modules {
    table: Mutex<Table>,
}

impl Default for Modules {
    fn default() -> Self {
        Self {
            table: Mutex::new(Table {
                next: 1,
                loaded: BTreeMap::new(),
            }),
        }
    }
}

fn printable(name: &[u8]) -> String {
    String::from_utf8_lossy(name.get(..64).unwrap_or(name)).into_owned()
}

impl Modules {
    /// Loads a module.
    pub fn load(&self, image: ModuleImage<'_>) -> Result<u64> {
        let module = match image {
            ModuleImage::Builtin(name) => {
                let name = name.strip_suffix(&[0]).unwrap_or(name);
                if name != BUILTIN_MODULE.as_bytes() {
                    return Err(BackendError::UnknownModule(format!("\"{}\"", printable(name))));
                }
                Module::Builtin
            }
            ModuleImage::Ptx(_) => {
                return Err(BackendError::NotSupported(
                    "the sim backend runs only the built-in kernels; load module \"builtin\", or run on a cuda backend for PTX"
                        .into(),
                ))
            }
        };
        let mut t = lock(&self.table);
        if t.loaded.len() >= MAX_MODULES {
            return Err(BackendError::TooMany {
                what: "loaded modules",
                limit: MAX_MODULES,
            });
        }
        // Handles are never reused; 2^48 loads would be needed to run out.
        if t.next >= 1 << 48 {
            return Err(BackendError::TooMany {
                what: "module loads over the vGPU's life",
                limit: 1 << 48,
            });
        }
        let handle = t.next;
        t.next += 1;
        t.loaded.insert(handle, module);
        tracing::debug!(handle, "module loaded");
        Ok(handle)
    }

    /// Unloads a module.
    pub fn unload(&self, module: u64) -> Result<()> {
        let mut t = lock(&self.table);
        t.loaded
            .remove(&module)
            .map(|_| ())
            .ok_or_else(|| BackendError::UnknownModule(format!("handle {module}")))
    }

    /// Looks a function up by name.
    pub fn function(&self, module: u64, name: &[u8]) -> Result<FunctionInfo> {
        let t = lock(&self.table);
        match t.loaded.get(&module) {
            Some(Module::Builtin) => {}
            None => return Err(BackendError::UnknownModule(format!("handle {module}"))),
        }
        let name = name.strip_suffix(&[0]).unwrap_or(name);
        let (index, sig) = builtin::all()
            .enumerate()
            .find(|(_, k)| k.name.as_bytes() == name)
            .ok_or_else(|| {
                BackendError::UnknownFunction(format!("\"{}\" in module {module}", printable(name)))
            })?;
        Ok(FunctionInfo {
            handle: (module << 16) | (index as u64 + 1),
            param_count: sig.params.len() as u32,
        })
    }

    /// The kernel behind a function handle, if its module is loaded.
    pub fn kernel(&self, function: u64) -> Result<&'static KernelSig> {
        let unknown = || BackendError::UnknownFunction(format!("handle {function:#x}"));
        let module = function >> 16;
        let index = (function & 0xffff).checked_sub(1).ok_or_else(unknown)? as usize;
        let t = lock(&self.table);
        match t.loaded.get(&module) {
            Some(Module::Builtin) => builtin::all().nth(index).ok_or_else(unknown),
            None => Err(unknown()),
        }
    }
}
