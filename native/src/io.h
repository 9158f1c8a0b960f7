/* io.h — I/O lanes: a few threads that only wait on the disk, apart from the compute pool.
 * Owns: the lanes (created on first use, IO_LANES of them, default 4; 0 = the caller reads),
 * and batches of read tasks that run on them while the caller computes.
 *
 * Why: a disk's random-read bandwidth needs several requests in flight (queue depth), and a
 * compute thread blocked in pread is a core doing nothing; lanes keep the reads of a layer's
 * missing experts (and the lookahead's guesses) going while the pool computes what is
 * resident. Tasks must be independent; their results are visible to the caller after io_wait
 * (the lanes hand them over under a mutex). */
#ifndef COLI_IO_H
#define COLI_IO_H

typedef void (*io_fn)(void *ctx, int task);

typedef struct io_batch {
    io_fn fn;
    void *ctx;
    int n;                  /* tasks 0 .. n - 1 */
    int next, done;         /* guarded by the lanes' mutex */
    struct io_batch *link;  /* queue of batches with tasks left */
} io_batch;

/* Queues fn(ctx, 0 .. n - 1) on the lanes and returns at once (b must live until io_wait). */
void io_submit(io_batch *b, io_fn fn, void *ctx, int n);
/* Runs the batch's tasks no lane has taken yet on the calling thread, then waits until every
 * task of b has finished. */
void io_wait(io_batch *b);
/* Non-zero once every task of b has finished (no waiting). */
int io_done(io_batch *b);
/* Seconds no read task was running, from the first task's end on: time the disk stood idle
 * (a diagnostic: where streaming fails to overlap). */
double io_idle_s(void);
/* The number of lanes (IO_LANES, 0 .. 16; read once). */
int io_lanes(void);
#endif
