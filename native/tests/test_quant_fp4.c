/* test_quant_fp4.c — MXFP4 (src/quant_fp4.c, packed in quant_pack.c, tiles in quant_tile*.c):
 * dequant_row against the format decoded here from the OCP spec (e2m1 sign / exponent / mantissa
 * bits, scale 2^(e - 127), in double) for every exponent byte; qmat_row of the packed copy equal to
 * dequant_row; qmat_mul (int8 activations) equal, bit for bit, to the canonical order written out
 * in scalar code (packed or not, any n) and within the activation rounding of a double dot; a row's
 * output independent of the tile, n = 1 / n = 8 and 1-3 threads the same bits; EXACT (float
 * activations) = qdot_exact of the dequantized row. */
#include "gguf.h"
#include "quant.h"
#include "quant_fp4.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SEED 0x2545f4914f6cdd1dull
#include "check.h"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* An e2m1 code from its bits (sign 3, exponent 2-1, mantissa 0): exponent 0 is subnormal m / 2,
 * else (1 + m / 2) 2^(exp - 1). Code 8 (-0) reads as +0, as llama.cpp's and gguf-py's int8 table has it. */
static double e2m1(int c)
{
    const int s = c >> 3, ex = (c >> 1) & 3, m = c & 1;
    const double v = ex == 0 ? m * 0.5 : (1.0 + m * 0.5) * ldexp(1.0, ex - 1);
    return s && v != 0.0 ? -v : v;
}

/* Random codes; exponent bytes e0 .. e0 + spread - 1 (mod 256). */
static void make_row(uint8_t *p, int cols, int e0, int spread)
{
    for (int b = 0; b < cols / 32; b++, p += MXFP4_BYTES) {
        p[0] = (uint8_t)(e0 + (int)(rnd32() % (uint32_t)spread));
        for (int i = 1; i < MXFP4_BYTES; i++) p[i] = (uint8_t)rnd32();
    }
}

static double ref_value(const uint8_t *row, int j)
{
    const uint8_t *blk = row + (size_t)(j / 32) * MXFP4_BYTES;
    const int k = j % 32, c = k < 16 ? blk[1 + k] & 15 : blk[1 + k - 16] >> 4;
    return e2m1(c) * ldexp(1.0, blk[0] - 127);
}

/* Every exponent byte with every code: dequant_row = the spec's value (exact in float: a power
 * of two times 0 .. 6 in halves), packed copies read back the same bits. */
static void test_dequant(void)
{
    enum { COLS = 256 * 32 };
    const size_t rb = ggml_row_bytes(GGML_MXFP4, COLS);
    uint8_t *W = malloc(rb * 8);
    float *a = malloc(sizeof(float) * COLS), *b = malloc(sizeof(float) * COLS);
    for (int r = 0; r < 8; r++)
        for (int e = 0; e < 256; e++) {
            uint8_t *blk = W + r * rb + (size_t)e * MXFP4_BYTES;
            blk[0] = (uint8_t)e;
            for (int i = 0; i < 16; i++) blk[1 + i] = r == 0 ? (uint8_t)(i | (15 - i) << 4) : (uint8_t)rnd32();
        }
    int same = 1;
    for (int r = 0; r < 8; r++) {
        dequant_row(GGML_MXFP4, W + r * rb, a, COLS);
        for (int j = 0; j < COLS; j++) {
            const double v = ref_value(W + r * rb, j);
            if (fbits(a[j]) != fbits((float)v) || (isfinite(a[j]) && (double)a[j] != v)) {   /* beyond FLT_MAX: inf, numpy's float32 product */
                if (same) printf("  row %d value %d: %a, want %a\n", r, j, a[j], v);
                same = 0;
            }
        }
    }
    CHECK(same, "MXFP4: dequant_row differs from the spec's values");
    const qmat w = {GGML_MXFP4, 8, COLS, rb, W, 0};
    uint8_t *pk = malloc(qpack_bytes(GGML_MXFP4, 8, COLS));
    CHECK(qpack_bytes(GGML_MXFP4, 8, COLS) == 8 * rb, "MXFP4: packed %zu bytes, file %zu", qpack_bytes(GGML_MXFP4, 8, COLS), 8 * rb);
    qpack(&w, pk);
    const qmat p = {GGML_MXFP4, 8, COLS, rb, pk, 1};
    int rows_same = 1;
    for (int r = 0; r < 8; r++) {
        dequant_row(GGML_MXFP4, W + r * rb, a, COLS);
        qmat_row(&p, r, b);
        rows_same &= memcmp(a, b, sizeof(float) * COLS) == 0;
    }
    CHECK(rows_same, "MXFP4: qmat_row of the packed copy differs from dequant_row");
    printf("  MXFP4 dequant_row = the spec's values for all 256 exponents x 16 codes: %s; packed rows: %s\n",
           same ? "yes" : "NO", rows_same ? "yes" : "NO");
    free(W); free(a); free(b); free(pk);
}

