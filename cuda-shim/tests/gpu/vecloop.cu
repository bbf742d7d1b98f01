// The kernels of the cuda-shares GPU step (ci/gpu/suite.sh): nvcc turns them into PTX on
// the GPU machine; vecloop.c loads it with cuModuleLoad.

// Busy for `ns` nanoseconds of device time (one thread is enough: the vGPU is charged
// the kernel's whole duration).
extern "C" __global__ void spin(unsigned long long ns)
{
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}

// c[i] = v for i < n.
extern "C" __global__ void fill(float *c, float v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = v;
}

// c[i] = a[i] + b[i] for i < n.
extern "C" __global__ void vecadd(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}
