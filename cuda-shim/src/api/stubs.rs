//! Functions a program commonly calls that a vGPU does not offer (the table's
//! `not_supported` rows, `table.rs`): each answers CUDA_ERROR_NOT_SUPPORTED and logs its
//! name once. They take no arguments on purpose: a C caller's arguments are simply
//! ignored (the x86-64 and AArch64 C conventions let the callee ignore them), so one shape
//! fits every signature.

use std::collections::HashSet;
use std::sync::Mutex;

/// Logs `what` at warn level the first time only.
pub fn log_once(what: &str) {
    static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    if seen
        .get_or_insert_with(HashSet::new)
        .insert(what.to_string())
    {
        tracing::warn!("{what} is not supported on a vGPU: answering CUDA_ERROR_NOT_SUPPORTED");
    }
}

/// Defines each named function as an exported one that answers CUDA_ERROR_NOT_SUPPORTED
/// (the table's `not_supported` rows, `table.rs`).
macro_rules! not_supported {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() -> $crate::types::CUresult {
                $crate::guard(stringify!($name), || {
                    $crate::api::stubs::log_once(stringify!($name));
                    Err($crate::types::res::NOT_SUPPORTED)
                })
            }
        )*
    };
}
pub(crate) use not_supported;
