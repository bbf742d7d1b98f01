/* A program that asks NVML about its GPU, as monitoring code and frameworks do, and uses
 * the GPU through CUDA: built against include/nvml.h and cuda-shim's include/cuda.h,
 * linked with -lnvidia-ml -lcuda, run with the installed libraries on a vGPU.
 *
 *   nvml SHARE     every query: the vGPU's memory share is SHARE bytes
 *   nvml count     nvmlInit and nvmlDeviceGetCount_v2 only
 *   nvml hold      holds the vGPU through CUDA (a context, an allocation), prints
 *                  "holding", and keeps it until its standard input closes
 *   nvml busy      another process holds the vGPU: the queries that need it answer
 *                  NVML_ERROR_GPU_IS_LOST, the process list is empty
 *   nvml nodevice  no vGPU is configured
 *
 * Prints "ok" and exits 0 when every check holds, else prints the failing check, exits 1. */
#include <cuda.h>
#include <nvml.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Not in include/cuda.h (the library exports them): as NVIDIA's cuda.h declares them. */
CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev);
#define PCI_DEVICE_ID_ATTRIBUTE ((CUdevice_attribute)34)

#define CHECK(call, want)                                                                   \
    do {                                                                                    \
        nvmlReturn_t r_ = (call);                                                           \
        if (r_ != (want)) {                                                                 \
            fprintf(stderr, "line %d: %s returned %d (%s), want %d\n", __LINE__, #call,     \
                    (int)r_, nvmlErrorString(r_), (int)(want));                             \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)
#define OK(call) CHECK(call, NVML_SUCCESS)
#define CU(call)                                                                            \
    do {                                                                                    \
        CUresult r_ = (call);                                                               \
        if (r_ != CUDA_SUCCESS) {                                                           \
            fprintf(stderr, "line %d: %s returned %d\n", __LINE__, #call, (int)r_);         \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)
#define EXPECT(cond)                                                                        \
    do {                                                                                    \
        if (!(cond)) {                                                                      \
            fprintf(stderr, "line %d: %s\n", __LINE__, #cond);                              \
            return 1;                                                                       \
        }                                                                                   \
    } while (0)

/* Every call that needs the library answers NVML_ERROR_UNINITIALIZED. */
static int uninitialised(nvmlDevice_t dev) {
    unsigned int n = 0;
    nvmlMemory_t mem;
    char text[96];
    nvmlProcessInfo_t procs[4];
    CHECK(nvmlDeviceGetCount_v2(&n), NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &dev), NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlDeviceGetMemoryInfo(dev, &mem), NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlDeviceGetName(dev, text, sizeof text), NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlSystemGetDriverVersion(text, sizeof text), NVML_ERROR_UNINITIALIZED);
    n = 4;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs), NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlDeviceGetPowerUsage(dev, &n), NVML_ERROR_UNINITIALIZED);
    CHECK(nvmlShutdown(), NVML_ERROR_UNINITIALIZED);
    /* What needs no initialisation. */
    EXPECT(strcmp(nvmlErrorString(NVML_ERROR_UNINITIALIZED), "Uninitialized") == 0);
    EXPECT(strcmp(nvmlErrorString((nvmlReturn_t)12345), "Unknown Error") == 0);
    return 0;
}

int main(int argc, char **argv) {
    nvmlDevice_t dev = NULL, other = NULL, bad = (nvmlDevice_t)(size_t)0x1000;
    unsigned int n = 0, idx = 7;
    char text[NVML_DEVICE_NAME_V2_BUFFER_SIZE], cutext[128];
    nvmlMemory_t mem, mem2;
    nvmlMemory_v2_t m2;
    nvmlUtilization_t util;
    nvmlPciInfo_t pci;
    nvmlProcessInfo_t procs[4];
    nvmlProcessInfo_v1_t procs1[4];
    nvmlComputeMode_t mode;
    int major = 0, minor = 0, cu_major = 0, cu_minor = 0, version = 0;
    CUdevice cudev;
    CUcontext ctx;
    CUdeviceptr d;
    CUuuid uuid;
    size_t cu_free, cu_total;

    if (argc < 2)
        return 2;
    if (uninitialised(dev))
        return 1;
    if (strcmp(argv[1], "hold") == 0) {
        CU(cuInit(0));
        CU(cuCtxCreate(&ctx, 0, 0));
        CU(cuMemAlloc(&d, 1 << 20));
        printf("holding\n");
        fflush(stdout);
        while (getchar() != EOF) {
        }
        return 0;
    }
    if (strcmp(argv[1], "nodevice") == 0) {
        CHECK(nvmlInit_v2(), NVML_ERROR_DRIVER_NOT_LOADED);
        CHECK(nvmlInitWithFlags(NVML_INIT_FLAG_NO_GPUS), NVML_ERROR_DRIVER_NOT_LOADED);
        if (uninitialised(dev))
            return 1;
        printf("ok\n");
        return 0;
    }
    OK(nvmlInit_v2());
    OK(nvmlDeviceGetCount_v2(&n));
    EXPECT(n == 1);
    if (strcmp(argv[1], "busy") == 0) {
        OK(nvmlDeviceGetHandleByIndex_v2(0, &dev));
        CHECK(nvmlDeviceGetMemoryInfo(dev, &mem), NVML_ERROR_GPU_IS_LOST);
        CHECK(nvmlDeviceGetName(dev, text, sizeof text), NVML_ERROR_GPU_IS_LOST);
        n = 4;
        OK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs));
        EXPECT(n == 0);
        OK(nvmlShutdown());
        printf("ok\n");
        return 0;
    }
    if (strcmp(argv[1], "count") == 0) {
        OK(nvmlDeviceGetHandleByIndex_v2(0, &dev));
        OK(nvmlShutdown());
        printf("ok\n");
        return 0;
    }
    unsigned long long share = strtoull(argv[1], NULL, 0);

    /* Initialisation is counted: two inits need two shutdowns. */
    OK(nvmlInitWithFlags(0));
    CHECK(nvmlDeviceGetCount_v2(NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByIndex_v2(1, &dev), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByIndex_v2(0, NULL), NVML_ERROR_INVALID_ARGUMENT);
    OK(nvmlDeviceGetHandleByIndex_v2(0, &dev));
    EXPECT(dev != NULL);

    /* Bad handles and NULL pointers. */
    CHECK(nvmlDeviceGetName(bad, text, sizeof text), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetName(NULL, text, sizeof text), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetName(dev, NULL, sizeof text), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetMemoryInfo(bad, &mem), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetMemoryInfo(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetUUID(bad, text, sizeof text), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetPciInfo_v3(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetIndex(bad, &idx), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev, NULL, procs), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(bad, &n, procs), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetCudaComputeCapability(dev, NULL, &minor), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetComputeMode(bad, &mode), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetUtilizationRates(dev, NULL), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByUUID(NULL, &other), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlDeviceGetHandleByPciBusId_v2("not a bus id", &other), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlSystemGetDriverVersion(NULL, 80), NVML_ERROR_INVALID_ARGUMENT);
    CHECK(nvmlSystemGetCudaDriverVersion(NULL), NVML_ERROR_INVALID_ARGUMENT);

    OK(nvmlDeviceGetIndex(dev, &idx));
    EXPECT(idx == 0);
    /* Nothing holds a context yet: no process on the vGPU. */
    n = 4;
    OK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs));
    EXPECT(n == 0);

    /* Memory: the share, before this process allocated anything. */
    OK(nvmlDeviceGetMemoryInfo(dev, &mem));
    EXPECT(mem.total == share);
    EXPECT(mem.used <= mem.total && mem.free == mem.total - mem.used);
    m2.version = 1;
    CHECK(nvmlDeviceGetMemoryInfo_v2(dev, &m2), NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    m2.version = nvmlMemory_v2;
    OK(nvmlDeviceGetMemoryInfo_v2(dev, &m2));
    EXPECT(m2.total == share && m2.used == mem.used && m2.free == mem.free);

    /* The identity is the one CUDA reports for the vGPU. */
    CU(cuInit(0));
    CU(cuDeviceGet(&cudev, 0));
    OK(nvmlDeviceGetName(dev, text, sizeof text));
    CU(cuDeviceGetName(cutext, sizeof cutext, cudev));
    EXPECT(strcmp(text, cutext) == 0 && strncmp(text, "vGPU", 4) == 0);
    CHECK(nvmlDeviceGetName(dev, text, 4), NVML_ERROR_INSUFFICIENT_SIZE);
    OK(nvmlDeviceGetUUID(dev, text, sizeof text));
    CU(cuDeviceGetUuid(&uuid, cudev));
    {
        const unsigned char *u = (const unsigned char *)uuid.bytes;
        snprintf(cutext, sizeof cutext,
                 "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x",
                 u[0], u[1], u[2], u[3], u[4], u[5], u[6], u[7], u[8], u[9], u[10], u[11], u[12],
                 u[13], u[14], u[15]);
    }
    EXPECT(strcmp(text, cutext) == 0);
    OK(nvmlDeviceGetHandleByUUID(text, &other));
    EXPECT(other == dev);
    CHECK(nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000", &other),
          NVML_ERROR_NOT_FOUND);
    OK(nvmlDeviceGetPciInfo_v3(dev, &pci));
    CU(cuDeviceGetPCIBusId(cutext, sizeof cutext, cudev));
    EXPECT(strcmp(pci.busId, cutext) == 0);
    EXPECT(pci.pciDeviceId == 0x564710DEu);
    CU(cuDeviceGetAttribute(&version, PCI_DEVICE_ID_ATTRIBUTE, cudev));
    EXPECT(pci.device == (unsigned)version);
    other = NULL;
    OK(nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &other));
    EXPECT(other == dev);
    other = NULL;
    OK(nvmlDeviceGetHandleByPciBusId_v2(pci.busIdLegacy, &other));
    EXPECT(other == dev);
    CHECK(nvmlDeviceGetHandleByPciBusId_v2("0000:7F:1F.0", &other), NVML_ERROR_NOT_FOUND);
    OK(nvmlDeviceGetCudaComputeCapability(dev, &major, &minor));
    CU(cuDeviceComputeCapability(&cu_major, &cu_minor, cudev));
    EXPECT(major == cu_major && minor == cu_minor && major > 0);
    OK(nvmlDeviceGetComputeMode(dev, &mode));
    EXPECT(mode == NVML_COMPUTEMODE_DEFAULT);
    CHECK(nvmlDeviceGetUtilizationRates(dev, &util), NVML_ERROR_NOT_SUPPORTED);
    CHECK(nvmlDeviceGetTemperature(dev, NVML_TEMPERATURE_GPU, &n), NVML_ERROR_NOT_SUPPORTED);

    /* Versions: the CUDA version is the CUDA library's. */
    OK(nvmlSystemGetCudaDriverVersion(&version));
    {
        int cu_version = 0;
        CU(cuDriverGetVersion(&cu_version));
        EXPECT(version == cu_version);
        OK(nvmlSystemGetCudaDriverVersion_v2(&version));
        EXPECT(version == cu_version);
    }
    OK(nvmlSystemGetDriverVersion(text, sizeof text));
    EXPECT(strlen(text) > 0);
    CHECK(nvmlSystemGetDriverVersion(text, 2), NVML_ERROR_INSUFFICIENT_SIZE);
    OK(nvmlSystemGetNVMLVersion(text, sizeof text));
    EXPECT(strlen(text) > 0);

    /* The program allocates through CUDA: NVML sees the vGPU's use grow, and the process. */
    CU(cuCtxCreate(&ctx, 0, cudev));
    CU(cuMemAlloc(&d, 64 << 20));
    OK(nvmlDeviceGetMemoryInfo(dev, &mem2));
    EXPECT(mem2.total == share);
    EXPECT(mem2.used >= mem.used + (64 << 20));
    EXPECT(mem2.free == mem2.total - mem2.used);
    CU(cuMemGetInfo(&cu_free, &cu_total));
    EXPECT(cu_total == mem2.total && cu_free == mem2.free);

    n = 0;
    CHECK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, NULL), NVML_ERROR_INSUFFICIENT_SIZE);
    EXPECT(n == 1);
    n = 4;
    OK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs));
    EXPECT(n == 1);
    EXPECT(procs[0].pid == (unsigned)getpid());
    EXPECT(procs[0].usedGpuMemory == mem2.used);
    EXPECT(procs[0].gpuInstanceId == 0xFFFFFFFFu && procs[0].computeInstanceId == 0xFFFFFFFFu);
    n = 4;
    OK(nvmlDeviceGetComputeRunningProcesses(dev, &n, procs1));
    EXPECT(n == 1 && procs1[0].pid == (unsigned)getpid() && procs1[0].usedGpuMemory == mem2.used);

    CU(cuMemFree(d));
    OK(nvmlDeviceGetMemoryInfo(dev, &mem));
    EXPECT(mem.used + (64 << 20) <= mem2.used);
    CU(cuCtxDestroy(ctx));
    n = 4;
    OK(nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, procs));
    EXPECT(n == 0);

    /* Two inits, two shutdowns; then uninitialised again. */
    OK(nvmlShutdown());
    OK(nvmlDeviceGetMemoryInfo(dev, &mem));
    OK(nvmlShutdown());
    if (uninitialised(dev))
        return 1;
    /* Initialised again, the same handle answers. */
    OK(nvmlInit_v2());
    OK(nvmlDeviceGetMemoryInfo(dev, &mem));
    EXPECT(mem.total == share);
    OK(nvmlShutdown());
    printf("ok\n");
    return 0;
}
