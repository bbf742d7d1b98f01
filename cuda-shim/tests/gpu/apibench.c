/* Driver-API figures of whatever libcuda.so.1 the loader picks: the real driver natively,
 * the vGPU library when it comes first on the library path (VGPU_SOCKET naming a worker).
 * Built with gcc against the toolkit's cuda.h and -lcuda, like vecadd.c.
 *
 *   (a) HtoD and DtoH copy bandwidth from cuMemAllocHost memory, 4 KiB to 1 GiB (best of
 *       a few trials, each of several copies for the small sizes);
 *   (b) a null-kernel launch plus cuCtxSynchronize, round trip (median of 1000);
 *   (c) asynchronous null launches per second (10 000 launches on a stream, one sync;
 *       best of 3).
 *
 * Every figure is one line: `FIG <name> <value> <unit>`; the last line is `APIBENCH OK`.
 *
 * Usage: apibench [MAX_MIB]   (largest copy in MiB, default 1024; 0: no copies, only the
 *                             launch figures)
 */
#define _POSIX_C_SOURCE 199309L
#include <cuda.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CHECK(call)                                                                   \
    do {                                                                              \
        CUresult rc_ = (call);                                                        \
        if (rc_ != CUDA_SUCCESS) {                                                    \
            const char *name_ = "?";                                                  \
            cuGetErrorName(rc_, &name_);                                              \
            fprintf(stderr, "apibench: %s failed: %s (%d)\n", #call, name_, (int)rc_); \
            exit(1);                                                                  \
        }                                                                             \
    } while (0)

/* A kernel that does nothing, as PTX text (JIT-compiled by whichever driver loads it). */
static const char NULL_PTX[] = ".version 8.0\n"
                               ".target sm_90\n"
                               ".address_size 64\n"
                               ".visible .entry null_kernel()\n"
                               "{\n"
                               "\tret;\n"
                               "}\n";

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void size_name(size_t bytes, char *out, size_t n)
{
    if (bytes >= (1u << 30))
        snprintf(out, n, "%zuGiB", bytes >> 30);
    else if (bytes >= (1u << 20))
        snprintf(out, n, "%zuMiB", bytes >> 20);
    else
        snprintf(out, n, "%zuKiB", bytes >> 10);
}

int main(int argc, char **argv)
{
    size_t max_mib = argc > 1 ? (size_t)atol(argv[1]) : 1024;
    static const size_t sizes[] = {4u << 10, 64u << 10, 1u << 20, 16u << 20,
                                   64u << 20, 256u << 20, 1u << 30};
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUstream stream;
    char name[128];

    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDeviceGetName(name, sizeof name, dev));
    printf("apibench: device %s\n", name);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));

    /* (a) copies */
    size_t largest = 0;
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++)
        if (sizes[i] <= (max_mib << 20))
            largest = sizes[i];
    void *host = NULL;
    CUdeviceptr dptr = 0;
    if (largest > 0) {
        CHECK(cuMemAllocHost(&host, largest));
        memset(host, 0x5a, largest);
        CHECK(cuMemAlloc(&dptr, largest));
        for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
            size_t bytes = sizes[i];
            if (bytes > largest)
                break;
            int inner = bytes < (1u << 20) ? 200 : bytes < (64u << 20) ? 10 : 1;
            int trials = bytes >= (256u << 20) ? 3 : 5;
            char sz[32];
            size_name(bytes, sz, sizeof sz);
            for (int dir = 0; dir < 2; dir++) {
                double best = 1e30;
                /* one untimed copy first */
                if (dir == 0)
                    CHECK(cuMemcpyHtoD(dptr, host, bytes));
                else
                    CHECK(cuMemcpyDtoH(host, dptr, bytes));
                for (int t = 0; t < trials; t++) {
                    double t0 = now_s();
                    for (int k = 0; k < inner; k++) {
                        if (dir == 0)
                            CHECK(cuMemcpyHtoD(dptr, host, bytes));
                        else
                            CHECK(cuMemcpyDtoH(host, dptr, bytes));
                    }
                    double dt = (now_s() - t0) / inner;
                    if (dt < best)
                        best = dt;
                }
                printf("FIG %s_%s %.3f GB/s\n", dir == 0 ? "htod" : "dtoh", sz,
                       (double)bytes / best / 1e9);
                fflush(stdout);
            }
        }
        CHECK(cuMemFree(dptr));
        CHECK(cuMemFreeHost(host));
    }

    /* (b) null kernel + cuCtxSynchronize */
    CHECK(cuModuleLoadData(&mod, NULL_PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "null_kernel"));
    enum { RTT = 1000, WARM = 100, ASYNC = 10000 };
    static double rtt[RTT];
    for (int i = 0; i < WARM; i++) {
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuCtxSynchronize());
    }
    for (int i = 0; i < RTT; i++) {
        double t0 = now_s();
        CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, NULL));
        CHECK(cuCtxSynchronize());
        rtt[i] = now_s() - t0;
    }
    qsort(rtt, RTT, sizeof rtt[0], cmp_double);
    printf("FIG launch_sync_rtt %.2f us\n", rtt[RTT / 2] * 1e6);
    printf("apibench: round trip p10 %.2f us, p90 %.2f us\n", rtt[RTT / 10] * 1e6,
           rtt[RTT * 9 / 10] * 1e6);

    /* (c) asynchronous launches on a stream */
    CHECK(cuStreamCreate(&stream, CU_STREAM_NON_BLOCKING));
    double best = 1e30;
    for (int t = 0; t < 3; t++) {
        double t0 = now_s();
        for (int i = 0; i < ASYNC; i++)
            CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, stream, NULL, NULL));
        CHECK(cuStreamSynchronize(stream));
        double dt = now_s() - t0;
        if (dt < best)
            best = dt;
    }
    printf("FIG async_launches %.0f launches/s\n", ASYNC / best);
    CHECK(cuStreamDestroy(stream));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("APIBENCH OK\n");
    return 0;
}
