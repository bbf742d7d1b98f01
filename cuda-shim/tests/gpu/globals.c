/* An unmodified driver-API program using a module variable and structs passed by value:
 * cuModuleGetGlobal, cuMemcpyHtoD into the variable, a kernel reading it and two by-value
 * structs (24 bytes, and 64 bytes of floats), through kernelParams and through extra's
 * parameter buffer; a 2 KiB struct by value; cuMemFree of the variable is refused. Built with gcc against the
 * toolkit's cuda.h and -lcuda, like vecadd.c; prints GLOBALS OK on success.
 */
#include <cuda.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define CHECK(call)                                                                  \
    do {                                                                             \
        CUresult rc_ = (call);                                                       \
        if (rc_ != CUDA_SUCCESS) {                                                   \
            const char *name_ = "?";                                                 \
            cuGetErrorName(rc_, &name_);                                             \
            fprintf(stderr, "globals: %s failed: %s (%d)\n", #call, name_, (int)rc_); \
            return 1;                                                                \
        }                                                                            \
    } while (0)

/* out bytes 0..4 = scale[0] + s.b, 8..16 = s.c, 16..20 = v.x[15]. */
static const char PTX[] =
    ".version 7.8\n"
    ".target sm_90\n"
    ".address_size 64\n"
    ".visible .global .align 4 .u32 scale[8];\n"
    ".visible .entry apply(.param .u64 out, .param .align 8 .b8 s[24], .param .align 4 .b8 v[64])\n"
    "{\n"
    "    .reg .b32 %r<4>;\n"
    "    .reg .b64 %d<3>;\n"
    "    ld.param.u64 %d0, [out];\n"
    "    cvta.to.global.u64 %d1, %d0;\n"
    "    ld.global.u32 %r0, [scale];\n"
    "    ld.param.b32 %r1, [s+4];\n"
    "    add.u32 %r3, %r0, %r1;\n"
    "    st.global.u32 [%d1], %r3;\n"
    "    ld.param.b64 %d2, [s+16];\n"
    "    st.global.b64 [%d1+8], %d2;\n"
    "    ld.param.b32 %r2, [v+60];\n"
    "    st.global.b32 [%d1+16], %r2;\n"
    "    ret;\n"
    "}\n"
    ".visible .entry big(.param .u64 out, .param .align 4 .b8 blk[2048])\n"
    "{\n"
    "    .reg .b32 %r<2>;\n"
    "    .reg .b64 %d<2>;\n"
    "    ld.param.u64 %d0, [out];\n"
    "    cvta.to.global.u64 %d1, %d0;\n"
    "    ld.param.b32 %r0, [blk];\n"
    "    st.global.b32 [%d1], %r0;\n"
    "    ld.param.b32 %r1, [blk+2044];\n"
    "    st.global.b32 [%d1+4], %r1;\n"
    "    ret;\n"
    "}\n";

struct S {
    uint32_t a, b;
    uint64_t pad, c;
};
struct V {
    float x[16];
};

int main(void)
{
    CUdevice dev;
    CUcontext ctx;
    CUmodule mod;
    CUfunction fn;
    CUdeviceptr scale, out;
    size_t size = 0;
    CHECK(cuInit(0));
    CHECK(cuDeviceGet(&dev, 0));
    CHECK(cuDevicePrimaryCtxRetain(&ctx, dev));
    CHECK(cuCtxSetCurrent(ctx));
    CHECK(cuModuleLoadData(&mod, PTX));
    CHECK(cuModuleGetFunction(&fn, mod, "apply"));
    CHECK(cuModuleGetGlobal(&scale, &size, mod, "scale"));
    if (size != 32) {
        fprintf(stderr, "globals: scale is %zu bytes, want 32\n", size);
        return 1;
    }
    if (cuModuleGetGlobal(&out, &size, mod, "nothing") != CUDA_ERROR_NOT_FOUND) {
        fprintf(stderr, "globals: an undeclared name was found\n");
        return 1;
    }
    uint32_t init[8] = {1000, 0, 0, 0, 0, 0, 0, 0};
    CHECK(cuMemcpyHtoD(scale, init, sizeof init));
    uint32_t back[8] = {0};
    CHECK(cuMemcpyDtoH(back, scale, sizeof back));
    if (back[0] != 1000) {
        fprintf(stderr, "globals: scale[0] reads %u after the copy\n", back[0]);
        return 1;
    }
    if (cuMemFree(scale) == CUDA_SUCCESS) {
        fprintf(stderr, "globals: cuMemFree of a module variable succeeded\n");
        return 1;
    }
    CHECK(cuMemAlloc(&out, 4096));
    struct S s = {7, 23, 0, 0x1122334455667788ull};
    struct V v;
    for (int i = 0; i < 16; i++)
        v.x[i] = 0.5f * (float)i;

    /* kernelParams */
    void *params[] = {&out, &s, &v};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, params, NULL));
    CHECK(cuCtxSynchronize());
    uint32_t res[6];
    CHECK(cuMemcpyDtoH(res, out, sizeof res));
    uint64_t c;
    memcpy(&c, &res[2], sizeof c);
    float last;
    memcpy(&last, &res[4], sizeof last);
    if (res[0] != 1023 || c != s.c || last != 7.5f) {
        fprintf(stderr, "globals: kernelParams launch wrote %u %llx %f\n", res[0],
                (unsigned long long)c, last);
        return 1;
    }

    /* extra: one parameter buffer laid out as the kernel's (8 + 24 + 64 bytes) */
    init[0] = 2000;
    CHECK(cuMemcpyHtoD(scale, init, 4));
    unsigned char buf[96];
    memcpy(buf, &out, 8);
    memcpy(buf + 8, &s, 24);
    memcpy(buf + 32, &v, 64);
    size_t bufsize = sizeof buf;
    void *extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, buf, CU_LAUNCH_PARAM_BUFFER_SIZE, &bufsize,
                     CU_LAUNCH_PARAM_END};
    CHECK(cuLaunchKernel(fn, 1, 1, 1, 1, 1, 1, 0, NULL, NULL, extra));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(res, out, sizeof res));
    if (res[0] != 2023) {
        fprintf(stderr, "globals: extra launch wrote %u, want 2023\n", res[0]);
        return 1;
    }

    /* a 2 KiB struct by value */
    CUfunction big;
    CHECK(cuModuleGetFunction(&big, mod, "big"));
    static uint32_t blk[512];
    for (int i = 0; i < 512; i++)
        blk[i] = 0xabc00000u + (uint32_t)i;
    void *bparams[] = {&out, blk};
    CHECK(cuLaunchKernel(big, 1, 1, 1, 1, 1, 1, 0, NULL, bparams, NULL));
    CHECK(cuCtxSynchronize());
    CHECK(cuMemcpyDtoH(res, out, 8));
    if (res[0] != blk[0] || res[1] != blk[511]) {
        fprintf(stderr, "globals: the 2 KiB struct arrived as %x..%x\n", res[0], res[1]);
        return 1;
    }
    CHECK(cuMemFree(out));
    CHECK(cuModuleUnload(mod));
    CHECK(cuDevicePrimaryCtxRelease(dev));
    printf("GLOBALS OK\n");
    return 0;
}
