/* Driver calls from a thread's exit path, after the thread's own locals were destroyed, as
 * the CUDA runtime's and cuBLAS's exit handlers make them: each answers a CUDA result, the
 * program is never aborted. Run with VGPU_CUDA_LOG=debug so failures are logged. */
#include <cuda.h>
#include <pthread.h>
#include <stdio.h>

static pthread_key_t key;
static CUresult at_exit_free = 999, at_exit_ctx = 999;
static CUcontext at_exit_current = (CUcontext)0x1;

/* Runs after the thread's C++/Rust thread-local destructors (glibc order). */
static void on_thread_exit(void *arg) {
    (void)arg;
    at_exit_free = cuMemFree(0xdead0000ull);
    at_exit_ctx = cuCtxGetCurrent(&at_exit_current);
}

static void *worker(void *arg) {
    (void)arg;
    CUcontext ctx;
    if (cuDevicePrimaryCtxRetain(&ctx, 0) != CUDA_SUCCESS) return NULL;
    if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return NULL;
    /* A failing call first: the library's logger now holds this thread's buffers. */
    if (cuMemFree(0xdead0000ull) != CUDA_ERROR_INVALID_VALUE) return NULL;
    pthread_setspecific(key, (void *)1);
    return NULL;
}

int main(void) {
    if (cuInit(0) != CUDA_SUCCESS) return 1;
    pthread_key_create(&key, on_thread_exit);
    pthread_t t;
    pthread_create(&t, NULL, worker, NULL);
    pthread_join(t, NULL);
    /* The thread's context stack went with its locals: no current context. */
    if (at_exit_free != CUDA_ERROR_INVALID_CONTEXT || at_exit_ctx != CUDA_SUCCESS ||
        at_exit_current != NULL) {
        printf("FAILED: %d %d %p\n", (int)at_exit_free, (int)at_exit_ctx, (void *)at_exit_current);
        return 1;
    }
    printf("ok\n");
    return 0;
}
