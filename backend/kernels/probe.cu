// The isolation test's probe (backend/tests/isolation.rs): reads one u64 through a raw
// pointer and stores it. Pointed at memory another context or process owns, it shows
// whether that memory is reachable.
//
// Regenerate probe.ptx with build-ptx.sh (nvcc) after editing.

extern "C" __global__ void probe_read(const unsigned long long *src,
                                      unsigned long long *dst) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        dst[0] = *(volatile const unsigned long long *)src;
    }
}
