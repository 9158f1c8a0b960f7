/* bench_kq.c — speed per weight byte of each weight type (not a test): one thread, a decode-like
 * matmul (n input rows) over a matrix too big for the caches, GB/s of weight bytes per CPU-second
 * and the ratios to Q4_1 in the engine's packed layout and to Q4_K (measured in the same run). usage: bench_kq [rows=16384] [cols=2048] [n=1] [TYPES]
 * TYPES: a comma-separated list of the names below (e.g. Q2_K,Q3_K): only those (and Q4_1 packed). */
#include "quant.h"
#include "gguf.h"
#include "quant_iqlow.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double cpu(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* GB/s of weight bytes (best of 3 runs of >= 0.3 CPU-s). */
static double run(uint32_t t, int rows, int cols, int n, int packed) {
    size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    for (size_t i = 0; i < rb * rows; i++) W[i] = (uint8_t)(rand() & 0x3f);   /* small f16 exponents */
    if (t == GGML_BF16)    /* normal floats of magnitude 2^-7 .. 1 (random bytes would make denormals: microcode assists) */
        for (size_t i = 0; i < rb * rows / 2; i++) {
            const uint16_t v = (uint16_t)((rand() & 1) << 15 | (120 + rand() % 7) << 7 | (rand() & 0x7f));
            memcpy(W + 2 * i, &v, 2);
        }
    if (t == GGML_MXFP4)   /* exponent bytes of normal scales (2^-8 .. 2^-1: random bytes make subnormal products) */
        for (size_t i = 0; i < rb * rows; i += 17) W[i] = (uint8_t)(120 + rand() % 8);
    if (qiql_is(t)) {   /* a normal f16 d per super-block (random bytes give subnormal products: microcode assists) */
        const size_t sbb = ggml_row_bytes(t, 256);
        const uint16_t d = f32_to_fp16(0.001f);
        for (size_t o = 0; o < rb * rows; o += sbb) {
            if (t != GGML_IQ1_M) memcpy(W + o, &d, 2);
            else
                for (int i = 0; i < 4; i++) W[o + 49 + 2 * i] = (uint8_t)((W[o + 49 + 2 * i] & 0x0f) | ((d >> (4 * i)) & 15) << 4);
        }
    }
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
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        int reps = 0;
        double c0 = cpu(), c1;
        do {
            qmat_mul(&m, &a, out, rows);
            reps++;
        } while ((c1 = cpu()) - c0 < 0.3);
        double gbs = (double)rb * rows * reps / (c1 - c0) * 1e-9;
        if (gbs > best) best = gbs;
    }
    qact_free(&a);
    free(W); free(x); free(out); free(pk);
    return best;
}

/* name (up to its first space) is one of the comma-separated list's items */
static int in_list(const char *list, const char *name) {
    size_t n = strcspn(name, " ");
    for (const char *p = list; *p; p += strcspn(p, ",") + (p[strcspn(p, ",")] == ',')) {
        if (strcspn(p, ",") == n && !strncmp(p, name, n)) return 1;
    }
    return 0;
}

int main(int argc, char **argv) {
    int rows = argc > 1 ? atoi(argv[1]) : 16384, cols = argc > 2 ? atoi(argv[2]) : 2048;
    int n = argc > 3 ? atoi(argv[3]) : 1;
    double base = run(GGML_Q4_1, rows, cols, n, 1);
    printf("%d x %d, n=%d, one thread: GB/s of weight bytes per CPU-second (x Q4_1 packed)\n", rows, cols, n);
    printf("  %-12s %7.2f  (1.00)\n", "Q4_1 packed", base);
    struct { const char *name; uint32_t t; } ty[] = {
        {"Q4_1 rows", GGML_Q4_1}, {"Q8_0 packed", GGML_Q8_0}, {"Q2_K", GGML_Q2_K}, {"Q3_K", GGML_Q3_K},
        {"Q4_K", GGML_Q4_K}, {"Q5_K", GGML_Q5_K}, {"Q6_K", GGML_Q6_K}, {"BF16", GGML_BF16}, {"F16 packed", GGML_F16},
        {"Q5_0 packed", GGML_Q5_0}, {"Q5_1 packed", GGML_Q5_1}, {"IQ4_XS", GGML_IQ4_XS}, {"IQ4_NL", GGML_IQ4_NL},
        {"MXFP4", GGML_MXFP4}, {"IQ1_S", GGML_IQ1_S}, {"IQ1_M", GGML_IQ1_M}, {"IQ2_XXS", GGML_IQ2_XXS},
        {"IQ2_XS", GGML_IQ2_XS}, {"IQ2_S", GGML_IQ2_S}, {"IQ3_XXS", GGML_IQ3_XXS}, {"IQ3_S", GGML_IQ3_S},
    };
    const char *only = argc > 4 ? argv[4] : NULL;
    double q4k = 0;
    for (size_t i = 0; i < sizeof ty / sizeof ty[0]; i++) {
        if (only && !in_list(only, ty[i].name)) continue;
        double g = run(ty[i].t, rows, cols, n, i != 0);
        if (ty[i].t == GGML_Q4_K) q4k = g;
        if (q4k > 0) printf("  %-12s %7.2f  (%.2f)  x Q4_K %.2f\n", ty[i].name, g, g / base, g / q4k);
        else printf("  %-12s %7.2f  (%.2f)\n", ty[i].name, g, g / base);
    }
    return 0;
}
