/* A CUDA runtime (libcudart) program, built with cc against NVIDIA's cuda_runtime_api.h
 * and linked to NVIDIA's libcudart (shared or static), run on the vGPU library as
 * libcuda.so.1 against a sim worker. argv[1]: the vGPU's memory share in bytes.
 * With VGPU_TEST_FATBIN set it registers a fat binary before main instead (see
 * fatbin_program). Prints "ok" when every check holds; otherwise the failed check, exit
 * status 1. */
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            printf("FAILED line %d: %s\n", __LINE__, #cond);                   \
            exit(1);                                                           \
        }                                                                      \
    } while (0)
#define OK(call)                                                               \
    do {                                                                       \
        cudaError_t e_ = (call);                                               \
        if (e_ != cudaSuccess) {                                               \
            printf("FAILED line %d: %s = %d (%s)\n", __LINE__, #call, (int)e_,   \
                   cudaGetErrorString(e_));                                    \
            exit(1);                                                           \
        }                                                                      \
    } while (0)
#define IS(call, want)                                                         \
    do {                                                                       \
        int e_ = (int)(call);                                                  \
        if (e_ != (int)(want)) {                                               \
            printf("FAILED line %d: %s = %d, want %d\n", __LINE__, #call, e_,    \
                   (int)(want));                                               \
            exit(1);                                                           \
        }                                                                      \
    } while (0)

/* What nvcc emits for a translation unit's kernels, registered by hand. */
void **__cudaRegisterFatBinary(void *fatCubin);
void __cudaRegisterFatBinaryEnd(void **handle);
void __cudaUnregisterFatBinary(void **handle);
void __cudaRegisterFunction(void **handle, const char *hostFun, char *deviceFun,
                            const char *deviceName, int threadLimit, uint3 *tid,
                            uint3 *bid, dim3 *bDim, dim3 *gDim, int *wSize);

typedef struct {
    int magic;
    int version;
    const unsigned long long *data;
    void *filename_or_fatbins;
} fatbin_wrapper;

struct fatbin_header {
    uint32_t magic;
    uint16_t version;
    uint16_t header_size;
    uint64_t fat_size;
};

struct fatbin_entry {
    uint16_t kind;
    uint16_t version;
    uint32_t header_size;
    uint64_t payload_size;
    uint32_t compressed_size;
    uint32_t reserved0;
    uint16_t minor;
    uint16_t major;
    uint32_t arch;
    uint32_t name_offset;
    uint32_t name_size;
    uint64_t flags;
    uint64_t reserved1;
    uint64_t uncompressed_size;
};

static const char PTX[] =
    ".version 7.0\n.target sm_50\n.address_size 64\n"
    ".visible .entry fill(.param .u64 p, .param .u32 v)\n{\n"
    "  .reg .b64 %rd<3>;\n  .reg .b32 %r<2>;\n"
    "  ld.param.u64 %rd1, [p];\n  ld.param.u32 %r1, [v];\n"
    "  cvta.to.global.u64 %rd2, %rd1;\n  st.global.u32 [%rd2], %r1;\n  ret;\n}\n";

/* The host stub the runtime keys the kernel by. */
static void fill_stub(void) {}

typedef int (*get_export_table_t)(const void **, const void *);
typedef int (*get_proc_t)(const char *, void **, int, unsigned long long, int *);
typedef int (*cls_get_t)(void **, void *, void *);

static fatbin_wrapper wrapper;

/* Whether the driver loads libraries when they are created (CUDA_MODULE_LOADING=EAGER). */
static int eager_loading(void) {
    const char *mode = getenv("CUDA_MODULE_LOADING");
    return mode != NULL && strcmp(mode, "EAGER") == 0;
}

