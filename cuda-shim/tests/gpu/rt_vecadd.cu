// An unmodified CUDA runtime program (nvcc, <<<>>> launches, libcudart static by default
// or shared with `-cudart shared`): adds two vectors on the default stream and on a
// created stream with events, checks every element, prints "VECADD OK". Runs natively and
// on a vGPU (the vGPU library first on LD_LIBRARY_PATH, VGPU_SOCKET at a worker).
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

__global__ void vecadd(const float *a, const float *b, float *c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}

#define CK(x)                                                                         \
    do {                                                                              \
        cudaError_t e_ = (x);                                                         \
        if (e_ != cudaSuccess) {                                                      \
            printf("FAIL line %d: %s = %d (%s)\n", __LINE__, #x, (int)e_,             \
                   cudaGetErrorString(e_));                                           \
            return 1;                                                                 \
        }                                                                             \
    } while (0)

static int check(const float *a, const float *b, const float *c, int n) {
    for (int i = 0; i < n; i++)
        if (c[i] != a[i] + b[i]) {
            printf("FAIL: c[%d] = %f, want %f\n", i, c[i], a[i] + b[i]);
            return 1;
        }
    return 0;
}

int main() {
    const int n = 1 << 20;
    const size_t bytes = n * sizeof(float);
    cudaDeviceProp prop;
    CK(cudaGetDeviceProperties(&prop, 0));
    printf("device: %s, sm_%d%d, %zu MiB\n", prop.name, prop.major, prop.minor,
           prop.totalGlobalMem >> 20);
    float *a, *b, *c;
    CK(cudaMallocHost(&a, bytes));
    CK(cudaMallocHost(&b, bytes));
    CK(cudaMallocHost(&c, bytes));
    for (int i = 0; i < n; i++) {
        a[i] = (float)i;
        b[i] = (float)(2 * i + 1);
    }
    float *da, *db, *dc;
    CK(cudaMalloc(&da, bytes));
    CK(cudaMalloc(&db, bytes));
    CK(cudaMalloc(&dc, bytes));
    CK(cudaMemcpy(da, a, bytes, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(db, b, bytes, cudaMemcpyHostToDevice));
    vecadd<<<(n + 255) / 256, 256>>>(da, db, dc, n);
    CK(cudaGetLastError());
    CK(cudaMemcpy(c, dc, bytes, cudaMemcpyDeviceToHost));
    if (check(a, b, c, n)) return 1;

    cudaStream_t s;
    cudaEvent_t start, stop;
    CK(cudaStreamCreate(&s));
    CK(cudaEventCreate(&start));
    CK(cudaEventCreate(&stop));
    CK(cudaMemsetAsync(dc, 0, bytes, s));
    CK(cudaEventRecord(start, s));
    vecadd<<<(n + 255) / 256, 256, 0, s>>>(da, db, dc, n);
    CK(cudaGetLastError());
    CK(cudaEventRecord(stop, s));
    CK(cudaMemcpyAsync(c, dc, bytes, cudaMemcpyDeviceToHost, s));
    CK(cudaStreamSynchronize(s));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, start, stop));
    if (check(a, b, c, n)) return 1;
    printf("kernel on a stream: %.3f ms\n", ms);
    CK(cudaFree(da));
    CK(cudaFree(db));
    CK(cudaFree(dc));
    CK(cudaFreeHost(a));
    CK(cudaFreeHost(b));
    CK(cudaFreeHost(c));
    printf("VECADD OK\n");
    return 0;
}
