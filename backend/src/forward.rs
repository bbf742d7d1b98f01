//! [`forward_backend!`](crate::forward_backend): a wrapper's [`Backend`](crate::Backend)
//! methods that it does not change, forwarded to the backend it wraps, so the wrapper spells
//! out only what it changes.

/// Implements the named [`Backend`](crate::Backend) methods by calling the same method on
/// the field `$field` (an `Arc<dyn Backend>`, a concrete backend, or a tuple index). Used
/// inside an `impl Backend for ...` block:
///
/// ```ignore
/// impl Backend for Logged {
///     fn alloc(&self, size: u64) -> Result<Allocated> { /* changed */ }
///     vgpu_backend::forward_backend!(inner: info, memory_usage, free, check_range);
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
    (@one $f:tt module_load) => {
        fn module_load(&self, image: $crate::ModuleImage<'_>) -> $crate::Result<u64> {
            self.$f.module_load(image)
        }
    };
    (@one $f:tt module_unload) => {
        fn module_unload(&self, module: u64) -> $crate::Result<()> {
            self.$f.module_unload(module)
        }
    };
    (@one $f:tt get_function) => {
        fn get_function(&self, module: u64, name: &[u8]) -> $crate::Result<$crate::FunctionInfo> {
            self.$f.get_function(module, name)
        }
    };
    (@one $f:tt param_layout) => {
        fn param_layout(&self, function: u64) -> $crate::Result<$crate::ParamLayout> {
            self.$f.param_layout(function)
        }
    };
    (@one $f:tt function_attributes) => {
        fn function_attributes(
            &self,
            function: u64,
        ) -> $crate::Result<$crate::FunctionAttributes> {
            self.$f.function_attributes(function)
        }
    };
    (@one $f:tt launch) => {
        fn launch(
            &self,
            function: u64,
            config: &$crate::LaunchConfig,
            args: &[$crate::ArgValue],
        ) -> $crate::Result<$crate::LaunchStats> {
            self.$f.launch(function, config, args)
        }
    };
    (@one $f:tt launch_with_params) => {
        fn launch_with_params(
            &self,
            function: u64,
            config: &$crate::LaunchConfig,
            args: &[$crate::ArgValue],
            blob: &[u8],
        ) -> $crate::Result<$crate::LaunchStats> {
            self.$f.launch_with_params(function, config, args, blob)
        }
    };
    (@one $f:tt launch_batch) => {
        fn launch_batch(
            &self,
            items: &[$crate::BatchLaunch<'_>],
        ) -> Vec<$crate::Result<$crate::LaunchStats>> {
            self.$f.launch_batch(items)
        }
    };
    (@one $f:tt module_global) => {
        fn module_global(&self, module: u64, name: &[u8]) -> $crate::Result<(u64, u64)> {
            self.$f.module_global(module, name)
        }
    };
    (@one $f:tt synchronize) => {
        fn synchronize(&self) {
            self.$f.synchronize()
        }
    };
    (@one $f:tt register_host_memory) => {
        fn register_host_memory(&self, regions: &[$crate::HostRegion]) -> $crate::Result<()> {
            self.$f.register_host_memory(regions)
        }
    };
    (@one $f:tt unregister_host_memory) => {
        fn unregister_host_memory(&self, regions: &[$crate::HostRegion]) {
            self.$f.unregister_host_memory(regions)
        }
    };
    (@one $f:tt import_shared) => {
        fn import_shared(
            &self,
            handle: $crate::__private::OwnedFd,
            size: u64,
            read_only: bool,
        ) -> $crate::Result<u64> {
            self.$f.import_shared(handle, size, read_only)
        }
    };
    (@one $f:tt export_shared) => {
        fn export_shared(&self, size: u64) -> $crate::Result<$crate::__private::OwnedFd> {
            self.$f.export_shared(size)
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
}
