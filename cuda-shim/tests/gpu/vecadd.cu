// The kernel of the cuda-programs GPU step (ci/gpu/suite.sh): nvcc turns it into PTX
// (-ptx) and a cubin (-cubin -arch=sm_90) on the GPU machine.
extern "C" __global__ void vecadd(const float *a, const float *b, float *c, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        c[i] = a[i] + b[i];
}
