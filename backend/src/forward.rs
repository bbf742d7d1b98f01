//! [`forward_backend!`](crate::forward_backend): a wrapper's [`Backend`](crate::Backend)
//! methods that it does not change, forwarded to the backend it wraps, so the wrapper spells
//! out only what it changes. The capability accessors are methods like the others: a
//! wrapper names each one, here or in its own implementation.

/// Implements the named [`Backend`](crate::Backend) methods by calling the same method on
/// the field `$field` (an `Arc<dyn Backend>`, a concrete backend, or a tuple index). Used
/// inside an `impl Backend for ...` block:
///
/// ```ignore
/// impl Backend for Logged {
///     fn alloc(&self, size: u64) -> Result<Allocated> { /* changed */ }
///     vgpu_backend::forward_backend!(inner: info, memory_usage, free, check_range,
///         paging, relocation, shared_memory, host_memory);
/// }
/// ```
#[macro_export]
macro_rules! forward_backend {
    ($field:tt : $($method:ident),+ $(,)?) => {
        $( $crate::forward_backend!(@one $field $method); )+
    };
    (@one $f:tt info) => {
        fn info(&self) -> &$crate::BackendInfo {
            self.$f.info()
        }
    };
    (@one $f:tt memory_usage) => {
        fn memory_usage(&self) -> $crate::MemoryUsage {
            self.$f.memory_usage()
        }
    };
    (@one $f:tt alloc) => {
        fn alloc(&self, size: u64) -> $crate::Result<$crate::Allocated> {
            self.$f.alloc(size)
        }
    };
    (@one $f:tt free) => {
        fn free(&self, addr: u64) -> $crate::Result<()> {
            self.$f.free(addr)
        }
    };
    (@one $f:tt check_range) => {
        fn check_range(&self, addr: u64, len: u64) -> $crate::Result<()> {
            self.$f.check_range(addr, len)
        }
    };
    (@one $f:tt copy_htod) => {
        fn copy_htod(
            &self,
            dst: u64,
            src: &$crate::__private::VolatileSlice<'_>,
        ) -> $crate::Result<u64> {
            self.$f.copy_htod(dst, src)
        }
    };
    (@one $f:tt copy_dtoh) => {
        fn copy_dtoh(
            &self,
            src: u64,
            dst: &$crate::__private::VolatileSlice<'_>,
        ) -> $crate::Result<u64> {
            self.$f.copy_dtoh(src, dst)
        }
    };
    (@one $f:tt copy_dtod) => {
        fn copy_dtod(&self, dst: u64, src: u64, len: u64) -> $crate::Result<u64> {
            self.$f.copy_dtod(dst, src, len)
        }
    };
    (@one $f:tt memset) => {
        fn memset(&self, dst: u64, value: u32, elem_size: u32, count: u64) -> $crate::Result<u64> {
            self.$f.memset(dst, value, elem_size, count)
        }
    };
    (@one $f:tt launch) => {
        fn launch(
            &self,
            launches: &[$crate::Launch<'_>],
        ) -> Vec<$crate::Result<$crate::LaunchStats>> {
            self.$f.launch(launches)
        }
    };
    (@one $f:tt modules) => {
        fn modules(&self) -> &dyn $crate::Modules {
            self.$f.modules()
        }
    };
    (@one $f:tt synchronize) => {
        fn synchronize(&self) {
            self.$f.synchronize()
        }
    };
    (@one $f:tt paging) => {
        fn paging(&self) -> Option<&dyn $crate::Paging> {
            self.$f.paging()
        }
    };
    (@one $f:tt relocation) => {
        fn relocation(&self) -> Option<&dyn $crate::Relocatable> {
            self.$f.relocation()
        }
    };
    (@one $f:tt shared_memory) => {
        fn shared_memory(&self) -> Option<&dyn $crate::SharedMemory> {
            self.$f.shared_memory()
        }
    };
    (@one $f:tt host_memory) => {
        fn host_memory(&self) -> Option<&dyn $crate::HostMemory> {
            self.$f.host_memory()
        }
    };
    (@one $f:tt virtual_memory) => {
        fn virtual_memory(&self) -> Option<&dyn $crate::VirtualMemory> {
            self.$f.virtual_memory()
        }
    };
}