static void driver_checks(void) {
    void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CHECK(lib != NULL);
    get_export_table_t get_table = (get_export_table_t)dlsym(lib, "cuGetExportTable");
    get_proc_t get_proc = (get_proc_t)dlsym(lib, "cuGetProcAddress_v2");
    CHECK(get_table != NULL && get_proc != NULL);

    static const unsigned char cls_uuid[16] = {0xc6, 0x93, 0x33, 0x6e, 0x11, 0x21, 0xdf, 0x11,
                                               0xa8, 0xc3, 0x68, 0xf3, 0x55, 0xd8, 0x95, 0x93};
    static const unsigned char unknown[16] = {0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3,
                                              4, 5, 6, 7, 8, 9, 10, 11};
    const void *table = (const void *)0x1;
    IS(get_table(NULL, cls_uuid), 1);      /* CUDA_ERROR_INVALID_VALUE */
    IS(get_table(&table, NULL), 1);
    IS(get_table(&table, unknown), 1);
    CHECK(table == NULL);
    IS(get_table(&table, cls_uuid), 0);
    CHECK(table != NULL);
    /* Context-local storage: a context that is not live, a key never stored. */
    cls_get_t cls_get = (cls_get_t)((void *const *)table)[2];
    void *value = NULL;
    IS(cls_get(&value, (void *)0xdead0, (void *)0x1), 201); /* INVALID_CONTEXT */
    IS(cls_get(NULL, NULL, (void *)0x1), 1);
    IS(cls_get(&value, NULL, (void *)0x7e57), 400); /* INVALID_HANDLE */

    /* CUDART_INTERFACE: a module from the fat binary wrapper, the primary context. */
    static const unsigned char cudart_uuid[16] = {0x6b, 0xd5, 0xfb, 0x6c, 0x5b, 0xf4, 0xe7, 0x4a,
                                                  0x89, 0x87, 0xd9, 0x39, 0x12, 0xfd, 0x9d, 0xf9};
    IS(get_table(&table, cudart_uuid), 0);
    CHECK(((const size_t *)table)[0] == 13 * sizeof(void *));
    typedef int (*module_from_fatbin_t)(void **, const void *);
    typedef int (*primary_t)(void **, int);
    module_from_fatbin_t module_from_fatbin = (module_from_fatbin_t)((void *const *)table)[1];
    primary_t primary = (primary_t)((void *const *)table)[2];
    void *module = NULL;
    IS(module_from_fatbin(&module, &wrapper), 209); /* CUDA_ERROR_NO_BINARY_FOR_GPU */
    IS(module_from_fatbin(NULL, &wrapper), 1);
    IS(module_from_fatbin(&module, NULL), 1);
    void *ctx = NULL;
    IS(primary(&ctx, 0), 0);
    CHECK(ctx != NULL);
    IS(primary(&ctx, 9), 101); /* INVALID_DEVICE */
    IS(primary(NULL, 0), 1);

    void *fn = NULL;
    int status = -1;
    /* With a status to answer in, a missing symbol is CUDA_SUCCESS (as the driver answers). */
    IS(get_proc("cuNoSuchFunction", &fn, 13000, 0, &status), 0);
    CHECK(fn == NULL && status == 1); /* SYMBOL_NOT_FOUND */
    IS(get_proc("cuCtxGetId", &fn, 11000, 0, &status), 0);
    CHECK(fn == NULL && status == 2); /* VERSION_NOT_SUFFICIENT */
    IS(get_proc("cuNoSuchFunction", &fn, 13000, 0, NULL), 500); /* NOT_FOUND */

    /* CONTEXT_CHECKS: 17 slots; slot 1 not offered; slot 2 clears the flags and leaves the
       caller's second output alone (cuBLASLt reads it back). */
    static const unsigned char checks_uuid[16] = {0x26, 0x3e, 0x88, 0x60, 0x7c, 0xd2, 0x61, 0x43,
                                                  0x92, 0xf6, 0xbb, 0xd5, 0x00, 0x6d, 0xfa, 0x7e};
    IS(get_table(&table, checks_uuid), 0);
    CHECK(((const size_t *)table)[0] == 17 * sizeof(void *));
    typedef int (*ctx_check_t)(void *, unsigned *, const void **);
    unsigned flags = 7;
    const void *extra = (const void *)0x5a5a;
    IS(((ctx_check_t)((void *const *)table)[1])(NULL, &flags, &extra), 801);
    IS(((ctx_check_t)((void *const *)table)[2])(NULL, &flags, &extra), 0);
    CHECK(flags == 0 && extra == (const void *)0x5a5a);
    IS(get_proc("cuMemAlloc", &fn, 13000, 4, &status), 1); /* unknown flag */
    IS(get_proc(NULL, &fn, 13000, 0, &status), 1);
    void *legacy = NULL, *ptsz = NULL;
    IS(get_proc("cuLaunchKernel", &legacy, 13000, 1, &status), 0);
    CHECK(status == 0 && legacy == dlsym(lib, "cuLaunchKernel"));
    IS(get_proc("cuLaunchKernel", &ptsz, 13000, 2, &status), 0);
    CHECK(status == 0 && ptsz == dlsym(lib, "cuLaunchKernel_ptsz"));
    IS(get_proc("cuMemcpyHtoD", &ptsz, 13000, 2, &status), 0);
    CHECK(ptsz == dlsym(lib, "cuMemcpyHtoD_v2_ptds"));
    IS(get_proc("cuMemAlloc", &ptsz, 13000, 2, &status), 0); /* no per-thread variant */
    CHECK(ptsz == dlsym(lib, "cuMemAlloc_v2"));
    IS(get_proc("cuCtxCreate", &fn, 12000, 0, &status), 0);
    CHECK(fn == dlsym(lib, "cuCtxCreate_v3"));
    IS(get_proc("cuCtxCreate", &fn, 12080, 0, &status), 0);
    CHECK(fn == dlsym(lib, "cuCtxCreate_v4"));

    typedef int (*loading_mode_t)(int *);
    loading_mode_t loading_mode = (loading_mode_t)dlsym(lib, "cuModuleGetLoadingMode");
    int mode = 0;
    IS(loading_mode(NULL), 1);
    IS(loading_mode(&mode), 0);
    /* CU_MODULE_EAGER_LOADING with CUDA_MODULE_LOADING=EAGER, CU_MODULE_LAZY_LOADING else */
    CHECK(mode == (eager_loading() ? 1 : 2));
    typedef int (*priority_t)(void *, int *);
    priority_t priority = (priority_t)dlsym(lib, "cuStreamGetPriority");
    int prio = -1;
    IS(priority((void *)0xdead0, &prio), 400); /* a foreign stream: INVALID_HANDLE */
    IS(priority(NULL, &prio), 0);
    CHECK(prio == 0);
    typedef int (*bus_id_t)(char *, int, int);
    bus_id_t bus_id = (bus_id_t)dlsym(lib, "cuDeviceGetPCIBusId");
    char bus[32];
    IS(bus_id(bus, 32, 7), 101); /* INVALID_DEVICE */
    IS(bus_id(NULL, 32, 0), 1);
    IS(bus_id(bus, 32, 0), 0);
    CHECK(strlen(bus) == 16 && bus[8] == ':');
}

