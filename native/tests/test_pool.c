/* test_pool.c — the worker pool runs every chunk of every job exactly once, and returns
 * only after all of them finished (stress: many small jobs back to back). */
#include "pool.h"

#include <omp.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#define MAXC 64
static _Atomic int hits[MAXC];
static _Atomic int finished;

typedef struct { int job; } ctx_t;

static void chunk(void *vctx, int c) {
    (void)vctx;
    for (volatile int k = 0; k < (c * 7) % 50; k++) {}
    atomic_fetch_add(&hits[c], 1);
    atomic_fetch_add(&finished, 1);
}

int main(void) {
    omp_set_num_threads(4);
    int fails = 0;
    printf("threads: %d\n", pool_threads());
    for (int j = 0; j < 200000 && fails < 5; j++) {
        int n = 1 + (j * 2654435761u >> 7) % MAXC;
        for (int c = 0; c < MAXC; c++) atomic_store(&hits[c], 0);
        atomic_store(&finished, 0);
        ctx_t ctx = {j};
        pool_run(chunk, &ctx, n);
        if (atomic_load(&finished) != n) {
            printf("FAIL job %d: %d of %d chunks finished at return\n", j, atomic_load(&finished), n);
            fails++;
        }
        for (int c = 0; c < MAXC; c++) {
            int want = c < n ? 1 : 0;
            if (atomic_load(&hits[c]) != want) {
                printf("FAIL job %d: chunk %d ran %d times (want %d)\n", j, c, atomic_load(&hits[c]), want);
                fails++;
                break;
            }
        }
    }
    if (fails) {
        printf("test_pool: %d failures\n", fails);
        return 1;
    }
    printf("test_pool: all passed\n");
    return 0;
}
