/* An unmodified CUDA driver-API program: loads a module file (PTX text or a cubin) with
 * cuModuleLoad, adds two vectors with its `vecadd` kernel and checks every element.
 * Built with gcc against the toolkit's cuda.h and -lcuda; run natively and on a vGPU
 * (LD_LIBRARY_PATH pointing at the vGPU library, VGPU_SOCKET at a worker).
 *
 * Usage: vecadd MODULE_FILE [N]
 */
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>

#define CHECK(call)                                                                 \
    do {                                                                            \
        CUresult rc_ = (call);                                                      \
        if (rc_ != CUDA_SUCCESS) {                                                  \
            const char *name_ = "?";                                                \
            cuGetErrorName(rc_, &name_);                                            \
            fprintf(stderr, "vecadd: %s failed: %s (%d)\n", #call, name_, (int)rc_); \
            return 1;                                                               \
        }                                                                           \
    } while (0)

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "usage: vecadd MODULE_FILE [N]\n");
        return 2;
    }
    int n = argc > 2 ? atoi(argv[2]) : 1 << 20;
    size_t bytes = (size_t)n * sizeof(float);
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr da, db, dc;
    char name[128];
    int major = 0, minor = 0, sms = 0;
    size_t total = 0;

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
    CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
    CHECK(cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev));
    CHECK(cuDeviceTotalMem(&total, dev));
    printf("vecadd: device %s, cc %d.%d, %d SMs, %zu MiB\n", name, major, minor, sms,
           total >> 20);
    /* The primary context: the same call in every CUDA version's cuda.h. */
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoad(&mod, argv[1]));
    CHECK(cuModuleGetFunction(&fn, mod, "vecadd"));

    float *ha = malloc(bytes), *hb = malloc(bytes), *hc = malloc(bytes);
    if (!ha || !hb || !hc) {
        fprintf(stderr, "vecadd: out of host memory\n");
        return 1;
    }
    for (int i = 0; i < n; i++) {
        ha[i] = (float)i;
        hb[i] = 0.5f * (float)i;
        hc[i] = -1.0f;
    }
    CHECK(cuMemAlloc(&da, bytes));
    CHECK(cuMemAlloc(&db, bytes));
    CHECK(cuMemAlloc(&dc, bytes));
    CHECK(cuMemcpyHtoD(da, ha, bytes));
    CHECK(cuMemcpyHtoD(db, hb, bytes));
    void *params[] = {&da, &db, &dc, &n};
    unsigned block = 256, grid = (unsigned)((n + block - 1) / block);
    CHECK(cuLaunchKernel(fn, grid, 1, 1, block, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(hc, dc, bytes));
    for (int i = 0; i < n; i++) {
        if (hc[i] != 1.5f * (float)i) {
            fprintf(stderr, "vecadd: element %d is %f, want %f\n", i, hc[i], 1.5f * (float)i);
            return 1;
        }
    }
    CHECK(cuMemFree(da));
    CHECK(cuMemFree(db));
    CHECK(cuMemFree(dc));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    free(ha);
    free(hb);
    free(hc);
    printf("VECADD OK %s n=%d\n", argv[1], n);
    return 0;
}
