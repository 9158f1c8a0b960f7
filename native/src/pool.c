/* pool.c — persistent worker threads with dynamic chunk claiming (see pool.h).
 *
 * Job publication: the job fields are written to slot gen & 1, then `ticket` is set to
 * gen << 32. The chunks are split into one contiguous range per thread; a thread claims the
 * chunks of its own range in order, then steals from the others' ranges. So each thread
 * walks its part of a matrix front to back (its software prefetch, which runs ahead of the
 * chunk it computes, fetches what it will compute next rather than a chunk the other thread
 * takes), and a descheduled thread's remaining chunks are still taken by the others. Each
 * range's counter holds gen << 32 | next index and is claimed with a CAS that also checks
 * the generation, so a late worker can never take a chunk of a newer job with the old job's
 * function. `done` counts finished chunks of the current job; the caller waits for
 * done == n_chunks. */
#include "pool.h"

#include <fcntl.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() ((void)0)
#endif

/* Pause iterations an idle worker spins before sleeping. Spinning keeps wake-ups cheap on
 * a quiet machine but steals time slices when the cores are oversubscribed (other
 * CPU-bound processes): the caller measures the share of time it waited on a run queue
 * and drops the spin to SPIN_BUSY while that share is high. POOL_SPIN=N fixes it. */
#define SPIN_QUIET 4000
#define SPIN_BUSY 0
static _Atomic int spin_idle = SPIN_QUIET;
static int spin_fixed = -1;
#define SPIN_WAIT 2000      /* pause iterations the caller spins before yielding */
#define MAX_THREADS 256
/* Share of wall time the caller spent runnable but not running (/proc/thread-self/schedstat)
 * above which the cores count as oversubscribed. Measured on a 2-vCPU VM, default model,
 * 8 slots: 0.1-2 % alone, 1.3-4.5 % under the web stack's short wake-ups (Daphne, bridge,
 * Redis), 15-24 % beside one CPU-bound process. The count of involuntary switches used
 * before could not tell the second case from the third (both 100-200/s): it stopped the
 * spin under web load and cost 10-20 % of the engine's throughput there (issue 14).
 * At 10 % the web stack at 8 streams still crossed it (2026-12-05, another VM: 1,185-1,753
 * wake-ups per 1,000 tokens against ~220 with the spin held, bench/webpath.py A/Bs of 8 and
 * 16 rounds: web / raw 0.849 / 0.900 / 0.911 at 10 %, 0.947 / 0.936 with POOL_SPIN=4000, 0.929
 * at 30 %). 30 % keeps the spin under the web stack, the deployment this engine serves; one
 * CPU-bound neighbour (15-24 %) no longer drops it, a crowded host (load 7-9, where a fixed
 * spin once halved decode) should still: that case was not re-measured at 30 %. */
#define SPIN_BUSY_DELAY 0.30

