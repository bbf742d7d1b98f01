// The built-in storage kernels on a CUDA GPU (docs/storage.md "On CUDA GPUs"):
// GPU threads read an NVMe namespace themselves. A miss in the software cache makes one
// thread enqueue an NVMe Read on a BaM queue pair (ticket, turn counters, marks, one
// tail-lock winner that rings one doorbell for every marked entry), and wait for its
// completion. This is the algorithm of storage/src/queue/ and storage/src/cache.rs on the
// GPU, with one change on the completion side (see there).
//
// Where things live: the queue's counters, marks and the cache's state words are device
// memory (GPU atomics); the SQ/CQ entries, the doorbells and the cache lines are pinned
// host memory mapped to the GPU, where the emulated controller reads and writes them. With
// a real controller and GPUDirect the lines and queues would be device memory instead.
//
// The block `Storage` is laid out exactly as `StorageBlock` in
// backend/src/cuda/storage.rs (every field 8 bytes). Every wait has a %globaltimer
// deadline: a controller that stops answering poisons the queue and ends the kernel with an
// error word, never a hung GPU. Regenerate storage.ptx with build-ptx.sh.

typedef unsigned long long u64;
typedef unsigned int u32;

#define E_TIMEOUT 1ULL
#define E_STATUS 2ULL
#define E_INDEX 3ULL
#define E_EXHAUSTED 4ULL
#define E_GRAPH 5ULL
#define E_POISONED 6ULL
#define E_REFS 7ULL

#define VALID (1ULL << 63)
#define BUSY (1ULL << 62)
#define SLOT_SHIFT 32
#define SLOT_MASK ((1ULL << 30) - 1)
#define REF_MASK 0xffffffffULL

struct Storage {
    // Queue pair state (device memory, GPU atomics).
    u64 ticket, tail, sq_head, cq_head, tail_lock, cq_lock;
    // Results, read by the host after each launch.
    u64 poisoned, error, error_arg, nvme_status, changed;
    u64 hand, hits, misses, evictions, commands;
    // Arrays in device memory.
    u64 *turns;
    u64 *tail_mark;
    u64 *sq_free_mark;
    u64 *done;  // per command identifier: status << 1 | 1 once reaped
    // Pinned host memory mapped to the GPU.
    volatile u32 *sq;
    volatile u32 *cq;
    volatile u32 *sq_db;
    volatile u32 *cq_db;
    // Cache state (device memory).
    u64 *pages;
    u64 *owner;
    u64 *referenced;
    u64 *slot_lock;
    // Cache lines: the GPU's pointer and the controller's address of the same bytes.
    const unsigned char *lines;
    u64 lines_iova;
    // Configuration.
    u64 npages, ns_bytes, timeout_ns, depth, log2, line_bytes, nlines, nsid, block_bytes;
    // The SQ-lock (moving the SQ head over freed slots); last so the words above keep
    // their offsets.
    u64 sq_lock;
};

