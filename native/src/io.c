/* io.c — I/O lanes (see io.h).
 *
 * One mutex guards the queue and every batch's next / done counters; lanes sleep on `work`
 * while the queue is empty, a waiter sleeps on `fin`. A task is claimed (next++) under the
 * mutex and run outside it, so reads of one batch overlap. Lanes are detached and live for
 * the process. */
#include "io.h"

#include <pthread.h>
#include <stdlib.h>
#include <time.h>

static struct {
    pthread_once_t once;
    pthread_mutex_t mu;
    pthread_cond_t work, fin;
    io_batch *head, *tail;
    int lanes;
    int running;            /* tasks being run, on lanes or callers */
    double idle_since, idle_s;  /* no task running since; idle time summed before that */
} L = {PTHREAD_ONCE_INIT, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER, PTHREAD_COND_INITIALIZER,
       NULL, NULL, 0, 0, 0.0, 0.0};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* A task starts / ends (mutex held): the disk is idle while none runs. */
static void task_begins(void) {
    if (L.running++ == 0 && L.idle_since > 0.0) L.idle_s += now_s() - L.idle_since;
}

/* The first queued batch with a task left, its task claimed; NULL when none (mutex held). */
static io_batch *claim(int *task) {
    while (L.head && L.head->next >= L.head->n) {
        L.head = L.head->link;
        if (!L.head) L.tail = NULL;
    }
    if (!L.head) return NULL;
    *task = L.head->next++;
    return L.head;
}

static void finish_task(io_batch *b) {
    if (--L.running == 0) L.idle_since = now_s();
    b->done++;
    if (b->done == b->n) pthread_cond_broadcast(&L.fin);
}

static void *lane_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&L.mu);
    for (;;) {
        int t;
        io_batch *b = claim(&t);
        if (!b) {
            pthread_cond_wait(&L.work, &L.mu);
            continue;
        }
        task_begins();
        pthread_mutex_unlock(&L.mu);
        b->fn(b->ctx, t);
        pthread_mutex_lock(&L.mu);
        finish_task(b);
    }
    return NULL;
}

static void lanes_init(void) {
    const char *v = getenv("IO_LANES");
    int n = v && *v ? atoi(v) : 4;
    if (n < 0) n = 0;
    if (n > 16) n = 16;
    for (int i = 0; i < n; i++) {
        pthread_t th;
        pthread_attr_t a;
        pthread_attr_init(&a);
        pthread_attr_setdetachstate(&a, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&a, 256 * 1024);
        if (pthread_create(&th, &a, lane_main, NULL) == 0) L.lanes++;
        pthread_attr_destroy(&a);
    }
}

int io_lanes(void) {
    pthread_once(&L.once, lanes_init);
    return L.lanes;
}

void io_submit(io_batch *b, io_fn fn, void *ctx, int n) {
    io_lanes();
    b->fn = fn;
    b->ctx = ctx;
    b->n = n > 0 ? n : 0;
    b->next = b->done = 0;
    b->link = NULL;
    if (b->n == 0 || L.lanes == 0) return;      /* io_wait runs the tasks */
    pthread_mutex_lock(&L.mu);
    if (L.tail) L.tail->link = b;
    else L.head = b;
    L.tail = b;
    pthread_cond_broadcast(&L.work);
    pthread_mutex_unlock(&L.mu);
}

void io_wait(io_batch *b) {
    pthread_mutex_lock(&L.mu);
    while (b->next < b->n) {                    /* what no lane has taken: on this thread */
        const int t = b->next++;
        task_begins();
        pthread_mutex_unlock(&L.mu);
        b->fn(b->ctx, t);
        pthread_mutex_lock(&L.mu);
        finish_task(b);
    }
    while (b->done < b->n) pthread_cond_wait(&L.fin, &L.mu);
    /* a drained batch may still be linked in the queue: unlink it before its memory goes */
    io_batch **p = &L.head, *prev = NULL;
    while (*p && *p != b) {
        prev = *p;
        p = &(*p)->link;
    }
    if (*p) {
        *p = b->link;
        if (L.tail == b) L.tail = prev;
    }
    pthread_mutex_unlock(&L.mu);
}

int io_done(io_batch *b) {
    pthread_mutex_lock(&L.mu);
    const int d = b->done >= b->n;
    pthread_mutex_unlock(&L.mu);
    return d;
}

double io_idle_s(void) {
    pthread_mutex_lock(&L.mu);
    double s = L.idle_s;
    if (L.running == 0 && L.idle_since > 0.0) s += now_s() - L.idle_since;
    pthread_mutex_unlock(&L.mu);
    return s;
}
