/*
 * The driver API frameworks reach, from C against include/cuda.h, linked with -lcuda:
 * a library's kernel launched with cuLaunchKernelEx, function attributes and occupancy,
 * a pitched allocation filled by cuMemcpy2D and read back by cuMemcpy3D, a 2D memset, a
 * stream-ordered allocation from a pool, a host function, and a stream capture
 * replayed as a graph. Prints "ok" when every result is right.
 */
#include <stdio.h>
#include <string.h>

#include "cuda.h"

#define CHECK(call, want)                                                                  \
    do {                                                                                   \
        CUresult r_ = (call);                                                              \
        if (r_ != (want)) {                                                                \
            fprintf(stderr, "%s:%d: %s answered %d, expected %d\n", __FILE__, __LINE__,     \
                    #call, (int)r_, (int)(want));                                          \
            return 1;                                                                      \
        }                                                                                  \
    } while (0)
#define OK(call) CHECK(call, CUDA_SUCCESS)

#define N 4096

static volatile int host_fn_saw = -1;

static void on_host(void *data) { host_fn_saw = *(volatile int *)data; }

int main(void) {
    CUdevice dev;
    CUcontext ctx;
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuDevicePrimaryCtxRetain(&ctx, dev));
    OK(cuCtxSetCurrent(ctx));
    CUstream s;
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));

    /* A library, its kernel, its attributes. */
    CUlibrary lib;
    CUkernel kern;
    CUfunction f;
    OK(cuLibraryLoadFromFile(&lib, "vgpu:builtin", NULL, NULL, 0, NULL, NULL, 0));
    OK(cuLibraryGetKernel(&kern, lib, "vector_add"));
    OK(cuKernelGetFunction(&f, kern));
    int regs = -1, max_threads = 0;
    OK(cuFuncGetAttribute(&regs, CU_FUNC_ATTRIBUTE_NUM_REGS, f));
    OK(cuFuncGetAttribute(&max_threads, CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, f));
    if (regs != 0 || max_threads != 1024) {
        fprintf(stderr, "attributes: %d registers, %d threads\n", regs, max_threads);
        return 1;
    }
    OK(cuFuncSetAttribute(f, CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, 64 << 10));
    int min_grid = 0, block = 0;
    OK(cuOccupancyMaxPotentialBlockSize(&min_grid, &block, f, NULL, 0, 0));
    if (block <= 0 || block > 1024 || min_grid <= 0) {
        fprintf(stderr, "occupancy: grid %d block %d\n", min_grid, block);
        return 1;
    }

    /* cuLaunchKernelEx: c = a + b, with a priority attribute. */
    CUdeviceptr a, b, c;
    OK(cuMemAlloc(&a, N * sizeof(float)));
    OK(cuMemAlloc(&b, N * sizeof(float)));
    OK(cuMemAlloc(&c, N * sizeof(float)));
    static float ha[N], hb[N], hc[N];
    for (int i = 0; i < N; i++) {
        ha[i] = (float)i;
        hb[i] = 2.0f * (float)i;
    }
    OK(cuMemcpyHtoD(a, ha, sizeof ha));
    OK(cuMemcpyHtoD(b, hb, sizeof hb));
    unsigned long long n = N;
    void *params[] = {&a, &b, &c, &n};
    CUlaunchAttribute attr;
    memset(&attr, 0, sizeof attr);
    attr.id = CU_LAUNCH_ATTRIBUTE_PRIORITY;
    attr.value.priority = 1;
    CUlaunchConfig cfg = {N / 256, 1, 1, 256, 1, 1, 64 << 10, s, &attr, 1};
    OK(cuLaunchKernelEx(&cfg, (CUfunction)kern, params, NULL));
    attr.id = CU_LAUNCH_ATTRIBUTE_COOPERATIVE;
    attr.value.cooperative = 1;
    CHECK(cuLaunchKernelEx(&cfg, f, params, NULL), CUDA_ERROR_NOT_SUPPORTED);
    OK(cuStreamSynchronize(s));
    OK(cuMemcpyDtoH(hc, c, sizeof hc));
    for (int i = 0; i < N; i++) {
        if (hc[i] != 3.0f * (float)i) {
            fprintf(stderr, "c[%d] = %f\n", i, hc[i]);
            return 1;
        }
    }

    /* Pitched memory: 8 rows of 100 bytes in, rows 2..5 from byte 10 out through 3D. */
    CUdeviceptr pitched;
    size_t pitch;
    OK(cuMemAllocPitch(&pitched, &pitch, 100, 8, 4));
    unsigned char rows[8][128], out[4][50];
    for (int r = 0; r < 8; r++)
        for (int x = 0; x < 128; x++) rows[r][x] = (unsigned char)(r * 31 + x);
    CUDA_MEMCPY2D c2;
    memset(&c2, 0, sizeof c2);
    c2.srcMemoryType = CU_MEMORYTYPE_HOST;
    c2.srcHost = rows;
    c2.srcPitch = 128;
    c2.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    c2.dstDevice = pitched;
    c2.dstPitch = pitch;
    c2.WidthInBytes = 100;
    c2.Height = 8;
    OK(cuMemcpy2D(&c2));
    CUDA_MEMCPY3D c3;
    memset(&c3, 0, sizeof c3);
    c3.srcXInBytes = 10;
    c3.srcY = 2;
    c3.srcMemoryType = CU_MEMORYTYPE_DEVICE;
    c3.srcDevice = pitched;
    c3.srcPitch = pitch;
    c3.srcHeight = 8;
    c3.dstMemoryType = CU_MEMORYTYPE_HOST;
    c3.dstHost = out;
    c3.dstPitch = 50;
    c3.dstHeight = 4;
    c3.WidthInBytes = 50;
    c3.Height = 4;
    c3.Depth = 1;
    OK(cuMemcpy3D(&c3));
    for (int r = 0; r < 4; r++)
        if (memcmp(out[r], &rows[r + 2][10], 50) != 0) {
            fprintf(stderr, "pitched row %d differs\n", r);
            return 1;
        }
    c2.Height = 9;
    CHECK(cuMemcpy2D(&c2), CUDA_ERROR_INVALID_VALUE);
    OK(cuMemsetD2D32(pitched, pitch, 0x01020304u, 25, 8));
    OK(cuMemcpy3D(&c3));
    /* 25 words of 0x01020304 a row, little endian: byte i of a row is 4 - i % 4. */
    for (int r = 0; r < 4; r++)
        for (int x = 0; x < 50; x++) {
            int at = 10 + x;
            if (out[r][x] != (unsigned char)(4 - at % 4)) {
                fprintf(stderr, "memset row %d byte %d = %d\n", r, at, out[r][x]);
                return 1;
            }
        }

    /* A pool with a size limit; a stream-ordered allocation and free. */
    CUmemPoolProps props;
    memset(&props, 0, sizeof props);
    props.allocType = 1;
    props.location.type = 1;
    props.location.id = 0;
    props.maxSize = 1 << 20;
    CUmemoryPool pool;
    OK(cuMemPoolCreate(&pool, &props));
    CUdeviceptr p;
    OK(cuMemAllocFromPoolAsync(&p, 4096, pool, s));
    CHECK(cuMemAllocFromPoolAsync(&p, 2 << 20, pool, s), CUDA_ERROR_OUT_OF_MEMORY);
    OK(cuMemsetD32Async(p, 7, 1024, s));
    cuuint64_t used = 0;
    OK(cuMemPoolGetAttribute(pool, 7, &used));
    if (used != 4096) {
        fprintf(stderr, "pool holds %llu\n", (unsigned long long)used);
        return 1;
    }
    OK(cuMemFreeAsync(p, s));

    /* A host function after the stream's copy into pinned memory. */
    int *pinned;
    OK(cuMemAllocHost((void **)&pinned, 4096));
    OK(cuMemsetD32Async(a, 42, 1, s));
    OK(cuMemcpyDtoHAsync(pinned, a, 4, s));
    OK(cuLaunchHostFunc(s, on_host, pinned));
    OK(cuStreamSynchronize(s));
    if (host_fn_saw != 42) {
        fprintf(stderr, "the host function saw %d\n", host_fn_saw);
        return 1;
    }

    /* A capture replayed as a graph: a = 1.0, b = 2.0, c = a + b. */
    OK(cuMemsetD32(c, 0, N));
    OK(cuStreamBeginCapture(s, 0));
    float one = 1.0f, two = 2.0f;
    unsigned int one_bits, two_bits;
    memcpy(&one_bits, &one, 4);
    memcpy(&two_bits, &two, 4);
    OK(cuMemsetD32Async(a, one_bits, N, s));
    OK(cuMemsetD32Async(b, two_bits, N, s));
    OK(cuLaunchKernel(f, N / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
    CUgraph graph;
    OK(cuStreamEndCapture(s, &graph));
    CUgraphExec exec;
    OK(cuGraphInstantiate(&exec, graph, 0));
    OK(cuGraphLaunch(exec, s));
    OK(cuStreamSynchronize(s));
    OK(cuMemcpyDtoH(hc, c, sizeof hc));
    for (int i = 0; i < N; i++)
        if (hc[i] != 3.0f) {
            fprintf(stderr, "graph: c[%d] = %f\n", i, hc[i]);
            return 1;
        }
    OK(cuGraphExecDestroy(exec));
    OK(cuGraphDestroy(graph));
    OK(cuMemPoolDestroy(pool));
    OK(cuLibraryUnload(lib));
    printf("ok\n");
    return 0;
}
