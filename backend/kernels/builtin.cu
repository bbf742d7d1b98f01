// The built-in kernels of module "builtin" for the cuda backend.
//
// Semantics are those of docs/protocol.md ("Built-in kernels") and of the sim backend
// (backend/src/sim/kernels.rs), bit for bit: every f32 multiply and add is rounded on its
// own (__fmul_rn / __fadd_rn, so the compiler cannot contract them into an FMA),
// reduce_sum and matmul keep the documented summation order, checksum is the documented
// FNV-1a. The host (backend/src/cuda/builtin.rs) has already checked every pointer's extent
// against the vGPU's allocation table before any of these runs.
//
// Parameters are the guest-visible ones in order, Int parameters widened to u64, plus
// host-owned scratch pointers at the end where noted. Element-wise kernels use a
// grid-stride loop, so the host picks the grid (the guest's geometry is ignored, as the
// protocol says).
//
// Regenerate builtin.ptx with build-ptx.sh (nvcc) after editing.

typedef unsigned int u32;
typedef unsigned long long u64;

// Elements each reduce_sum block sums in order (docs/protocol.md).
#define REDUCE_BLOCK 65536ull

__device__ __forceinline__ u64 global_index() {
    return (u64)blockIdx.x * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ u64 grid_stride() {
    return (u64)gridDim.x * blockDim.x;
}

// c[i] = a[i] + b[i], i < n (f32).
extern "C" __global__ void vector_add(const float *__restrict__ a, const float *__restrict__ b,
                                      float *__restrict__ c, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        c[i] = __fadd_rn(a[i], b[i]);
    }
}

// y[i] = alpha * x[i] + y[i], i < n: two roundings, never an FMA.
extern "C" __global__ void saxpy(float alpha, const float *__restrict__ x, float *y, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        y[i] = __fadd_rn(__fmul_rn(alpha, x[i]), y[i]);
    }
}

// dst[i] = value (32-bit pattern), i < n.
extern "C" __global__ void fill(u32 *dst, u32 value, u64 n) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        dst[i] = value;
    }
}

// Phase 1 of reduce_sum: partial[b] = sum of x[b*65536 .. min(n, (b+1)*65536)) in order,
// in f64. One thread per block of elements: the order is the documented one.
extern "C" __global__ void reduce_sum_blocks(const float *__restrict__ x, u64 n,
                                             double *__restrict__ partial, u64 blocks) {
    for (u64 b = global_index(); b < blocks; b += grid_stride()) {
        u64 lo = b * REDUCE_BLOCK;
        u64 hi = lo + REDUCE_BLOCK < n ? lo + REDUCE_BLOCK : n;
        double s = 0.0;
        for (u64 i = lo; i < hi; i++) {
            s = __dadd_rn(s, (double)x[i]);
        }
        partial[b] = s;
    }
}

// Phase 2 of reduce_sum: out[0] = (f32) sum of partial[0..blocks) in order, in f64.
extern "C" __global__ void reduce_sum_final(const double *__restrict__ partial, u64 blocks,
                                            float *__restrict__ out) {
    if (global_index() != 0) {
        return;
    }
    double s = 0.0;
    for (u64 b = 0; b < blocks; b++) {
        s = __dadd_rn(s, partial[b]);
    }
    out[0] = __double2float_rn(s);
}

// c[i][j] = sum over l < k of a[i][l] * b[l][j], row-major f32, accumulated in f32 in
// order of l (each product and each sum rounded on its own).
extern "C" __global__ void matmul(const float *__restrict__ a, const float *__restrict__ b,
                                  float *__restrict__ c, u64 m, u64 n, u64 k) {
    u64 total = m * n; // the host checked that m * n * k does not overflow
    for (u64 t = global_index(); t < total; t += grid_stride()) {
        u64 i = t / n;
        u64 j = t - i * n;
        const float *ar = a + i * k;
        float acc = 0.0f;
        for (u64 l = 0; l < k; l++) {
            acc = __fadd_rn(acc, __fmul_rn(ar[l], b[l * n + j]));
        }
        c[t] = acc;
    }
}

// dst[i] = src[idx[i]], i < n. An index >= src_len is never dereferenced: the lowest such
// i is recorded in *fault (which the host set to all ones), and the host reports
// KERNEL_FAULT. The vGPU's context stays healthy.
extern "C" __global__ void gather(const u32 *__restrict__ src, const u32 *__restrict__ idx,
                                  u32 *__restrict__ dst, u64 n, u64 src_len,
                                  u64 *__restrict__ fault) {
    for (u64 i = global_index(); i < n; i += grid_stride()) {
        u32 j = idx[i];
        if ((u64)j < src_len) {
            dst[i] = src[j];
        } else {
            atomicMin(fault, i);
        }
    }
}

__device__ __forceinline__ u64 globaltimer_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

// Busy for duration_ns nanoseconds of device time; one thread, touches no memory.
extern "C" __global__ void spin(u64 duration_ns) {
    if (global_index() != 0) {
        return;
    }
    u64 start = globaltimer_ns();
    while (globaltimer_ns() - start < duration_ns) {
        // keep the multiprocessor busy: nothing to do but read the clock
    }
}

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

__device__ __forceinline__ u64 fnv_byte(u64 h, u32 b) {
    return (h ^ (u64)b) * FNV_PRIME;
}

// out[0] = 64-bit FNV-1a of data[0..n). FNV-1a is a sequential chain, so one thread walks
// the bytes: unaligned head bytes, then aligned 64-bit words (bytes in little-endian
// order), then the tail.
extern "C" __global__ void checksum(const unsigned char *__restrict__ data, u64 n,
                                    u64 *__restrict__ out) {
    if (global_index() != 0) {
        return;
    }
    u64 h = FNV_OFFSET;
    u64 head = (8 - ((u64)data & 7)) & 7;
    if (head > n) {
        head = n;
    }
    for (u64 i = 0; i < head; i++) {
        h = fnv_byte(h, data[i]);
    }
    const u64 *words = (const u64 *)(data + head);
    u64 nwords = (n - head) / 8;
    for (u64 w = 0; w < nwords; w++) {
        u64 v = words[w];
#pragma unroll
        for (int s = 0; s < 64; s += 8) {
            h = fnv_byte(h, (u32)((v >> s) & 0xff));
        }
    }
    for (u64 i = head + nwords * 8; i < n; i++) {
        h = fnv_byte(h, data[i]);
    }
    out[0] = h;
}