static void **handle;
static unsigned long long *fat;

/* Builds the fat binary wrapper nvcc would emit for one PTX kernel. */
static void build_fatbin(void) {
    size_t ptx_len = sizeof(PTX);
    size_t total_len = sizeof(struct fatbin_header) + sizeof(struct fatbin_entry) + ptx_len;
    fat = calloc((total_len + 7) / 8, 8);
    CHECK(fat != NULL);
    struct fatbin_header *fh = (struct fatbin_header *)fat;
    fh->magic = 0xba55ed50u;
    fh->version = 1;
    fh->header_size = sizeof(struct fatbin_header);
    fh->fat_size = sizeof(struct fatbin_entry) + ptx_len;
    struct fatbin_entry *fe = (struct fatbin_entry *)(fh + 1);
    fe->kind = 1; /* PTX */
    fe->version = 0x0101;
    fe->header_size = sizeof(struct fatbin_entry);
    fe->payload_size = ptx_len;
    fe->minor = 0;
    fe->major = 7;
    fe->arch = 50;
    fe->flags = 0x11; /* 64-bit, Linux */
    fe->uncompressed_size = ptx_len;
    memcpy(fe + 1, PTX, ptx_len);
    wrapper.magic = 0x466243b1;
    wrapper.version = 1;
    wrapper.data = fat;
    wrapper.filename_or_fatbins = NULL;
}

/* With VGPU_TEST_FATBIN set, registers the fat binary and its kernel before main, as
 * nvcc's generated code does. */
