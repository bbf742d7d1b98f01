// A libcuda.so.1 that forwards every call to the library REAL_CUDA names (NVIDIA's driver,
// or the vGPU library) and writes to TRACE_OUT what a program asks the driver and gets:
// every cuGetProcAddress lookup, every private table (cuGetExportTable) and the first 40
// calls of each of its slots, device and function attributes, occupancy answers, launch
// shapes, limits and memory info. Run a program once over each library and compare the
// two files (README.md). A debugging tool: it does not check what it forwards.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef uint64_t u64;
static void *real;
static FILE *lg;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
#define L(...) do { pthread_mutex_lock(&mu); fprintf(lg, __VA_ARGS__); fflush(lg); pthread_mutex_unlock(&mu);} while (0)
static void init(void) {
    if (real) return;
    real = dlopen(getenv("REAL_CUDA"), RTLD_NOW | RTLD_LOCAL);
    const char *o = getenv("TRACE_OUT");
    lg = fopen(o ? o : "/tmp/trace.log", "w");
    if (!real) { fprintf(stderr, "trace: %s\n", dlerror()); abort(); }
}
typedef CUresult (*gpa2_t)(const char *, void **, int, u64, int *);
typedef CUresult (*gpa1_t)(const char *, void **, int, u64);
static gpa2_t rgpa2;
void *trace_real(void) { init(); return real; }

// ---- generic slot trampolines for export tables ----
#define NT 2048
static struct { void *f; char tag[48]; int calls; } slot[NT];
static int nslot;
typedef u64 (*g6)(u64, u64, u64, u64, u64, u64);
static u64 tcall(int i, u64 a, u64 b, u64 c, u64 d, u64 e, u64 f) {
    u64 r = ((g6)slot[i].f)(a, b, c, d, e, f);
    if (__sync_fetch_and_add(&slot[i].calls, 1) < 40)
        L("SLOT %s (%#lx,%#lx,%#lx,%#lx) -> %#lx\n", slot[i].tag, a, b, c, d, r);
    return r;
}
#include "tramps.h" // from gen.py: NT trampolines T0..T(NT-1) calling tcall(i, ...), and tramp[]
static int is_code(void *p) {
    FILE *m = fopen("/proc/self/maps", "r");
    char line[512];
    int code = 0;
    while (fgets(line, sizeof line, m)) {
        u64 lo, hi; char perm[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perm) == 3 && perm[2] == 'x' && (u64)p >= lo && (u64)p < hi) { code = 1; break; }
    }
    fclose(m);
    return code;
}
typedef struct { unsigned char b[16]; } uuid_t_;
static struct { unsigned char id[16]; void *orig; void **copy; } tables[64];
static int ntables;
typedef CUresult (*get_export_t)(const void **, const uuid_t_ *);
static get_export_t rget_export;
static CUresult w_cuGetExportTable(const void **out, const uuid_t_ *id) {
    CUresult r = rget_export(out, id);
    char u[40]; for (int i = 0; i < 16; i++) sprintf(u + 2 * i, "%02x", id->b[i]);
    L("EXPORT %s -> %d\n", u, r);
    if (r || !*out) return r;
    // CUDART_INTERFACE and INTEGRITY_CHECK pass as they are: the runtime's integrity hash
    // covers their addresses.
    if (!strncmp(u, "6bd5fb6c", 8) || !strncmp(u, "d4082055", 8) || getenv("TRACE_NO_TABLES")) return r;
    pthread_mutex_lock(&mu);
    for (int t = 0; t < ntables; t++) if (!memcmp(tables[t].id, id->b, 16) && tables[t].orig == *out) { *out = tables[t].copy; pthread_mutex_unlock(&mu); return r; }
    pthread_mutex_unlock(&mu);
    u64 *tb = (u64 *)*out;
    u64 n = tb[0];
    if (!(n % 8 == 0 && n >= 16 && n < 4096)) { L("EXPORT %s: first word %#lx, not wrapped\n", u, n); return r; }
    n /= 8;
    void **copy = calloc(n, sizeof(void *));
    copy[0] = (void *)tb[0];
    for (u64 s = 1; s < n; s++) {
        void *f = (void *)tb[s];
        if (f && is_code(f) && nslot < NT) {
            int i = __sync_fetch_and_add(&nslot, 1);
            slot[i].f = f; snprintf(slot[i].tag, 48, "%.8s[%lu]", u, s);
            copy[s] = tramp[i];
        } else copy[s] = f;
    }
    pthread_mutex_lock(&mu);
    memcpy(tables[ntables].id, id->b, 16); tables[ntables].orig = (void *)*out; tables[ntables].copy = copy; ntables++;
    pthread_mutex_unlock(&mu);
    L("EXPORT %s: %lu slots wrapped\n", u, n);
    *out = copy;
    return r;
}