static struct {
    pthread_once_t once;
    int nthr;                           /* threads incl. the caller */
    _Alignas(64) _Atomic uint64_t ticket;   /* gen << 32: the current job's generation */
    _Alignas(64) _Atomic int done;          /* own cache line: claims and completions don't contend */
    struct {                            /* job of generation g in slot g & 1 */
        _Atomic(pool_fn) fn;
        _Atomic(void *) ctx;
        struct {                        /* thread t's range: next (gen << 32 | index) .. end */
            _Alignas(64) _Atomic uint64_t next;
            _Atomic int end;
        } range[MAX_THREADS];
    } job[2];
    _Alignas(64) _Atomic int sleepers;
    _Atomic int busy;                   /* a job is running (nested calls run inline) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint32_t gen;
} P = {.once = PTHREAD_ONCE_INIT, .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

/* Claims the next chunk of range u of job g: its index, or -1 when the range is used up
 * (or the job is no longer g). */
static int claim(uint32_t g, int u) {
    _Atomic uint64_t *next = &P.job[g & 1].range[u].next;
    const int end = atomic_load(&P.job[g & 1].range[u].end);
    uint64_t t = atomic_load(next);
    for (;;) {
        if ((uint32_t)(t >> 32) != g || (int)(uint32_t)t >= end) return -1;
        if (atomic_compare_exchange_weak(next, &t, t + 1)) return (int)(uint32_t)t;
    }
}

/* Run chunks of job generation g, own range first (self = the caller's range), then the
 * others'; returns when none are left. */
static void run_chunks(uint32_t g, int self) {
    /* Slot g & 1 is rewritten only for generation g + 2, published after job g + 1 began;
     * so when a CAS on (g, c) succeeds, the fields read before it were job g's (all
     * accesses are sequentially consistent). */
    pool_fn fn = atomic_load(&P.job[g & 1].fn);
    void *ctx = atomic_load(&P.job[g & 1].ctx);
    const int nr = P.nthr;
    for (int k = 0; k < nr; k++) {
        const int u = (self + k) % nr;
        for (int c; (c = claim(g, u)) >= 0;) {
            fn(ctx, c);
            atomic_fetch_add(&P.done, 1);
        }
        if ((uint32_t)(atomic_load(&P.ticket) >> 32) != g) return;
    }
}

static _Thread_local int tid;
static cpu_set_t pin_cpus;          /* allowed CPUs at start; thread i -> the i-th of them */
static int pin_on;

static void pin_self(int i) {
    if (!pin_on) return;
    int k = 0;
    for (int c = 0; c < CPU_SETSIZE; c++)
        if (CPU_ISSET(c, &pin_cpus) && k++ == i) {
            cpu_set_t one;
            CPU_ZERO(&one);
            CPU_SET(c, &one);
            pthread_setaffinity_np(pthread_self(), sizeof one, &one);
            return;
        }
}

int pool_thread_id(void) { return tid; }

static void *worker(void *arg) {
    tid = (int)(intptr_t)arg;
    pin_self(tid);
    uint32_t seen = 0;
    for (;;) {
        uint64_t t;
        int spins = 0;
        while ((uint32_t)((t = atomic_load_explicit(&P.ticket, memory_order_acquire)) >> 32) == seen) {
            if (++spins < atomic_load_explicit(&spin_idle, memory_order_relaxed)) {
                CPU_RELAX();
                continue;
            }
            pthread_mutex_lock(&P.mu);
            atomic_fetch_add(&P.sleepers, 1);
            while ((uint32_t)(atomic_load(&P.ticket) >> 32) == seen) pthread_cond_wait(&P.cv, &P.mu);
            atomic_fetch_sub(&P.sleepers, 1);
            pthread_mutex_unlock(&P.mu);
            spins = 0;
        }
        seen = (uint32_t)(t >> 32);
        run_chunks(seen, tid);
    }
    return NULL;
}

static void pool_init(void) {
    int n = omp_get_max_threads();
    if (n < 1) n = 1;
    if (n > MAX_THREADS) n = MAX_THREADS;
    P.nthr = 1;
    const char *sp = getenv("POOL_SPIN");
    if (sp && *sp) spin_fixed = atoi(sp);
    if (spin_fixed >= 0) atomic_store(&spin_idle, spin_fixed);
    const char *pe = getenv("POOL_PIN");
    if (pe && *pe == '1' && sched_getaffinity(0, sizeof pin_cpus, &pin_cpus) == 0 && CPU_COUNT(&pin_cpus) >= n)
        pin_on = 1;
    pin_self(0);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, &old);     /* signals stay with the main thread */
    for (int i = 1; i < n; i++) {
        pthread_t th;
        if (pthread_create(&th, NULL, worker, (void *)(intptr_t)i) != 0) break;
        pthread_detach(th);
        P.nthr++;
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
}

int pool_threads(void) {
    pthread_once(&P.once, pool_init);
    return P.nthr;
}

/* Nanoseconds the calling thread has waited on a run queue (schedstat's second field), or
 * -1 where the kernel does not say. The file stays open: a pread re-reads it. */
static long long run_delay_ns(void) {
    static int fd = -2;
    if (fd == -2) fd = open("/proc/thread-self/schedstat", O_RDONLY | O_CLOEXEC);
    char buf[128];
    ssize_t n = fd >= 0 ? pread(fd, buf, sizeof buf - 1, 0) : -1;
    if (n <= 0) return -1;
    buf[n] = 0;
    long long run, delay;
    return sscanf(buf, "%lld %lld", &run, &delay) == 2 ? delay : -1;
}

/* Every ~0.2 s of jobs: the caller's run-queue delay share decides whether idle workers spin. */
static void adapt_spin(void) {
    static double t_last;
    static long long delay_last;
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
    double now = (double)ts.tv_sec + ts.tv_nsec * 1e-9;
    if (now - t_last < 0.2) return;
    long long delay = run_delay_ns();
    if (delay < 0) return;
    if (t_last > 0 && now - t_last < 5.0) {
        double share = (double)(delay - delay_last) * 1e-9 / (now - t_last);
        atomic_store_explicit(&spin_idle, share > SPIN_BUSY_DELAY ? SPIN_BUSY : SPIN_QUIET, memory_order_relaxed);
    }
    t_last = now;
    delay_last = delay;
}

void pool_run(pool_fn fn, void *ctx, int n_chunks) {
    if (n_chunks <= 0) return;
    int expect = 0;
    if (n_chunks == 1 || pool_threads() == 1 ||
        !atomic_compare_exchange_strong(&P.busy, &expect, 1)) {
        for (int c = 0; c < n_chunks; c++) fn(ctx, c);
        return;
    }
    if (spin_fixed < 0) adapt_spin();
    uint32_t g = ++P.gen;
    if (g == 0) g = ++P.gen;                    /* workers start with seen = 0 */
    atomic_store(&P.job[g & 1].fn, fn);
    atomic_store(&P.job[g & 1].ctx, ctx);
    for (int u = 0; u < P.nthr; u++) {      /* contiguous ranges, one per thread */
        /* next before end: claim() reads end before next, so a late worker of generation
         * g - 2 that still sees its own generation in next also sees that job's end */
        atomic_store(&P.job[g & 1].range[u].next, (uint64_t)g << 32 | (uint32_t)((long)n_chunks * u / P.nthr));
        atomic_store(&P.job[g & 1].range[u].end, (int)((long)n_chunks * (u + 1) / P.nthr));
    }
    atomic_store(&P.done, 0);
    atomic_store(&P.ticket, (uint64_t)g << 32);
    if (atomic_load(&P.sleepers) > 0) {
        pthread_mutex_lock(&P.mu);
        pthread_cond_broadcast(&P.cv);
        pthread_mutex_unlock(&P.mu);
    }
    run_chunks(g, 0);
    int spins = 0;
    while (atomic_load_explicit(&P.done, memory_order_acquire) < n_chunks) {
        if (++spins < SPIN_WAIT) CPU_RELAX();
        else sched_yield();
    }
    atomic_store(&P.busy, 0);
}