__attribute__((constructor)) static void register_fatbin(void) {
    build_fatbin();
    if (getenv("VGPU_TEST_FATBIN") == NULL) return;
    handle = __cudaRegisterFatBinary(&wrapper);
    __cudaRegisterFunction(handle, (const char *)fill_stub, (char *)"fill", "fill", -1, NULL,
                           NULL, NULL, NULL, NULL);
    __cudaRegisterFatBinaryEnd(handle);
}

/* A program with a registered fat binary: the runtime creates its library
 * (cuLibraryLoadData) when it starts, with no context current, and the sim vGPU cannot run
 * its PTX. Loading lazily (the default) the start succeeds and the launch answers
 * cudaErrorNoKernelImageForDevice; with CUDA_MODULE_LOADING=EAGER the start answers it
 * already. Where the vGPU library has no library API the start answers
 * cudaErrorNotSupported. */
static int fatbin_program(void) {
    void *drv = dlopen("libcuda.so.1", RTLD_NOW);
    CHECK(drv != NULL);
    typedef int (*library_load_t)(void **, const void *, void *, void *, unsigned, void *,
                                  void *, unsigned);
    library_load_t library_load = (library_load_t)dlsym(drv, "cuLibraryLoadData");
    CHECK(library_load != NULL);
    int library_api = library_load(NULL, NULL, NULL, NULL, 0, NULL, NULL, 0) != 801;
    cudaError_t want = library_api ? cudaErrorNoKernelImageForDevice : cudaErrorNotSupported;
    CHECK(handle != NULL);
    cudaError_t start = cudaFree(NULL);
    cudaError_t want_start = library_api && !eager_loading() ? cudaSuccess : want;
    if (start != want_start) {
        printf("FAILED: the runtime's start answered %d\n", (int)start);
        exit(1);
    }
    unsigned int v = 42;
    void *p = NULL;
    void *args[] = {&p, &v};
    dim3 one = {1, 1, 1};
    IS(cudaLaunchKernel((const void *)fill_stub, one, one, args, 0, NULL), want);
    printf("ok\n");
    return 0;
}