// ---- specific wrappers ----
typedef void *CUfunction;
typedef struct { unsigned gx, gy, gz, bx, by, bz, smem; void *stream; void *attrs; unsigned nattrs; } CUlaunchConfig;
typedef struct { int id; int pad; union { struct { unsigned x, y, z; } dim; int v; char raw[64]; } val; } CUlaunchAttribute;
static CUresult (*rFuncGetName)(const char **, CUfunction);
static CUresult (*rKernelGetName)(const char **, void *);
static const char *fname(CUfunction f) { const char *n = "?"; if (rFuncGetName && rFuncGetName(&n, f) == 0) return n; return "?"; }
static const char *kname(void *k) { const char *n = "?"; if (rKernelGetName && rKernelGetName(&n, k) == 0) return n; return "?"; }
static void cfgs(char *s, int len, const CUlaunchConfig *c) {
    int o = snprintf(s, len, "grid %u,%u,%u block %u,%u,%u smem %u attrs", c->gx, c->gy, c->gz, c->bx, c->by, c->bz, c->smem);
    CUlaunchAttribute *a = c->attrs;
    for (unsigned i = 0; i < c->nattrs && o < len - 40; i++)
        o += snprintf(s + o, len - o, " [%d: %u,%u,%u]", a[i].id, a[i].val.dim.x, a[i].val.dim.y, a[i].val.dim.z);
}
static CUresult (*rDevAttr)(int *, int, int);
static CUresult w_DevAttr(int *v, int a, int d) { CUresult r = rDevAttr(v, a, d); L("DEVATTR %d -> %d (%d)\n", a, r ? -1 : *v, r); return r; }
static CUresult (*rFuncAttr)(int *, int, CUfunction);
static CUresult w_FuncAttr(int *v, int a, CUfunction f) { CUresult r = rFuncAttr(v, a, f); L("FUNCATTR %s %d -> %d (%d)\n", fname(f), a, r ? -1 : *v, r); return r; }
static CUresult (*rKerAttr)(int *, int, void *, int);
static CUresult w_KerAttr(int *v, int a, void *k, int d) { CUresult r = rKerAttr(v, a, k, d); L("KERATTR %s %d -> %d (%d)\n", kname(k), a, r ? -1 : *v, r); return r; }
static CUresult (*rFuncSet)(CUfunction, int, int);
static CUresult w_FuncSet(CUfunction f, int a, int v) { CUresult r = rFuncSet(f, a, v); L("FUNCSET %s %d = %d (%d)\n", fname(f), a, v, r); return r; }
static CUresult (*rKerSet)(int, int, void *, int);
static CUresult w_KerSet(int a, int v, void *k, int d) { CUresult r = rKerSet(a, v, k, d); L("KERSET %s %d = %d (%d)\n", kname(k), a, v, r); return r; }
static CUresult (*rOccClusters)(int *, CUfunction, const CUlaunchConfig *);
static CUresult w_OccClusters(int *n, CUfunction f, const CUlaunchConfig *c) { CUresult r = rOccClusters(n, f, c); char s[512]; cfgs(s, 512, c); L("OCCCLUSTERS %s %s -> %d (%d)\n", fname(f), s, r ? -1 : *n, r); return r; }
static CUresult (*rOccSize)(int *, CUfunction, const CUlaunchConfig *);
static CUresult w_OccSize(int *n, CUfunction f, const CUlaunchConfig *c) { CUresult r = rOccSize(n, f, c); char s[512]; cfgs(s, 512, c); L("OCCSIZE %s %s -> %d (%d)\n", fname(f), s, r ? -1 : *n, r); return r; }
static CUresult (*rOccBlocks)(int *, CUfunction, int, size_t);
static CUresult w_OccBlocks(int *n, CUfunction f, int b, size_t s) { CUresult r = rOccBlocks(n, f, b, s); L("OCCBLOCKS %s %d %zu -> %d (%d)\n", fname(f), b, s, r ? -1 : *n, r); return r; }
static CUresult (*rOccBlocksF)(int *, CUfunction, int, size_t, unsigned);
static CUresult w_OccBlocksF(int *n, CUfunction f, int b, size_t s, unsigned fl) { CUresult r = rOccBlocksF(n, f, b, s, fl); L("OCCBLOCKSF %s %d %zu %u -> %d (%d)\n", fname(f), b, s, fl, r ? -1 : *n, r); return r; }
static CUresult (*rLaunchEx)(const CUlaunchConfig *, CUfunction, void **, void **);
static int nlex;
static CUresult w_LaunchEx(const CUlaunchConfig *c, CUfunction f, void **p, void **e) { CUresult r = rLaunchEx(c, f, p, e); if (__sync_fetch_and_add(&nlex, 1) < 30) { char s[512]; cfgs(s, 512, c); L("LAUNCHEX %s %s (%d)\n", fname(f), s, r); } return r; }
static CUresult (*rLaunch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *, void **, void **);
static int nl;
static CUresult w_Launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz, unsigned sm, void *st, void **p, void **e) { CUresult r = rLaunch(f, gx, gy, gz, bx, by, bz, sm, st, p, e); if (__sync_fetch_and_add(&nl, 1) < 30) L("LAUNCH %s grid %u,%u,%u block %u,%u,%u smem %u (%d)\n", fname(f), gx, gy, gz, bx, by, bz, sm, r); return r; }
static CUresult (*rLimit)(size_t *, int);
static CUresult w_Limit(size_t *v, int l) { CUresult r = rLimit(v, l); L("LIMIT %d -> %zu (%d)\n", l, r ? 0 : *v, r); return r; }
static CUresult (*rMemInfo)(size_t *, size_t *);
static CUresult w_MemInfo(size_t *f, size_t *t) { CUresult r = rMemInfo(f, t); L("MEMINFO -> %zu %zu (%d)\n", r ? 0 : *f, r ? 0 : *t, r); return r; }
static CUresult (*rCtxFlags)(unsigned *);
static CUresult w_CtxFlags(unsigned *f) { CUresult r = rCtxFlags(f); L("CTXFLAGS -> %u (%d)\n", r ? 0 : *f, r); return r; }

