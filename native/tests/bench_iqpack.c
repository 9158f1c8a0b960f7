/* bench_iqpack.c — what packing an IQ1_S … IQ3_S expert buys and costs (not a test): per type,
 * the bytes per 256 weights of a row in the file and packed (what the expert cache holds), the
 * transcoding rate of qpack (GB/s of file bytes), and the time of one qmat_mul of an expert-shaped
 * matrix packed against unpacked (each call transcodes the groups on the fly), for n activation
 * rows. CPU time of this process, best of 5 samples; run with OMP_NUM_THREADS=1.
 * Build: make -C native build/bench_iqpack; usage: bench_iqpack [rows=512] [cols=2048] */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "quant.h"

static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t rnd32(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}

static float frand(void) { return (float)rnd32() / 2147483648.0f - 1.0f; }
#include "iq_rows.h"

static void make_rows(uint32_t t, uint8_t *p, int rows, int cols) {
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    for (int r = 0; r < rows; r++) iq_random_row(t, p + rb * (size_t)r, cols);
}

/* Seconds of one call of fn(arg): the best of 5 samples of at least 50 ms each. */
typedef void (*bench_fn)(void *arg);
static double best_time(bench_fn fn, void *arg) {
    double best = 1e9;
    for (int s = 0; s < 5; s++) {
        int reps = 0;
        double c0 = cpu(), c1;
        do {
            fn(arg);
            reps++;
        } while ((c1 = cpu()) - c0 < 0.05);
        if ((c1 - c0) / reps < best) best = (c1 - c0) / reps;
    }
    return best;
}

typedef struct {
    qmat *m;
    const qact *a;
    float *out;
    uint8_t *dst;
} job;

static void do_mul(void *p) {
    job *j = p;
    qmat_mul(j->m, j->a, j->out, j->m->rows);
}
static void do_pack(void *p) {
    job *j = p;
    qpack(j->m, j->dst);
}

static void bench_type(uint32_t t, int rows, int cols) {
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols), fb = rb * (size_t)rows, pb = qpack_bytes(t, rows, cols);
    uint8_t *W = malloc(fb), *pk = aligned_alloc(64, (pb + 63) & ~(size_t)63);
    enum { NMAX = 64 };
    float *x = malloc(sizeof(float) * NMAX * (size_t)cols), *out = malloc(sizeof(float) * NMAX * (size_t)rows);
    make_rows(t, W, rows, cols);
    for (size_t i = 0; i < (size_t)NMAX * (size_t)cols; i++) x[i] = (float)(rnd32() % 2001) / 1000.0f - 1.0f;
    qmat raw = {t, rows, cols, rb, W, 0}, packed = raw;
    job j = {&raw, NULL, out, pk};
    const double tp = best_time(do_pack, &j);
    packed.data = pk;
    packed.packed = 1;
    printf("%-8s file %3zu B/256, packed %3zu B/256 (%.2fx); qpack %.2f GB/s of file bytes (%.0f us)\n",
           ggml_type_name(t), rb * 256 / (size_t)cols, pb / (size_t)rows * 256 / (size_t)cols, (double)pb / (double)fb,
           (double)fb / tp * 1e-9, tp * 1e6);
    const int ns[] = {1, 4, 16, 64};
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        qact a = {0};
        qact_prepare(&a, t, x, ns[k], cols);
        j.a = &a;
        j.m = &packed;
        const double t1 = best_time(do_mul, &j);
        j.m = &raw;
        const double t2 = best_time(do_mul, &j);
        printf("    n=%-3d packed %8.1f us  unpacked %8.1f us  (%.2fx; %.1f vs %.1f GMAC/s)\n", ns[k], t1 * 1e6, t2 * 1e6,
               t2 / t1, (double)rows * cols * ns[k] / t1 * 1e-9, (double)rows * cols * ns[k] / t2 * 1e-9);
        qact_free(&a);
    }
    free(W);
    free(pk);
    free(x);
    free(out);
}

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 512, cols = argc > 2 ? atoi(argv[2]) : 2048;
    const uint32_t types[] = {GGML_IQ1_S, GGML_IQ1_M, GGML_IQ2_XXS, GGML_IQ2_XS, GGML_IQ2_S, GGML_IQ3_XXS, GGML_IQ3_S};
    if (rows % 8 || cols % 256) return fprintf(stderr, "rows a multiple of 8, cols of 256\n"), 1;
    printf("%d x %d, one thread\n", rows, cols);
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) bench_type(types[k], rows, cols);
    return 0;
}
