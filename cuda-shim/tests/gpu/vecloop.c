/* An unmodified CUDA driver-API program that keeps a GPU busy for a while and checks its
 * results all along: per round it launches SPINS `spin` kernels of SPIN_US each, clears
 * the output with `fill`, adds two vectors uploaded once with `vecadd`, copies the sum back
 * and checks every element (so the inputs must survive a live migration). Built with gcc
 * against the toolkit's cuda.h and -lcuda; the cuda-shares GPU step runs two of them on
 * process vGPUs (LD_LIBRARY_PATH at the vGPU library, VGPU_SOCKET at the vGPU's socket).
 *
 * Usage: vecloop MODULE_FILE SECONDS [SPINS [SPIN_US [N]]]
 * Prints "VECLOOP OK rounds=R seconds=S" and exits 0 when every result was right.
 */
#define _POSIX_C_SOURCE 199309L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult rc_ = (call);                                                       \
        if (rc_ != CUDA_SUCCESS) {                                                   \
            const char *name_ = "?";                                                 \
            cuGetErrorName(rc_, &name_);                                             \
            fprintf(stderr, "vecloop: %s failed: %s (%d) after %ld rounds\n", #call, \
                    name_, (int)rc_, rounds);                                        \
            printf("VECLOOP FAIL %s: %s\n", #call, name_);                           \
            return 1;                                                                \
        }                                                                            \
    } while (0)

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

int main(int argc, char **argv)
{
    long rounds = 0;
    if (argc < 3) {
        fprintf(stderr, "usage: vecloop MODULE_FILE SECONDS [SPINS [SPIN_US [N]]]\n");
        return 2;
    }
    double secs = atof(argv[2]);
    int spins = argc > 3 ? atoi(argv[3]) : 8;
    unsigned long long spin_ns = (argc > 4 ? strtoull(argv[4], NULL, 10) : 1000ULL) * 1000ULL;
    int n = argc > 5 ? atoi(argv[5]) : 1 << 20;
    size_t bytes = (size_t)n * sizeof(float);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction spin, fill, vecadd;
    CUdeviceptr da, db, dc;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&spin, mod, "spin"));
    CHECK(cuModuleGetFunction(&fill, mod, "fill"));
    CHECK(cuModuleGetFunction(&vecadd, mod, "vecadd"));
    float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
    if (!ha || !hb || !hc) {
        fprintf(stderr, "vecloop: out of host memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        ha[i] = (float)i;
        hb[i] = 0.5f * (float)(i % 4096);
    }
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, ha, bytes));
    CHECK(cuMemcpyHtoD(db, hb, bytes));
    unsigned block = 256, grid = (unsigned)((n + block - 1) / block);
    float minus_one = -1.0f;
    double start = now(), end = start + secs;
    while (now() < end) {
        void *sp[] = {&spin_ns};
        for (int k = 0; k < spins; k++)
            CHECK(cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, NULL, sp, NULL));
        void *fp[] = {&dc, &minus_one, &n};
        CHECK(cuLaunchKernel(fill, grid, 1, 1, block, 1, 1, 0, NULL, fp, NULL));
        void *vp[] = {&da, &db, &dc, &n};
        CHECK(cuLaunchKernel(vecadd, grid, 1, 1, block, 1, 1, 0, NULL, vp, NULL));
        CHECK(cuCtxSynchronize());
        CHECK(cuMemcpyDtoH(hc, dc, bytes));
        for (int i = 0; i < n; i++) {
            if (hc[i] != ha[i] + hb[i]) {
                fprintf(stderr, "vecloop: round %ld: element %d is %f, want %f\n", rounds + 1,
                        i, hc[i], ha[i] + hb[i]);
                printf("VECLOOP FAIL wrong result in round %ld\n", rounds + 1);
                return 1;
            }
        }
        rounds++;
    }
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(ha);
    free(hb);
    free(hc);
    printf("VECLOOP OK rounds=%ld seconds=%.1f\n", rounds, now() - start);
    return 0;
}
