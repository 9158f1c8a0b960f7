/* pool.h — the forward's worker threads.
 * Owns: a persistent team of threads (created on first use, count from
 * omp_get_max_threads()) that run "jobs": n_chunks independent calls fn(ctx, chunk).
 * The caller thread takes chunks too and returns once every chunk has run. Chunks are
 * claimed dynamically, so a descheduled worker never stalls the caller for more than the
 * chunk it holds (no team barrier). Idle workers spin briefly, then sleep.
 * Results must not depend on which thread runs a chunk (the callers guarantee it). */
#ifndef COLI_POOL_H
#define COLI_POOL_H

typedef void (*pool_fn)(void *ctx, int chunk);

/* Run fn(ctx, c) for c in [0, n_chunks); n_chunks <= 1 or a nested call runs inline. */
void pool_run(pool_fn fn, void *ctx, int n_chunks);
/* Index of the calling thread in [0, pool_threads()) (0: not a pool worker). */
int pool_thread_id(void);
/* Threads a job can use (caller included). */
int pool_threads(void);
#endif
