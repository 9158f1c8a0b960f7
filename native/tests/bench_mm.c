/* bench_mm.c — matmul kernel throughput (not a test): GMAC/s of qmat_mul for the default
 * model's shapes, on packed and row-major weights, one thread unless OMP_NUM_THREADS.
 * usage: bench_mm [n=256] */
#include "quant.h"
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void run(const char *name, uint32_t t, int rows, int cols, int n, int packed) {
    size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)(rand() & 0x3f);   /* small f16 exps */
    if (t == GGML_MXFP4)    /* E8M0 scales of real weights (2^-9..2^-2): bytes 0..63 are denormal
                             * floats, which Intel cores take through a slow assist */
        for (size_t i = 0; i < rb * rows; i += 17) W[i] = (uint8_t)(118 + rand() % 8);
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows);
    for (int i = 0; i < n * cols; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    qmat m = {t, rows, cols, rb, W, 0};
    uint8_t *pk = NULL;
    if (packed && qpack_ok(t, rows, cols)) {
        pk = aligned_alloc(64, (qpack_bytes(t, rows, cols) + 63) & ~(size_t)63);
        qpack(&m, pk);
        m.data = pk;
        m.packed = 1;
    }
    qact a = {0};
    qact_prepare(&a, t, x, n, cols);
    int reps = 0;
    double c0 = cpu(), c1;
    do {
        qmat_mul(&m, &a, out, rows);
        reps++;
    } while ((c1 = cpu()) - c0 < 0.3);
    double macs = (double)rows * cols * n * reps;
    printf("%-22s %5dx%-4d n=%-4d %s: %6.1f GMAC/s per CPU-second\n", name, rows, cols, n, packed ? "packed" : "rows  ",
           macs / (c1 - c0) * 1e-9);
    qact_free(&a);
    free(W); free(x); free(out); free(pk);
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 256;
    for (int p = 1; p >= 0; p--) {
        run("attn_q/o Q4_1", GGML_Q4_1, 576, 576, n, p);
        run("shexp gate Q4_1", GGML_Q4_1, 768, 576, n, p);
        run("shexp down Q8_0", GGML_Q8_0, 576, 768, n, p);
        run("expert gate Q4_1", GGML_Q4_1, 48, 576, n / 2, p);
        run("expert down F16", GGML_F16, 576, 48, n / 2, p);
        run("head Q8_0", GGML_Q8_0, 49152 / 8, 576, n < 8 ? n : 8, p);
    }
    /* weights streamed from memory, as in a decode step: the whole head (30 MB) */
    for (int k = 1; k <= 8; k *= 2) run("head Q8_0 (DRAM)", GGML_Q8_0, 49152, 576, k, 1);
    for (int k = 1; k <= 8; k *= 2) run("Q4_1 (DRAM)", GGML_Q4_1, 49152, 576, k, 1);
    /* the K-quants at the Qwen3.6-35B-A3B widths (d_model 2048), 64 MB: a verify batch's rows */
    for (int k = 1; k <= 4; k++) run("Q4_K (DRAM)", GGML_Q4_K, 8 * 8192, 2048, k, 1);
    for (int k = 1; k <= 4; k++) run("Q6_K (DRAM)", GGML_Q6_K, 6 * 8192, 2048, k, 1);
    /* a gpt-oss expert (2880 x 2880 MXFP4) and 24 of them from DRAM: packed at load, or in the
     * file's layout as a streamed expert is (the file-layout tile up to 4 input rows) */
    for (int p = 1; p >= 0; p--)
        for (int k = 1; k <= 4; k *= 4) {
            run("MXFP4 expert", GGML_MXFP4, 2880, 2880, k, p);
            run("MXFP4 (DRAM)", GGML_MXFP4, 24 * 2880, 2880, k, p);
        }
    return 0;
}
