/* An ordinary CUDA Driver API program, built against include/cuda.h and linked with
 * -lcuda: vgpu-cuda installed as libcuda.so.1 serves it. Exits 0 when every check holds,
 * else prints the failing check and exits 1. */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(call, want)                                                              \
    do {                                                                               \
        CUresult r_ = (call);                                                          \
        if (r_ != (want)) {                                                            \
            const char *n_ = NULL;                                                     \
            cuGetErrorName(r_, &n_);                                                   \
            fprintf(stderr, "line %d: %s returned %d (%s), want %d\n", __LINE__, #call, \
                    (int)r_, n_ ? n_ : "?", (int)(want));                              \
            return 1;                                                                  \
        }                                                                              \
    } while (0)
#define OK(call) CHECK(call, CUDA_SUCCESS)
#define EXPECT(cond)                                                                   \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            fprintf(stderr, "line %d: %s\n", __LINE__, #cond);                         \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

static const char PTX[] =
    ".version 8.0\n.target sm_90\n.address_size 64\n"
    ".visible .entry twice(.param .u64 p, .param .u32 n)\n{\n ret;\n}\n";

int main(int argc, char **argv) {
    enum { N = 4096 };
    static float a[N], b[N], c[N];
    CUdevice dev;
    CUcontext ctx;
    CUdeviceptr da, db, dc;
    CUmodule mod;
    CUfunction vadd;
    CUstream s;
    CUevent e0, e1;
    char name[64];
    int v;
    size_t free_b, total_b;
    float ms;
    unsigned long long n = N;
    void *params[4];
    float *pinned;

    CHECK(cuMemAlloc(&da, 16), CUDA_ERROR_NOT_INITIALIZED);
    if (argc > 1 && strcmp(argv[1], "nodevice") == 0) {
        /* VGPU_SOCKET names nothing: no device, and the library stays uninitialised. */
        CHECK(cuInit(0), CUDA_ERROR_NO_DEVICE);
        CHECK(cuInit(0), CUDA_ERROR_NO_DEVICE);
        CHECK(cuDeviceGetCount(&v), CUDA_ERROR_NOT_INITIALIZED);
        /* What every call answers once the vGPU is deleted has a name and a text. */
        const char *text = NULL;
        OK(cuGetErrorName(CUDA_ERROR_DEVICE_UNAVAILABLE, &text));
        EXPECT(text && strcmp(text, "CUDA_ERROR_DEVICE_UNAVAILABLE") == 0);
        OK(cuGetErrorString(CUDA_ERROR_DEVICE_UNAVAILABLE, &text));
        EXPECT(text && strstr(text, "unavailable"));
        printf("ok\n");
        return 0;
    }
    OK(cuInit(0));
    OK(cuDeviceGetCount(&v));
    EXPECT(v == 1);
    OK(cuDeviceGet(&dev, 0));
    OK(cuDeviceGetName(name, sizeof name, dev));
    EXPECT(strncmp(name, "vGPU", 4) == 0);
    OK(cuDeviceGetAttribute(&v, CU_DEVICE_ATTRIBUTE_WARP_SIZE, dev));
    EXPECT(v == 32);
    OK(cuCtxCreate(&ctx, 0, dev));
    OK(cuMemGetInfo(&free_b, &total_b));
    EXPECT(free_b <= total_b && total_b > 0);

    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 1.0f;
    }
    OK(cuMemAlloc(&da, sizeof a));
    OK(cuMemAlloc(&db, sizeof b));
    OK(cuMemAlloc(&dc, sizeof c));
    OK(cuMemcpyHtoD(da, a, sizeof a));
    OK(cuMemcpyHtoD(db, b, sizeof b));
    OK(cuMemsetD32(dc, 0, N));

    OK(cuModuleLoadData(&mod, "vgpu:builtin"));
    OK(cuModuleGetFunction(&vadd, mod, "vector_add"));
    CHECK(cuModuleGetFunction(&vadd, mod, "nope"), CUDA_ERROR_NOT_FOUND);
    OK(cuModuleGetFunction(&vadd, mod, "vector_add"));
    OK(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
    OK(cuEventCreate(&e0, CU_EVENT_DEFAULT));
    OK(cuEventCreate(&e1, CU_EVENT_DEFAULT));
    params[0] = &da;
    params[1] = &db;
    params[2] = &dc;
    params[3] = &n;
    OK(cuEventRecord(e0, s));
    OK(cuLaunchKernel(vadd, N / 256, 1, 1, 256, 1, 1, 0, s, params, NULL));
    OK(cuEventRecord(e1, s));
    OK(cuMemAllocHost((void **)&pinned, sizeof c));
    OK(cuMemcpyDtoHAsync(pinned, dc, sizeof c, s));
    OK(cuStreamSynchronize(s));
    OK(cuEventElapsedTime(&ms, e0, e1));
    EXPECT(ms >= 0.0f);
    for (int i = 0; i < N; i++)
        EXPECT(pinned[i] == (float)i + 1.0f);

    /* The sim backend runs built-in kernels only. */
    CHECK(cuModuleLoadData(&mod, PTX), CUDA_ERROR_NO_BINARY_FOR_GPU);
    /* Bad input. */
    CHECK(cuLaunchKernel(vadd, 1, 1, 1, 4096, 1, 1, 0, s, params, NULL), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemcpyDtoH(c, dc + sizeof c, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemcpyHtoD(dc, NULL, 4), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuStreamDestroy((CUstream)0x4242), CUDA_ERROR_INVALID_HANDLE);
    OK(cuMemFree(dc));
    CHECK(cuMemFree(dc), CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemcpyDtoH(c, dc, 4), CUDA_ERROR_INVALID_VALUE);

    OK(cuEventDestroy(e0));
    OK(cuEventDestroy(e1));
    OK(cuStreamDestroy(s));
    OK(cuMemFreeHost(pinned));
    OK(cuMemFree(da));
    OK(cuMemFree(db));
    OK(cuModuleUnload(mod));
    OK(cuCtxDestroy(ctx));
    printf("ok\n");
    return 0;
}