__device__ __forceinline__ u64 now_ns() {
    u64 t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

__device__ __forceinline__ u32 ld_relaxed_sys(const volatile u32 *p) {
    u32 v;
    asm volatile("ld.relaxed.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void fence_acq_rel_sys() {
    asm volatile("fence.acq_rel.sys;" ::: "memory");
}

__device__ __forceinline__ void st_release_sys(volatile u32 *p, u32 v) {
    asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// One 16-byte store to host memory (a quarter of an SQE), so an entry crosses the bus in
// four writes rather than sixteen.
__device__ __forceinline__ void st_v4_sys(volatile u32 *p, u32 a, u32 b, u32 c, u32 d) {
    asm volatile("st.volatile.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(a), "r"(b),
                 "r"(c), "r"(d)
                 : "memory");
}

__device__ __forceinline__ u64 ld_acquire(const u64 *p) {
    u64 v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void st_release(u64 *p, u64 v) {
    asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Records the first error; a timeout also poisons the queue so every waiter gives up.
__device__ void fail(Storage *s, u64 code, u64 arg) {
    if (atomicCAS(&s->error, 0ULL, code) == 0ULL) {
        atomicExch(&s->error_arg, arg);
    }
    if (code == E_TIMEOUT) {
        atomicExch(&s->poisoned, 1ULL);
    }
}

__device__ __forceinline__ bool stopped(Storage *s) {
    return ld_acquire(&s->error) != 0ULL;
}

struct Waiter {
    u64 deadline;
    u32 nap;
};

__device__ __forceinline__ Waiter waiter(Storage *s, u64 scale) {
    Waiter w;
    w.deadline = now_ns() + s->timeout_ns * scale;
    w.nap = 32;
    return w;
}

// One step of a bounded wait: false once the queue is poisoned or the deadline passed.
__device__ bool wait_step(Storage *s, Waiter &w, u64 code) {
    if (ld_acquire(&s->poisoned)) {
        fail(s, E_POISONED, 0);
        return false;
    }
    if (now_ns() > w.deadline) {
        fail(s, code, 0);
        return false;
    }
    __nanosleep(w.nap);
    if (w.nap < 2048) {
        w.nap *= 2;
    }
    return true;
}

// ---- submission (storage/src/queue/submit.rs) ----

// With the tail lock held: claim every consecutive marked slot and ring the doorbell once.
__device__ void move_tail(Storage *s) {
    u64 mask = s->depth - 1;
    u64 cur = ld_acquire(&s->tail);
    u64 n = 0;
    while (n < s->depth && atomicExch(&s->tail_mark[(cur + n) & mask], 0ULL) != 0ULL) {
        n++;
    }
    if (n > 0) {
        __threadfence_system();
        st_release_sys(s->sq_db, (u32)((cur + n) & mask));
        st_release(&s->tail, cur + n);
    }
}

// Enqueues a Read of `nlb` blocks at `slba` into controller address `prp1`; the command
// identifier (the SQ slot) goes to `cid`.
__device__ bool submit(Storage *s, u64 slba, u32 nlb, u64 prp1, u32 *cid) {
    u64 mask = s->depth - 1;
    u64 t = atomicAdd(&s->ticket, 1ULL);
    u64 pos = t & mask;
    u64 turn = t >> s->log2;
    Waiter w = waiter(s, 1);
    while (ld_acquire(&s->turns[pos]) != turn || t + 1 - ld_acquire(&s->sq_head) >= s->depth) {
        if (!wait_step(s, w, E_TIMEOUT)) {
            return false;
        }
    }
    volatile u32 *e = s->sq + pos * 16;
    st_v4_sys(e, 0x02u | ((u32)pos << 16), (u32)s->nsid, 0, 0);
    st_v4_sys(e + 4, 0, 0, (u32)prp1, (u32)(prp1 >> 32));
    st_v4_sys(e + 8, 0, 0, (u32)slba, (u32)(slba >> 32));
    st_v4_sys(e + 12, nlb - 1, 0, 0, 0);
    // The entry reaches host memory before anyone can see the mark and ring for it.
    __threadfence_system();
    atomicExch(&s->tail_mark[pos], 1ULL);
    while (ld_acquire(&s->tail_mark[pos]) != 0ULL) {
        if (atomicExch(&s->tail_lock, 1ULL) == 0ULL) {
            __threadfence();
            move_tail(s);
            __threadfence();
            atomicExch(&s->tail_lock, 0ULL);
        } else if (!wait_step(s, w, E_TIMEOUT)) {
            return false;
        }
    }
    *cid = (u32)pos;
    return true;
}

// ---- completion (after storage/src/queue/complete.rs, with one change) ----
//
// The CQ lives in host memory, across PCIe: BaM's rule (every waiter scans the CQ from the
// head for its command identifier) costs each waiter up to `depth` reads over the bus per
// poll, and measured ten times slower than the host path. So whoever wins the CQ lock
// *reaps*: it reads each new entry once, posts its status in `done[cid]` (device memory),
// moves the head and rings the CQ doorbell once; every waiter polls only its own `done`
// word. A waiter clears its word and then frees its SQ slot (in order, by the SQ-lock
// winner), so a command identifier is reused only after its last completion was read.

__device__ void move_sq_head(Storage *s) {
    u64 mask = s->depth - 1;
    u64 cur = ld_acquire(&s->sq_head);
    u64 n = 0;
    while (n < s->depth) {
        u64 loc = (cur + n) & mask;
        if (atomicExch(&s->sq_free_mark[loc], 0ULL) == 0ULL) {
            break;
        }
        atomicAdd(&s->turns[loc], 1ULL);
        n++;
    }
    if (n > 0) {
        __threadfence();
        st_release(&s->sq_head, cur + n);
    }
}

// Marks slot `cid` free; the SQ-lock winner moves the SQ head over freed slots in order.
// Like a CQ consumer in BaM, nobody waits for the head to pass its own slot.
__device__ void free_slot(Storage *s, u64 cid) {
    u64 mask = s->depth - 1;
    atomicExch(&s->sq_free_mark[cid & mask], 1ULL);
    __threadfence();
    while (atomicExch(&s->sq_lock, 1ULL) == 0ULL) {
        __threadfence();
        move_sq_head(s);
        __threadfence();
        atomicExch(&s->sq_lock, 0ULL);
        __threadfence();
        u64 head = ld_acquire(&s->sq_head);
        if (ld_acquire(&s->sq_free_mark[head & mask]) == 0ULL) {
            break;
        }
    }
}

// CQ entries a reaper reads per round trip over the bus: independent loads, so their
// latencies overlap (one dependent load per entry held the first version to ~265k IOPS).
#define REAP_BATCH 16

// With the CQ lock held: post every new completion's status to `done`, move the head over
// them and ring the CQ doorbell once. Returns how many there were.
__device__ u64 reap(Storage *s) {
    u64 mask = s->depth - 1;
    u64 cur = ld_acquire(&s->cq_head);
    u64 n = 0;
    for (;;) {
        u32 dw3[REAP_BATCH];
#pragma unroll
        for (int k = 0; k < REAP_BATCH; k++) {
            dw3[k] = ld_relaxed_sys(s->cq + ((cur + n + (u64)k) & mask) * 4 + 3);
        }
        // Orders the entries' (and so the data's) visibility before what we publish.
        fence_acq_rel_sys();
        int k = 0;
        for (; k < REAP_BATCH && n + (u64)k < s->depth; k++) {
            u64 pos = cur + n + (u64)k;
            u32 want = ((pos >> s->log2) & 1ULL) == 0ULL ? 1u : 0u;
            if (((dw3[k] >> 16) & 1u) != want) {
                break;
            }
            st_release(&s->done[(u64)(dw3[k] & 0xffffu) & mask],
                       ((u64)(dw3[k] >> 17) << 1) | 1ULL);
        }
        n += (u64)k;
        if (k < REAP_BATCH || n >= s->depth) {
            break;
        }
    }
    if (n > 0) {
        st_release(&s->cq_head, cur + n);
        __threadfence_system();
        st_release_sys(s->cq_db, (u32)((cur + n) & mask));
    }
    return n;
}

// Waits for the completion of command `cid`; its 15-bit status goes to `status`.
__device__ bool complete(Storage *s, u32 cid, u32 *status) {
    Waiter w = waiter(s, 1);
    for (;;) {
        u64 d = ld_acquire(&s->done[cid]);
        if (d & 1ULL) {
            *status = (u32)(d >> 1);
            st_release(&s->done[cid], 0ULL);
            __threadfence();
            free_slot(s, cid);
            return true;
        }
        u64 got = 0;
        if (atomicExch(&s->cq_lock, 1ULL) == 0ULL) {
            __threadfence();
            got = reap(s);
            __threadfence();
            atomicExch(&s->cq_lock, 0ULL);
        }
        if (got == 0 && !wait_step(s, w, E_TIMEOUT)) {
            return false;
        }
    }
}

// ---- cache (storage/src/cache.rs) ----

// With slot `i` locked: take it if free or evictable.
__device__ bool try_take(Storage *s, u64 i, u64 page) {
    u64 owner = ld_acquire(&s->owner[i]);
    if (owner != 0ULL) {
        if (atomicExch(&s->referenced[i], 0ULL) != 0ULL) {
            return false;
        }
        u64 *victim = &s->pages[owner - 1];
        u64 v = ld_acquire(victim);
        if ((v & VALID) == 0ULL || (v & REF_MASK) != 0ULL || ((v >> SLOT_SHIFT) & SLOT_MASK) != i) {
            return false;
        }
        if (atomicCAS(victim, v, 0ULL) != v) {
            return false;
        }
        atomicAdd(&s->evictions, 1ULL);
    }
    st_release(&s->owner[i], page + 1);
    return true;
}

// Clock: sweep from the hand; a set reference bit buys another sweep, pinned lines stay.
__device__ long long evict_for(Storage *s, u64 page) {
    Waiter w = waiter(s, 1);
    for (;;) {
        for (u64 k = 0; k < s->nlines * 3; k++) {
            u64 i = atomicAdd(&s->hand, 1ULL) % s->nlines;
            if (atomicExch(&s->slot_lock[i], 1ULL) != 0ULL) {
                continue;
            }
            __threadfence();
            bool got = try_take(s, i, page);
            __threadfence();
            atomicExch(&s->slot_lock[i], 0ULL);
            if (got) {
                return (long long)i;
            }
        }
        if (!wait_step(s, w, E_EXHAUSTED)) {
            return -1;
        }
    }
}

// With page `page` claimed (BUSY): pick a slot, read the line, publish it with one ref.
__device__ long long fill(Storage *s, u64 page) {
    atomicAdd(&s->misses, 1ULL);
    u64 *st = &s->pages[page];
    long long slot = evict_for(s, page);
    if (slot < 0) {
        st_release(st, 0ULL);
        return -1;
    }
    u64 off = page * s->line_bytes;
    u64 len = s->ns_bytes - off < s->line_bytes ? s->ns_bytes - off : s->line_bytes;
    u32 cid = 0, status = 0;
    bool ok = submit(s, off / s->block_bytes, (u32)(len / s->block_bytes),
                     s->lines_iova + (u64)slot * s->line_bytes, &cid) &&
              complete(s, cid, &status);
    if (ok && (status & 0x7ffu) != 0u) {
        atomicCAS(&s->nvme_status, 0ULL, (u64)status);
        fail(s, E_STATUS, page);
        ok = false;
    }
    if (!ok) {
        st_release(&s->owner[slot], 0ULL);
        st_release(st, 0ULL);
        return -1;
    }
    atomicAdd(&s->commands, 1ULL);
    atomicExch(&s->referenced[slot], 1ULL);
    st_release(st, VALID | ((u64)slot << SLOT_SHIFT) | 1ULL);
    return slot;
}

// Pins the line of namespace page `page`, reading it on a miss; the slot, or -1.
__device__ long long acquire(Storage *s, u64 page) {
    if (page >= s->npages) {
        fail(s, E_INDEX, page);
        return -1;
    }
    u64 *st = &s->pages[page];
    Waiter w = waiter(s, 2);
    for (;;) {
        u64 v = ld_acquire(st);
        if (v & VALID) {
            if ((v & REF_MASK) == REF_MASK) {
                fail(s, E_REFS, page);
                return -1;
            }
            if (atomicCAS(st, v, v + 1) == v) {
                u64 slot = (v >> SLOT_SHIFT) & SLOT_MASK;
                if (ld_acquire(&s->referenced[slot]) == 0ULL) {
                    atomicExch(&s->referenced[slot], 1ULL);
                }
                atomicAdd(&s->hits, 1ULL);
                return (long long)slot;
            }
        } else if (v & BUSY) {
            if (!wait_step(s, w, E_TIMEOUT)) {
                return -1;
            }
        } else if (atomicCAS(st, 0ULL, BUSY) == 0ULL) {
            return fill(s, page);
        }
    }
}

// Each calling lane that wants one reads the element of type T at namespace byte `addr`
// (aligned to T). Lanes that ask for the same line are served by one acquire and one
// reference (BaM's warp coalescing). False if this lane wanted a value and got an error.
template <typename T>
__device__ bool warp_get(Storage *s, bool want, u64 addr, T *out) {
    u32 active = __activemask();
    u64 page = want ? addr / s->line_bytes : ~0ULL;
    u32 group = __match_any_sync(active, page);
    int leader = __ffs(group) - 1;
    int lane = threadIdx.x & 31;
    long long slot = 0;
    if (want && lane == leader) {
        slot = acquire(s, page);
    }
    slot = __shfl_sync(group, slot, leader);
    bool ok = want && slot >= 0;
    if (ok) {
        const T *p = (const T *)(s->lines + (u64)slot * s->line_bytes + addr % s->line_bytes);
        // .cv: the controller rewrites a slot's bytes when the slot takes another line.
        *out = __ldcv(p);
    }
    __syncwarp(group);
    if (want && lane == leader && slot >= 0) {
        __threadfence();
        atomicAdd(&s->pages[page], ~0ULL);  // one reference fewer
    }
    return ok || !want;
}

// ---- kernels (the parameter lists are docs/storage.md's, after the hidden block) ----

// dst[i] = A[idx[i]], A = elements of `eb` bytes from namespace byte `base` to the end.
extern "C" __global__ void vgpu_storage_gather(Storage *s, u64 base, const u64 *idx, void *dst,
                                               u64 n, u64 eb) {
    u64 count = (s->ns_bytes - base) / eb;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i0 = (u64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); i0 < n; i0 += stride) {
        if (stopped(s)) {
            return;
        }
        u64 i = i0 + (threadIdx.x & 31u);
        bool want = i < n;
        u64 e = want ? idx[i] : 0ULL;
        if (want && e >= count) {
            fail(s, E_INDEX, i);
            want = false;
        }
        if (eb == 4) {
            u32 v = 0;
            if (warp_get(s, want, base + e * 4, &v) && want) {
                ((u32 *)dst)[i] = v;
            }
        } else {
            u64 v = 0;
            if (warp_get(s, want, base + e * 8, &v) && want) {
                ((u64 *)dst)[i] = v;
            }
        }
    }
}

// *out = wrapping sum of `n` elements of `eb` bytes at namespace byte `base` (*out zeroed
// by the host first).
extern "C" __global__ void vgpu_storage_scan_sum(Storage *s, u64 base, u64 n, u64 eb, u64 *out) {
    u64 acc = 0;
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i0 = (u64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); i0 < n; i0 += stride) {
        if (stopped(s)) {
            break;
        }
        u64 i = i0 + (threadIdx.x & 31u);
        bool want = i < n;
        if (eb == 4) {
            u32 v = 0;
            if (warp_get(s, want, base + i * 4, &v) && want) {
                acc += v;
            }
        } else {
            u64 v = 0;
            if (warp_get(s, want, base + i * 8, &v) && want) {
                acc += v;
            }
        }
    }
    if (acc != 0ULL) {
        atomicAdd(out, acc);
    }
}

// One BFS level: every vertex at level `cur` visits its edges; unreached neighbours get
// cur + 1 and the block's `changed` word is set. The host repeats until nothing changed.
extern "C" __global__ void vgpu_storage_bfs_level(Storage *s, u64 offsets_base, u64 edges_base,
                                                  u64 vertices, u64 edges, u64 cur, u32 *levels) {
    u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 v0 = (u64)blockIdx.x * blockDim.x + (threadIdx.x & ~31u); v0 < vertices;
         v0 += stride) {
        if (stopped(s)) {
            return;
        }
        u64 v = v0 + (threadIdx.x & 31u);
        bool want = v < vertices && levels[v] == (u32)cur;
        u64 a = 0, b = 0;
        bool ok = warp_get(s, want, offsets_base + v * 8, &a);
        ok = warp_get(s, want, offsets_base + (v + 1) * 8, &b) && ok;
        if (!want || !ok) {
            continue;
        }
        if (a > b || b > edges) {
            fail(s, E_GRAPH, v);
            continue;
        }
        for (u64 e = a; e < b; e++) {
            u32 u = 0;
            if (!warp_get(s, true, edges_base + e * 4, &u)) {
                break;
            }
            if ((u64)u >= vertices) {
                fail(s, E_GRAPH, v);
                break;
            }
            if (atomicCAS(&levels[u], 0xffffffffu, (u32)cur + 1u) == 0xffffffffu) {
                atomicExch(&s->changed, 1ULL);
            }
        }
    }
}
