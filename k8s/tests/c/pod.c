/* A pod's CUDA program: built against include/cuda.h and linked with -lcuda (the vGPU
 * library, found through LD_LIBRARY_PATH; the vGPU through VGPU_SOCKET). It checks one
 * vector_add, then for SECS seconds launches rounds of SPINS spin kernels of US µs each,
 * round-robin on STREAMS streams, and prints "ok kernels=N". Exits 1 on a CUDA error or a
 * wrong result. Usage: pod SECS US SPINS STREAMS */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define OK(call)                                                                       \
    do {                                                                               \
        CUresult r_ = (call);                                                          \
        if (r_ != CUDA_SUCCESS) {                                                      \
            const char *n_ = NULL;                                                     \
            cuGetErrorName(r_, &n_);                                                   \
            fprintf(stderr, "line %d: %s returned %s\n", __LINE__, #call, n_ ? n_ : "?"); \
            return 1;                                                                  \
        }                                                                              \
    } while (0)

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    enum { N = 1024, MAX_STREAMS = 8 };
    static float a[N], b[N], c[N];
    double secs = argc > 1 ? atof(argv[1]) : 1.0;
    unsigned long long us = argc > 2 ? strtoull(argv[2], NULL, 10) : 1000;
    int spins = argc > 3 ? atoi(argv[3]) : 4;
    int nstreams = argc > 4 ? atoi(argv[4]) : 1;
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction vadd, spin;
    CUdeviceptr da, db, dc;
    CUstream streams[MAX_STREAMS];
    unsigned long long n = N, kernels = 0;
    void *vp[4] = {&da, &db, &dc, &n};
    void *sp[1] = {&us};

    if (nstreams < 1 || nstreams > MAX_STREAMS || spins < 1) {
        fprintf(stderr, "usage: pod SECS US SPINS STREAMS(1..8)\n");
        return 2;
    }
    OK(cuInit(0));
    OK(cuDeviceGet(&dev, 0));
    OK(cuCtxCreate(&ctx, 0, dev));
    OK(cuModuleLoadData(&mod, "vgpu:builtin"));
    OK(cuModuleGetFunction(&vadd, mod, "vector_add"));
    OK(cuModuleGetFunction(&spin, mod, "spin"));
    for (int i = 0; i < N; i++) {
        a[i] = (float)i;
        b[i] = 2.0f;
    }
    OK(cuMemAlloc(&da, sizeof a));
    OK(cuMemAlloc(&db, sizeof b));
    OK(cuMemAlloc(&dc, sizeof c));
    OK(cuMemcpyHtoD(da, a, sizeof a));
    OK(cuMemcpyHtoD(db, b, sizeof b));
    OK(cuLaunchKernel(vadd, N / 256, 1, 1, 256, 1, 1, 0, NULL, vp, NULL));
    OK(cuCtxSynchronize());
    OK(cuMemcpyDtoH(c, dc, sizeof c));
    for (int i = 0; i < N; i++) {
        if (c[i] != (float)i + 2.0f) {
            fprintf(stderr, "element %d is %f\n", i, c[i]);
            return 1;
        }
    }
    kernels++;
    for (int s = 0; s < nstreams; s++)
        OK(cuStreamCreate(&streams[s], CU_STREAM_NON_BLOCKING));
    double end = now() + secs;
    while (now() < end) {
        for (int k = 0; k < spins; k++) {
            OK(cuLaunchKernel(spin, 1, 1, 1, 256, 1, 1, 0, streams[k % nstreams], sp, NULL));
            kernels++;
        }
        OK(cuCtxSynchronize());
    }
    OK(cuCtxDestroy(ctx));
    printf("ok kernels=%llu\n", kernels);
    return 0;
}
