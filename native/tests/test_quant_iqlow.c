/* test_quant_iqlow.c — IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (src/quant_iqlow.c):
 * qiql_block's integers against dequant_row (f * m * q within float rounding of gguf-py's values,
 * which tests/native/test_kquants.py pins bit for bit); qmat_mul (int8 activations) equal, bit for
 * bit, to quant_iqlow.h's canonical order written out in scalar code (whatever SIMD path the build
 * took) and within the activation rounding of a double dot; identical bits for n = 1 / n = 8 and
 * 1-3 threads; EXACT (float activations) = qdot_exact of the dequantized row; the packed copy's
 * size (3 bits a value for IQ1 / IQ2, 4 for IQ3). The kernel checks
 * are iq_driver.h's; this file gives the rows and the canonical orders. */
#include "gguf.h"
#include "quant.h"
#include "quant_iqlow.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SEED 0x243f6a8885a308d3ull
#include "check.h"
#include "iq_driver.h"
#include "iq_rows.h"

static const uint32_t TYPES[] = {GGML_IQ1_S, GGML_IQ1_M, GGML_IQ2_XXS, GGML_IQ2_XS, GGML_IQ2_S, GGML_IQ3_XXS, GGML_IQ3_S};
#define NTYPES (int)(sizeof TYPES / sizeof TYPES[0])


static void test_block(uint32_t t)
{
    enum { COLS = 1024 };
    const size_t rb = ggml_row_bytes(t, COLS);
    uint8_t *W = malloc(rb);
    float *v = malloc(sizeof(float) * COLS);
    double worst = 0;
    for (int r = 0; r < 20; r++) {
        iq_random_row(t, W, COLS);
        dequant_row(t, W, v, COLS);
        for (int b = 0; b < COLS / 32; b++) {
            int8_t q[32];
            int32_t m[2];
            float f;
            qiql_block(t, W, b, q, m, &f);
            for (int j = 0; j < 32; j++) {
                const double want = (double)f * m[j / 16] * q[j], err = fabs(v[32 * b + j] - want);
                if (err / (fabs(want) + 1e-30) > worst) worst = err / (fabs(want) + 1e-30);
            }
        }
    }
    CHECK(worst <= 2e-7, "%s: dequant_row vs f * m * q: relative error %g", ggml_type_name(t), worst);
    printf("  %-7s dequant_row = f * m * q of qiql_block within %.2g relative\n", ggml_type_name(t), worst);
    free(W); free(v);
}

/* The canonical orders: qmat_mul (the packed tiles: one accumulator per output, blocks in
 * order) and qiql_dot (the row kernel: 8 lanes). */
static int iqlow_order(uint32_t t, const uint8_t *row, const qact *a, int i, int cols, float got)
{
    const int nb = cols / 32;
    const int8_t *xq = a->q + (size_t)i * cols;
    float L[8] = {0, 0, 0, 0, 0, 0, 0, 0}, acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        int8_t q[32];
        int32_t mm[2], sa = 0, sb = 0;
        float f;
        qiql_block(t, row, b, q, mm, &f);
        for (int j = 0; j < 16; j++) {
            sa += q[j] * xq[32 * b + j];
            sb += q[16 + j] * xq[32 * b + 16 + j];
        }
        const float isum = (float)(mm[0] * sa + mm[1] * sb), s = f * a->qd[(size_t)i * nb + b];
        acc = fmaf(isum, s, acc);
        L[b % 8] = fmaf(isum, s, L[b % 8]);
    }
    const float lanes = ((L[0] + L[4]) + (L[2] + L[6])) + ((L[1] + L[5]) + (L[3] + L[7]));
    float rk;
    qiql_dot(t, row, a, i, 1, nb, &rk);
    return fbits(got) == fbits(acc) && fbits(rk) == fbits(lanes);
}

/* The packed copy (the files' values transcoded to table codes): qmat_row = dequant_row bit for
 * bit; a row's output does not depend on the tile (8- or 16-row) computing it. */