struct w { const char *name; void *w; void **r; };
static struct w wraps[] = {
    {"cuGetExportTable", w_cuGetExportTable, (void **)&rget_export},
    {"cuDeviceGetAttribute", w_DevAttr, (void **)&rDevAttr},
    {"cuFuncGetAttribute", w_FuncAttr, (void **)&rFuncAttr},
    {"cuKernelGetAttribute", w_KerAttr, (void **)&rKerAttr},
    {"cuFuncSetAttribute", w_FuncSet, (void **)&rFuncSet},
    {"cuKernelSetAttribute", w_KerSet, (void **)&rKerSet},
    {"cuOccupancyMaxActiveClusters", w_OccClusters, (void **)&rOccClusters},
    {"cuOccupancyMaxPotentialClusterSize", w_OccSize, (void **)&rOccSize},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessor", w_OccBlocks, (void **)&rOccBlocks},
    {"cuOccupancyMaxActiveBlocksPerMultiprocessorWithFlags", w_OccBlocksF, (void **)&rOccBlocksF},
    {"cuLaunchKernelEx", w_LaunchEx, (void **)&rLaunchEx},
    {"cuLaunchKernel", w_Launch, (void **)&rLaunch},
    {"cuCtxGetLimit", w_Limit, (void **)&rLimit},
    {"cuMemGetInfo", w_MemInfo, (void **)&rMemInfo},
    {"cuCtxGetFlags", w_CtxFlags, (void **)&rCtxFlags},
    {0, 0, 0}};
CUresult cuGetProcAddress_v2(const char *, void **, int, u64, int *);
CUresult cuGetProcAddress(const char *, void **, int, u64);
static void *wrap(const char *sym, void *f, int ver, u64 flags) {
    if (!f) return f;
    if (!rFuncGetName) { void *p = 0; int st; rgpa2("cuFuncGetName", &p, 12000, 0, &st); rFuncGetName = p; rgpa2("cuKernelGetName", &p, 12030, 0, &st); rKernelGetName = p; }
    if (!strcmp(sym, "cuGetProcAddress")) return ver >= 12000 ? (void *)cuGetProcAddress_v2 : (void *)cuGetProcAddress;
    for (struct w *w = wraps; w->name; w++)
        if (!strcmp(w->name, sym) && !(flags & 2)) {
            if (*w->r && *w->r != f) { L("WRAP %s: second version %d, passed through\n", sym, ver); return f; }
            *w->r = f;
            return w->w;
        }
    return f;
}
CUresult cuGetProcAddress_v2(const char *sym, void **pfn, int ver, u64 flags, int *st) {
    init();
    if (!rgpa2) rgpa2 = (gpa2_t)dlsym(real, "cuGetProcAddress_v2");
    int s = -1;
    CUresult r = rgpa2(sym, pfn, ver, flags, &s);
    if (st) *st = s;
    L("GPA %s %d %lu -> %d st %d %s\n", sym, ver, flags, r, s, (pfn && *pfn) ? "fn" : "null");
    if (!r && pfn) *pfn = wrap(sym, *pfn, ver, flags);
    return r;
}
CUresult cuGetProcAddress(const char *sym, void **pfn, int ver, u64 flags) {
    int st;
    return cuGetProcAddress_v2(sym, pfn, ver, flags, &st);
}
CUresult cuGetExportTable(const void **out, const uuid_t_ *id) {
    init();
    if (!rget_export) rget_export = (get_export_t)dlsym(real, "cuGetExportTable");
    return w_cuGetExportTable(out, id);
}
CUresult cuInit(unsigned f) { init(); L("DIRECT cuInit\n"); return ((CUresult(*)(unsigned))dlsym(real, "cuInit"))(f); }
CUresult cuDriverGetVersion(int *v) { init(); L("DIRECT cuDriverGetVersion\n"); return ((CUresult(*)(int *))dlsym(real, "cuDriverGetVersion"))(v); }