/* qmat_mul (unpacked: the file-layout tile up to 4 input rows, packed on the fly above; and a
 * packed copy) == the canonical order: per output
 * one accumulator, blocks in order, acc = fma(isum, scale(e) * d_x, acc), isum the exact sum of
 * kv[c] x_q; and near the double dot. */
static void test_kernel(int rows, int cols, int n)
{
    const size_t rb = ggml_row_bytes(GGML_MXFP4, (uint64_t)cols);
    const int nb = cols / 32;
    uint8_t *W = malloc(rb * rows), *pk = malloc(qpack_bytes(GGML_MXFP4, rows, cols));
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows), *outp = malloc(sizeof(float) * n * rows);
    for (int r = 0; r < rows; r++) make_row(W + r * rb, cols, 118, 8);
    for (int i = 0; i < n * cols; i++) x[i] = frand() * (i % 7 == 0 ? 3.0f : 1.0f);
    const qmat m = {GGML_MXFP4, rows, cols, rb, W, 0};
    qpack(&m, pk);
    const qmat mp = {GGML_MXFP4, rows, cols, rb, pk, 1};
    qact a = {0};
    qact_prepare(&a, GGML_MXFP4, x, n, cols);
    qmat_mul(&m, &a, out, rows);
    qmat_mul(&mp, &a, outp, rows);
    int same = 1;
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        const uint8_t *row = W + r * rb;
        for (int i = 0; i < n; i++) {
            const int8_t *xq = a.q + (size_t)i * cols;
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = row + (size_t)b * MXFP4_BYTES;
                int32_t is = 0;
                for (int j = 0; j < 16; j++)
                    is += qfp4_kvalues[blk[1 + j] & 15] * xq[32 * b + j] + qfp4_kvalues[blk[1 + j] >> 4] * xq[32 * b + 16 + j];
                acc = fmaf((float)is, qfp4_scale(blk[0]) * a.qd[(size_t)i * nb + b], acc);
            }
            const float got = out[(size_t)i * rows + r];
            same &= fbits(got) == fbits(acc) && fbits(outp[(size_t)i * rows + r]) == fbits(acc);
            double ref = 0, mag = 0, qerr = 0;
            const float *xi = x + (size_t)i * cols;
            for (int b = 0; b < nb; b++) {
                double amax = 0, sw = 0;
                for (int j = 32 * b; j < 32 * b + 32; j++) {
                    const double w = ref_value(row, j);
                    ref += w * xi[j];
                    mag += fabs(w * xi[j]);
                    amax = fmax(amax, fabs(xi[j]));
                    sw += fabs(w);
                }
                qerr += amax / 127.0 * 0.5 * 1.0001 * sw;
            }
            const double tol = 1e-5 * mag + qerr + 1e-6, err = fabs(got - ref);
            if (err / tol > worst) worst = err / tol;
            CHECK(err <= tol, "MXFP4 %dx%d: out[%d][%d] = %.7g, ref %.7g", rows, cols, i, r, got, ref);
        }
    }
    CHECK(same, "MXFP4 %dx%d n=%d: qmat_mul differs from the canonical order", rows, cols, n);
    printf("  MXFP4 %4dx%-4d n=%d  canonical order bit-identical (packed and not): %s, worst err/tol = %.3f\n", rows,
           cols, n, same ? "yes" : "NO", worst);
    qact_free(&a);
    free(W); free(pk); free(x); free(out); free(outp);
}

/* Rows 0-7 and 16-23 of a 24-row matrix against the same rows in an 8-row and a 16-row matrix (8-
 * and 16-row tiles, the 512-bit one where built), n = 1 / n = 8 and 1-3 threads, and EXACT. */