int main(int argc, char **argv) {
    if (getenv("VGPU_TEST_FATBIN") != NULL) return fatbin_program();
    CHECK(argc == 2);
    size_t share = strtoull(argv[1], NULL, 0);

    int version = 0;
    OK(cudaDriverGetVersion(&version));
    CHECK(version >= 13000);
    int count = 0;
    OK(cudaGetDeviceCount(&count));
    CHECK(count == 1);
    struct cudaDeviceProp prop;
    OK(cudaGetDeviceProperties(&prop, 0));
    CHECK(strncmp(prop.name, "vGPU ", 5) == 0);
    CHECK(prop.totalGlobalMem == share);
    CHECK(prop.major >= 1 && prop.multiProcessorCount > 0 && prop.warpSize == 32);
    CHECK(prop.maxThreadsPerBlock >= 256);
    IS(cudaGetDeviceProperties(&prop, 3), cudaErrorInvalidDevice);
    OK(cudaSetDevice(0));
    int dev = -1;
    OK(cudaGetDevice(&dev));
    CHECK(dev == 0);

    size_t free_bytes = 0, total = 0;
    OK(cudaMemGetInfo(&free_bytes, &total));
    CHECK(total == share && free_bytes <= total && free_bytes > total / 2);

    /* Device memory: memset, copies both ways and on the device. */
    const size_t n = 1 << 20;
    unsigned char *d_a = NULL, *d_b = NULL;
    OK(cudaMalloc((void **)&d_a, n));
    OK(cudaMalloc((void **)&d_b, n));
    size_t free_after = 0;
    OK(cudaMemGetInfo(&free_after, &total));
    CHECK(free_after + 2 * n <= free_bytes);
    unsigned char *host = malloc(n), *back = malloc(n);
    CHECK(host && back);
    for (size_t i = 0; i < n; i++) host[i] = (unsigned char)(i * 7 + 3);
    OK(cudaMemset(d_a, 0x5a, n));
    OK(cudaMemcpy(back, d_a, n, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) CHECK(back[i] == 0x5a);
    OK(cudaMemcpy(d_a, host, n, cudaMemcpyHostToDevice));
    OK(cudaMemcpy(d_b, d_a, n, cudaMemcpyDeviceToDevice));
    memset(back, 0, n);
    OK(cudaMemcpy(back, d_b, n, cudaMemcpyDeviceToHost));
    CHECK(memcmp(back, host, n) == 0);

    /* Pinned memory, streams, events, asynchronous copies. */
    unsigned char *pinned = NULL, *pinned2 = NULL;
    OK(cudaMallocHost((void **)&pinned, n));
    OK(cudaHostAlloc((void **)&pinned2, n, cudaHostAllocDefault));
    unsigned int flags = 99;
    OK(cudaHostGetFlags(&flags, pinned2));
    for (size_t i = 0; i < n; i++) pinned[i] = (unsigned char)(255 - i);
    cudaStream_t s1, s2;
    OK(cudaStreamCreate(&s1));
    OK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
    cudaEvent_t start, stop;
    OK(cudaEventCreate(&start));
    OK(cudaEventCreate(&stop));
    OK(cudaEventRecord(start, s1));
    OK(cudaMemcpyAsync(d_a, pinned, n, cudaMemcpyHostToDevice, s1));
    OK(cudaMemsetAsync(d_b, 0x11, n / 2, s1));
    OK(cudaEventRecord(stop, s1));
    OK(cudaStreamWaitEvent(s2, stop, 0));
    OK(cudaMemcpyAsync(pinned2, d_a, n, cudaMemcpyDeviceToHost, s2));
    OK(cudaStreamSynchronize(s2));
    OK(cudaEventSynchronize(stop));
    IS(cudaEventQuery(stop), cudaSuccess);
    IS(cudaStreamQuery(s1), cudaSuccess);
    CHECK(memcmp(pinned, pinned2, n) == 0);
    float ms = -1;
    OK(cudaEventElapsedTime(&ms, start, stop));
    CHECK(ms >= 0);
    OK(cudaMemcpy(back, d_b, n, cudaMemcpyDeviceToHost));
    CHECK(back[0] == 0x11 && back[n / 2 - 1] == 0x11 && back[n / 2] == host[n / 2]);

    /* The calling thread's default stream (cudaStreamPerThread). */
    OK(cudaMemcpyAsync(d_b, pinned, n, cudaMemcpyHostToDevice, cudaStreamPerThread));
    OK(cudaMemcpyAsync(pinned2, d_b, n, cudaMemcpyDeviceToHost, cudaStreamPerThread));
    OK(cudaStreamSynchronize(cudaStreamPerThread));
    CHECK(memcmp(pinned, pinned2, n) == 0);
    OK(cudaDeviceSynchronize());

    /* More than the vGPU's share: an allocation error, and the runtime goes on. */
    void *huge = NULL;
    IS(cudaMalloc(&huge, share + (64u << 20)), cudaErrorMemoryAllocation);
    IS(cudaGetLastError(), cudaErrorMemoryAllocation);
    IS(cudaGetLastError(), cudaSuccess);

    /* Bad input: a device pointer the program never allocated, a foreign stream. */
    IS(cudaFree((void *)0x7000dead0000ull), cudaErrorInvalidValue);
    IS(cudaMemcpy(back, (void *)0x7000dead0000ull, 16, cudaMemcpyDeviceToHost),
       cudaErrorInvalidValue);
    (void)cudaGetLastError();

    driver_checks();

    OK(cudaEventDestroy(start));
    OK(cudaEventDestroy(stop));
    OK(cudaStreamDestroy(s1));
    OK(cudaStreamDestroy(s2));
    OK(cudaFreeHost(pinned));
    OK(cudaFreeHost(pinned2));
    OK(cudaFree(d_a));
    OK(cudaFree(d_b));
    OK(cudaMemGetInfo(&free_after, &total));
    CHECK(free_after == free_bytes);
    OK(cudaDeviceReset());
    /* The runtime starts again on the reset device. */
    OK(cudaMalloc((void **)&d_a, 4096));
    OK(cudaFree(d_a));
    free(host);
    free(back);
    printf("ok\n");
    return 0;
}
