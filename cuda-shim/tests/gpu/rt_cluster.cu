// Thread block clusters through the CUDA runtime (cudaLaunchKernelEx with a cluster
// dimension, as cuBLAS launches its Hopper kernels): each block writes its rank in its
// cluster and the cluster's size, and a block reads its neighbour's shared memory
// through the cluster (distributed shared memory). Prints "CLUSTER OK" when every value
// is right; needs compute capability 9.0.
#include <cooperative_groups.h>
#include <cstdio>
#include <cuda_runtime.h>

namespace cg = cooperative_groups;

__global__ void ranks(int *out, int *peer) {
    __shared__ int mine;
    cg::cluster_group cluster = cg::this_cluster();
    unsigned rank = cluster.block_rank();
    if (threadIdx.x == 0) mine = (int)(blockIdx.x * 10);
    cluster.sync();
    // The next block of the cluster's shared variable.
    int *other = cluster.map_shared_rank(&mine, (rank + 1) % cluster.num_blocks());
    if (threadIdx.x == 0) {
        out[blockIdx.x * 2] = (int)rank;
        out[blockIdx.x * 2 + 1] = (int)cluster.num_blocks();
        peer[blockIdx.x] = *other;
    }
    cluster.sync();
}

#define CHECK(x)                                                                  \
    do {                                                                          \
        cudaError_t e = (x);                                                      \
        if (e != cudaSuccess) {                                                   \
            printf("%s: %s\n", #x, cudaGetErrorString(e));                        \
            return 1;                                                             \
        }                                                                         \
    } while (0)

int main() {
    const int blocks = 64, size = 4;
    int *out, *peer;
    CHECK(cudaMalloc(&out, blocks * 2 * sizeof(int)));
    CHECK(cudaMalloc(&peer, blocks * sizeof(int)));
    int attr = 0;
    CHECK(cudaDeviceGetAttribute(&attr, cudaDevAttrClusterLaunch, 0));
    if (!attr) {
        printf("no cluster launch on this device\n");
        return 1;
    }
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(32);
    cudaLaunchAttribute a[1];
    a[0].id = cudaLaunchAttributeClusterDimension;
    a[0].val.clusterDim.x = size;
    a[0].val.clusterDim.y = 1;
    a[0].val.clusterDim.z = 1;
    cfg.attrs = a;
    cfg.numAttrs = 1;
    int active = 0;
    CHECK(cudaOccupancyMaxActiveClusters(&active, ranks, &cfg));
    CHECK(cudaLaunchKernelEx(&cfg, ranks, out, peer));
    CHECK(cudaDeviceSynchronize());
    int h[blocks * 2], p[blocks];
    CHECK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
    CHECK(cudaMemcpy(p, peer, sizeof p, cudaMemcpyDeviceToHost));
    for (int b = 0; b < blocks; b++) {
        int next = (b / size) * size + (b % size + 1) % size;
        if (h[b * 2] != b % size || h[b * 2 + 1] != size || p[b] != next * 10) {
            printf("block %d: rank %d of %d, peer %d (want %d of %d, peer %d)\n", b, h[b * 2],
                   h[b * 2 + 1], p[b], b % size, size, next * 10);
            return 1;
        }
    }
    // A grid that is not a whole number of clusters is refused.
    cfg.gridDim = dim3(blocks + 1);
    if (cudaLaunchKernelEx(&cfg, ranks, out, peer) == cudaSuccess) {
        printf("a grid of %d blocks in clusters of %d was accepted\n", blocks + 1, size);
        return 1;
    }
    cudaGetLastError();
    printf("max active clusters of %d: %d\n", size, active);
    printf("CLUSTER OK\n");
    return 0;
}