static void test_determinism_exact(int rows, int cols)
{
    const int n = 8;
    const size_t rb = ggml_row_bytes(GGML_MXFP4, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *big = malloc(sizeof(float) * n * rows);
    float *first = malloc(sizeof(float) * n * rows), *one = malloc(sizeof(float) * rows);
    float *deq = malloc(sizeof(float) * cols), *sub = malloc(sizeof(float) * n * 16);
    for (int r = 0; r < rows; r++) make_row(W + r * rb, cols, 110, 24);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    const qmat m = {GGML_MXFP4, rows, cols, rb, W, 0};
    qact a = {0};
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        qact_prepare(&a, GGML_MXFP4, x, n, cols);
        qmat_mul(&m, &a, big, rows);
        for (int i = 0; i < n; i++) {
            qact_prepare(&a, GGML_MXFP4, x + (size_t)i * cols, 1, cols);
            qmat_mul(&m, &a, one, rows);
            same &= memcmp(one, big + (size_t)i * rows, sizeof(float) * rows) == 0;
        }
        if (threads == 1) memcpy(first, big, sizeof(float) * n * rows);
        else same &= memcmp(first, big, sizeof(float) * n * rows) == 0;
    }
    omp_set_num_threads(omp_get_num_procs());
    CHECK(same, "MXFP4 %dx%d: outputs differ between n=1/n=8 or thread counts", rows, cols);
    /* tiles: rows 16-23 then 0-7 as a 16-row matrix; rows 0-7 alone */
    uint8_t *S = malloc(rb * 16);
    memcpy(S, W + 16 * rb, 8 * rb);
    memcpy(S + 8 * rb, W, 8 * rb);
    const qmat ms = {GGML_MXFP4, 16, cols, rb, S, 0}, m8 = {GGML_MXFP4, 8, cols, rb, W, 0};
    qact_prepare(&a, GGML_MXFP4, x, 5, cols);
    qmat_mul(&m, &a, big, rows);
    qmat_mul(&ms, &a, sub, 16);
    qmat_mul(&m8, &a, first, 8);
    int tiles = 1;
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 8; j++)
            tiles &= fbits(sub[i * 16 + j]) == fbits(big[i * rows + 16 + j]) && fbits(sub[i * 16 + 8 + j]) == fbits(big[i * rows + j]) &&
                     fbits(first[i * 8 + j]) == fbits(big[i * rows + j]);
    CHECK(tiles, "MXFP4: a row's output depends on the tile computing it");
    qact e = {0};
    e.exact = 1;
    qact_prepare(&e, GGML_MXFP4, x, n, cols);
    qmat_mul(&m, &e, big, rows);
    int exact = 1;
    for (int r = 0; r < rows; r++) {
        dequant_row(GGML_MXFP4, W + r * rb, deq, cols);
        for (int i = 0; i < n; i++)
            exact &= fbits(big[(size_t)i * rows + r]) == fbits(qdot_exact(deq, x + (size_t)i * cols, cols));
    }
    CHECK(exact, "MXFP4 %dx%d: EXACT differs from qdot_exact of dequant_row", rows, cols);
    printf("  MXFP4 %4dx%-4d n=1/n=8, 1-3 threads the same bits: %s; tiles: %s; EXACT = qdot_exact(dequant_row): %s\n",
           rows, cols, same ? "yes" : "NO", tiles ? "yes" : "NO", exact ? "yes" : "NO");
    qact_free(&a);
    qact_free(&e);
    free(W); free(S); free(x); free(big); free(first); free(one); free(deq); free(sub);
}

int main(void)
{
    printf("MXFP4\n");
    test_dequant();
    test_kernel(19, 512, 5);
    test_kernel(300, 256, 3);      /* large enough to run in parallel */
    test_kernel(37, 96, 8);        /* 3 blocks, 8 input rows: the 512-bit tile's widest */
    test_kernel(7, 2880, 1);       /* gpt-oss's d_model: 90 blocks, a partial group */
    test_kernel(37, 96, 4);        /* the file-layout tile's widest, two groups a tile and a partial one */
    test_kernel(45, 2880, 2);
    test_determinism_exact(301, 256);
    test_determinism_exact(24, 2880);
    if (fails) {
        printf("test_quant_fp4: %d FAILED\n", fails);
        return 1;
    }
    printf("test_quant_fp4: all passed\n");
    return 0;
}