static void test_packed(uint32_t t)
{
    const int rows = 24, cols = 512, n = 5;
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows), *P = malloc(qpack_bytes(t, rows, cols)), *S = malloc(rb * 16);
    float *a = malloc(sizeof(float) * cols), *b = malloc(sizeof(float) * cols);
    float *x = malloc(sizeof(float) * n * cols), *full = malloc(sizeof(float) * n * rows), *sub = malloc(sizeof(float) * n * 16),
          *one = malloc(sizeof(float) * n * 8), *pk = malloc(sizeof(float) * n * rows);
    for (int r = 0; r < rows; r++) iq_random_row(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    const qmat w = {t, rows, cols, rb, W, 0};
    qpack(&w, P);
    const qmat p = {t, rows, cols, rb, P, 1};
    int rows_same = 1;
    for (int r = 0; r < rows; r++) {
        dequant_row(t, W + r * rb, a, cols);
        qmat_row(&p, r, b);
        rows_same &= memcmp(a, b, sizeof(float) * cols) == 0;
    }
    CHECK(rows_same, "%s: qmat_row of the packed copy differs from dequant_row", ggml_type_name(t));
    memcpy(S, W + 16 * rb, 8 * rb);
    memcpy(S + 8 * rb, W, 8 * rb);
    const qmat ms = {t, 16, cols, rb, S, 0}, m8 = {t, 8, cols, rb, W, 0};
    qact q = {0};
    qact_prepare(&q, t, x, n, cols);
    qmat_mul(&w, &q, full, rows);
    qmat_mul(&p, &q, pk, rows);
    qmat_mul(&ms, &q, sub, 16);
    qmat_mul(&m8, &q, one, 8);
    int tiles = memcmp(full, pk, sizeof(float) * n * rows) == 0;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 8; j++)
            tiles &= fbits(sub[i * 16 + j]) == fbits(full[i * rows + 16 + j]) && fbits(sub[i * 16 + 8 + j]) == fbits(full[i * rows + j]) &&
                     fbits(one[i * 8 + j]) == fbits(full[i * rows + j]);
    CHECK(tiles, "%s: a row's output depends on the tile or the packing computing it", ggml_type_name(t));
    printf("  %-7s packed rows = dequant_row: %s; packed = on the fly, 8- / 16-row tiles the same bits: %s (%zu bytes per row, file %zu)\n",
           ggml_type_name(t), rows_same ? "yes" : "NO", tiles ? "yes" : "NO", qpack_bytes(t, 8, cols) / 8, rb);
    qact_free(&q);
    free(W); free(P); free(S); free(a); free(b); free(x); free(full); free(sub); free(one); free(pk);
}

/* The packed copy's size, which the expert cache allocates and counts: per row and 256 values the
 * f16 d, the 16 half scales (4 bits each: ls <= 15) and each value's code in as few bits as its signed levels need
 * (IQ1 8 g +- 1, g in -1..1, and IQ2 +-{8, 25, 43}: 6 values, 3 bits; IQ3: 8 levels, +-: 4 bits);
 * qpack writes exactly that many bytes (a canary after them stays). */
static void test_packed_size(uint32_t t)
{
    const int rows = 16, cols = 512, bits = t == GGML_IQ3_XXS || t == GGML_IQ3_S ? 4 : 3;
    const size_t want = (size_t)rows * (size_t)(cols / 256) * (2 + 16 * 4 / 8 + 256 * (size_t)bits / 8), rb = ggml_row_bytes(t, cols);
    CHECK(qpack_bytes(t, rows, cols) == want, "%s: packed %zu bytes, expected %zu", ggml_type_name(t), qpack_bytes(t, rows, cols), want);
    uint8_t *W = malloc(rb * rows), *P = malloc(want + 64);
    for (int r = 0; r < rows; r++) iq_random_row(t, W + r * rb, cols);
    memset(P, 0xa5, want + 64);
    const qmat w = {t, rows, cols, rb, W, 0};
    qpack(&w, P);
    int kept = 1;
    for (int i = 0; i < 64; i++) kept &= P[want + i] == 0xa5;
    CHECK(kept, "%s: qpack wrote past its %zu bytes", ggml_type_name(t), want);
    free(W);
    free(P);
}

int main(void)
{
    printf("IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S\n");
    for (int k = 0; k < NTYPES; k++) {
        test_block(TYPES[k]);
        iq_test_kernel(TYPES[k], 19, 512, 5, iq_random_row, iqlow_order);
        iq_test_kernel(TYPES[k], 300, 256, 3, iq_random_row, iqlow_order);    /* large enough to run in parallel */
        iq_test_determinism_exact(TYPES[k], 301, 256, iq_random_row);
        test_packed(TYPES[k]);
        test_packed_size(TYPES[k]);
    }
    if (fails) {
        printf("test_quant_iqlow: %d FAILED\n", fails);
        return 1;
    }
    printf("test_quant_iqlow: all passed\n");
    return 0;
}
