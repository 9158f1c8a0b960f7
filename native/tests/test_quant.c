/* test_quant.c — fp16 conversion, block decoding and qmat_mul against a double-precision
 * reference, plus bit-identity across batch sizes and thread counts. */
#include "gguf.h"
#include "quant.h"
#include "quant_k.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* portable conversions, exported by quant.c for this test */
float quant_sw_fp16_to_f32(uint16_t h);
uint16_t quant_sw_f32_to_fp16(float f);

#define TEST_SEED 0x9e3779b97f4a7c15ull
#include "check.h"
#include "rows.h"

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static float bitsf(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* ---------------------------------------------------------------------------------- */

static void test_fp16(void)
{
    /* every half converts to float and back unchanged (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = fp16_to_f32((uint16_t)h), g = quant_sw_fp16_to_f32((uint16_t)h);
        int nan = ((h >> 10) & 31) == 31 && (h & 0x3ff);
        if (nan) {
            CHECK(f != f && g != g, "half 0x%04x should be NaN", h);
            CHECK(f32_to_fp16(f) >> 10 == (h | 0x200) >> 10 && (f32_to_fp16(f) & 0x3ff),
                  "NaN 0x%04x round trip", h);
            continue;
        }
        CHECK(fbits(f) == fbits(g), "half 0x%04x: hw %g sw %g", h, f, g);
        CHECK(f32_to_fp16(f) == h, "half 0x%04x -> %g -> 0x%04x", h, f, f32_to_fp16(f));
        CHECK(quant_sw_f32_to_fp16(f) == h, "sw half 0x%04x round trip", h);
    }
    struct { float f; uint16_t h; } cases[] = {
        {1.0f, 0x3c00}, {-2.0f, 0xc000}, {65504.0f, 0x7bff}, {65519.996f, 0x7bff},
        {65520.0f, 0x7c00}, {1e10f, 0x7c00}, {-1e10f, 0xfc00}, {0x1p-24f, 0x0001},
        {0x1p-25f, 0x0000}, {0x1.8p-24f, 0x0002}, {0x1.000002p-25f, 0x0001},
        {0x1p-14f, 0x0400}, {0x1.ff8p-15f, 0x03ff}, {0x1.ffcp-15f, 0x0400}, {-0.0f, 0x8000},
        {1.0f + 0x1p-11f, 0x3c00}, {1.0f + 0x1.8p-11f, 0x3c01}, {1.0f + 0x1.8p-10f, 0x3c02}, {1e-30f, 0x0000},
        {INFINITY, 0x7c00}, {-INFINITY, 0xfc00},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        CHECK(f32_to_fp16(cases[i].f) == cases[i].h, "f32_to_fp16(%a) = 0x%04x, want 0x%04x",
              cases[i].f, f32_to_fp16(cases[i].f), cases[i].h);
        CHECK(quant_sw_f32_to_fp16(cases[i].f) == cases[i].h, "sw f32_to_fp16(%a)", cases[i].f);
    }
    uint16_t hn = f32_to_fp16(NAN);
    CHECK((hn & 0x7c00) == 0x7c00 && (hn & 0x3ff), "NaN -> 0x%04x", hn);
    /* random bit patterns: portable path agrees with whatever fp16 path is compiled */
    for (int i = 0; i < 2000000; i++) {
        float f = bitsf(rnd32() << 1 | (rnd32() & 1));
        if (f != f) continue;
        CHECK(quant_sw_f32_to_fp16(f) == f32_to_fp16(f), "f32_to_fp16(%a): sw 0x%04x vs 0x%04x",
              f, quant_sw_f32_to_fp16(f), f32_to_fp16(f));
    }
}

/* ---- building weights in each format, and decoding them independently in double ---- */

static double get16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_f32(h); }

static void ref_decode(uint32_t t, const uint8_t *p, double *out, int cols)
{
    for (int j = 0; j < cols; j++) {
        if (t == GGML_F32) { float f; memcpy(&f, p + 4 * j, 4); out[j] = f; continue; }
        if (t == GGML_F16) { out[j] = get16(p + 2 * j); continue; }
        int b = j / 32, k = j % 32;
        if (t == GGML_Q8_0) {
            const uint8_t *blk = p + 34 * b;
            out[j] = get16(blk) * (int8_t)blk[2 + k];
        } else if (t == GGML_Q5_0 || t == GGML_Q5_1) {   /* bit k of the qh bytes is code k's bit 4 */
            const int h = t == GGML_Q5_1 ? 4 : 2;
            const uint8_t *blk = p + (h + 20) * b, *qs = blk + h + 4;
            int q = (k < 16 ? (qs[k] & 15) : (qs[k - 16] >> 4)) | ((blk[h + k / 8] >> (k % 8)) & 1) << 4;
            out[j] = t == GGML_Q5_0 ? get16(blk) * (q - 16) : get16(blk) * q + get16(blk + 2);
        } else {
            const uint8_t *blk = p + (t == GGML_Q4_0 ? 18 : 20) * b;
            const uint8_t *qs = blk + (t == GGML_Q4_0 ? 2 : 4);
            int nib = k < 16 ? (qs[k] & 15) : (qs[k - 16] >> 4);
            out[j] = t == GGML_Q4_0 ? get16(blk) * (nib - 8) : get16(blk) * nib + get16(blk + 2);
        }
    }
}

static const char *tname(uint32_t t) { return ggml_type_name(t); }

/* qmat_mul vs a double reference; tolerance: float rounding (1e-5 relative to sum|w x|)
 * plus, for int8 activations, the activation rounding bound sum_b d_b/2 * sum_j |w_j|. */
static void test_type(uint32_t t, int rows, int cols, int n)
{
    size_t rb = ggml_row_bytes(t, cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols);
    float *out = malloc(sizeof(float) * n * (rows + 3));
    double *wd = malloc(sizeof(double) * cols);
    float *deq = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand() * (i % 7 == 0 ? 3.0f : 1.0f);
    qmat m = {t, rows, cols, rb, W, 0};
    int stride = rows + 3;
    qmat_mul_f32(&m, x, n, out, stride);
    int quant = t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q4_1 || t == GGML_Q5_0 || t == GGML_Q5_1;
    const int mstep = t == GGML_Q4_1 ? 20 : t == GGML_Q5_1 ? 24 : 0;   /* block bytes with a min m */
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        ref_decode(t, W + r * rb, wd, cols);
        dequant_row(t, W + r * rb, deq, cols);
        for (int j = 0; j < cols; j++)
            CHECK(fabs(deq[j] - wd[j]) <= 1e-6 * fabs(wd[j]), "%s dequant_row r%d j%d: %g vs %g",
                  tname(t), r, j, deq[j], wd[j]);
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * cols;
            double ref = 0, mag = 0, qerr = 0;
            for (int j = 0; j < cols; j++) {
                ref += wd[j] * xi[j];
                mag += fabs(wd[j] * xi[j]);
            }
            if (quant)
                for (int b = 0; b < cols / 32; b++) {
                    double amax = 0, sw = 0;
                    for (int j = 32 * b; j < 32 * b + 32; j++) {
                        amax = fmax(amax, fabs(xi[j]));
                        sw += fabs(wd[j] - (mstep ? get16(W + r * rb + mstep * b + 2) : 0));
                    }
                    qerr += amax / 127.0 * 0.5 * 1.0001 * sw;
                }
            double tol = 1e-5 * mag + qerr + 1e-6;
            double err = fabs(out[(size_t)i * stride + r] - ref);
            if (err / tol > worst) worst = err / tol;
            CHECK(err <= tol, "%s %dx%d n=%d: out[%d][%d] = %.7g, ref %.7g, tol %.3g", tname(t),
                  rows, cols, n, i, r, out[(size_t)i * stride + r], ref, tol);
        }
    }
    printf("  %-5s %4dx%-4d n=%d  worst err/tol = %.3f\n", tname(t), rows, cols, n, worst);
    free(W); free(x); free(out); free(wd); free(deq);
}

/* n=1 vs n=8 and 1/2/3 threads must give bit-identical outputs. */
static void test_determinism(uint32_t t, int rows, int cols)
{
    const int n = 8;
    size_t rb = ggml_row_bytes(t, cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols);
    float *big = malloc(sizeof(float) * n * rows), *one = malloc(sizeof(float) * rows);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    qmat m = {t, rows, cols, rb, W, 0};
    qact a = {0};
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        qact_prepare(&a, t, x, n, cols);
        qmat_mul(&m, &a, big, rows);
        for (int i = 0; i < n; i++) {
            qact_prepare(&a, t, x + (size_t)i * cols, 1, cols);   /* reuse smaller */
            qmat_mul(&m, &a, one, rows);
            if (memcmp(one, big + (size_t)i * rows, sizeof(float) * rows) != 0) same = 0;
        }
        static float *first;
        if (threads == 1) {
            first = malloc(sizeof(float) * n * rows);
            memcpy(first, big, sizeof(float) * n * rows);
        } else if (memcmp(first, big, sizeof(float) * n * rows) != 0) {
            same = 0;
        }
        if (threads == 3) { free(first); first = NULL; }
    }
    omp_set_num_threads(omp_get_num_procs());
    CHECK(same, "%s %dx%d: outputs differ between n=1/n=8 or thread counts", tname(t), rows,
          cols);
    printf("  %-5s %4dx%-4d bit-identical for n=1/n=8, 1-3 threads: %s\n", tname(t), rows, cols,
           same ? "yes" : "NO");
    qact_free(&a);
    free(W); free(x); free(big); free(one);
}

/* A row's outputs do not depend on the tile that computes it: 16-row tiles (two groups; the
 * 512-bit kernels where built) and 8-row tiles (one group), batches split 4 + 1 or taken at
 * once. Rows 0-7 and 16-23 of a 24-row matrix against the same rows in an 8-row matrix and
 * first in a 16-row one. */
static void test_tile_independence(uint32_t t)
{
    const int rows = 24, cols = 256, n = 5;
    const size_t rb = ggml_row_bytes(t, cols);
    uint8_t *W = malloc(rb * rows), *S = malloc(rb * 16);
    float *x = malloc(sizeof(float) * n * cols), *full = malloc(sizeof(float) * n * rows),
          *sub = malloc(sizeof(float) * n * 16), *one = malloc(sizeof(float) * n * 8);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    memcpy(S, W + 16 * rb, 8 * rb);            /* rows 16-23, then rows 0-7 */
    memcpy(S + 8 * rb, W, 8 * rb);
    qmat mf = {t, rows, cols, rb, W, 0}, ms = {t, 16, cols, rb, S, 0}, m1 = {t, 8, cols, rb, W, 0};
    qact a = {0};
    qact_prepare(&a, t, x, n, cols);
    qmat_mul(&mf, &a, full, rows);
    qmat_mul(&ms, &a, sub, 16);
    qmat_mul(&m1, &a, one, 8);
    int same = 1;
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 8; j++) {
            same &= sub[i * 16 + j] == full[i * rows + 16 + j] && sub[i * 16 + 8 + j] == full[i * rows + j];
            same &= one[i * 8 + j] == full[i * rows + j];
        }
    CHECK(same, "%s: a row's output depends on the tile computing it", tname(t));
    printf("  %-5s 8-row and 16-row tiles give the same bits: %s\n", tname(t), same ? "yes" : "NO");
    qact_free(&a);
    free(W); free(S); free(x); free(full); free(sub); free(one);
}

/* qact_prepare's int8 blocks against the definition: d = max|x| / 127, q = x / d rounded half
 * away from zero, clamped to +-127; qi = sum q; qh = sum of q[0..15]; qs = the block's float sum
 * (any order: 1e-6). */
static void test_act_quant(void)
{
    enum { N = 3, COLS = 96 };
    float x[N * COLS];
    for (int i = 0; i < N * COLS; i++) x[i] = frand() * (i % 7 == 0 ? 40.0f : 1.0f);
    for (int j = 0; j < 32; j++) x[COLS + j] = 0.0f;                  /* an all-zero block */
    x[2 * COLS + 5] = -x[2 * COLS + 6] * 3.0f;                         /* a negative maximum */
    qact a = {0};
    qact_prepare(&a, GGML_Q8_0, x, N, COLS);
    for (int b = 0; b < N * COLS / 32; b++) {
        const float *xb = x + 32 * b;
        float amax = 0.0f;
        double sum = 0.0;
        for (int j = 0; j < 32; j++) {
            amax = fabsf(xb[j]) > amax ? fabsf(xb[j]) : amax;
            sum += xb[j];
        }
        float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
        int32_t isum = 0, hsum = 0;
        for (int j = 0; j < 32; j++) {
            if (j == 16) hsum = isum;
            float v = xb[j] * id;
            int q = (int)(v >= 0.0f ? v + 0.5f : v - 0.5f);
            q = q > 127 ? 127 : q < -127 ? -127 : q;
            CHECK(a.q[32 * b + j] == q, "block %d value %d: q %d, want %d", b, j, a.q[32 * b + j], q);
            isum += q;
        }
        CHECK(fbits(a.qd[b]) == fbits(d), "block %d: d %g, want %g", b, a.qd[b], d);
        CHECK(a.qi[b] == isum, "block %d: integer sum %d, want %d", b, a.qi[b], isum);
        CHECK(a.qh[b] == hsum, "block %d: half sum %d, want %d", b, a.qh[b], hsum);
        CHECK(fabs(a.qs[b] - sum) <= 1e-6 * (1.0 + fabs(sum)) * 32, "block %d: sum %g, want %g", b, a.qs[b], sum);
    }
    qact_free(&a);
}

/* qmat_row on a packed matrix == dequant_row of the original row, bit for bit. */
static void test_packed_rows(uint32_t t, int rows, int cols)
{
    const size_t rb = ggml_row_bytes(t, cols);
    uint8_t *W = malloc(rb * rows), *Pk = malloc(qpack_bytes(t, rows, cols));
    float *a = malloc(sizeof(float) * cols), *b = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols);
    qmat w = {t, rows, cols, rb, W, 0};
    qpack(&w, Pk);
    qmat pk = {t, rows, cols, rb, Pk, 1};
    int same = 1;
    for (int r = 0; r < rows; r++) {
        dequant_row(t, W + r * rb, a, cols);
        qmat_row(&pk, r, b);
        same &= memcmp(a, b, sizeof(float) * cols) == 0;
        qmat_row(&w, r, b);
        same &= memcmp(a, b, sizeof(float) * cols) == 0;
    }
    CHECK(same, "%s %dx%d: qmat_row differs from dequant_row", tname(t), rows, cols);
    /* Q2_K, Q3_K, Q6_K are packed at exactly the file's size (rows rounded up to 8) */
    if (t == GGML_Q2_K || t == GGML_Q3_K || t == GGML_Q6_K)
        CHECK(qpack_bytes(t, rows, cols) == rb * (size_t)((rows + 7) / 8 * 8), "%s %dx%d: packed %zu bytes, file %zu",
              tname(t), rows, cols, qpack_bytes(t, rows, cols), rb * rows);
    free(W); free(Pk); free(a); free(b);
}

/* Short-row F16 matrices are packed transposed (quant.c tp_shape): packed and unpacked products are the same bits, for any n; the silu pairing equals silu of the
 * two separate products; qmat_row reads the transposed layout. */
static void test_transposed_f16(int rows, int cols, int n)
{
    const size_t rb = ggml_row_bytes(GGML_F16, cols), bytes = rb * rows;
    uint8_t *W = malloc(bytes), *W2 = malloc(bytes), *P = malloc(bytes);
    float *x = malloc(sizeof(float) * n * cols), *o[5], *row = malloc(sizeof(float) * cols),
          *deq = malloc(sizeof(float) * cols);
    for (int k = 0; k < 5; k++) o[k] = malloc(sizeof(float) * n * rows);
    for (int r = 0; r < rows; r++) {
        make_row(GGML_F16, W + r * rb, cols);
        make_row(GGML_F16, W2 + r * rb, cols);
    }
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    qmat u = {GGML_F16, rows, cols, rb, W, 0}, u2 = {GGML_F16, rows, cols, rb, W2, 0};
    qpack(&u, P);
    qmat p = {GGML_F16, rows, cols, rb, P, 1};
    qact a = {0};
    qact_prepare(&a, GGML_F16, x, n, cols);
    qmat_mul(&u, &a, o[0], rows);
    qmat_mul(&p, &a, o[1], rows);
    CHECK(memcmp(o[0], o[1], sizeof(float) * n * rows) == 0, "F16 %dx%d n=%d: packed != unpacked", rows, cols, n);
    qmat_mul(&u2, &a, o[2], rows);
    mm_job j = {&u, &u2, &a, o[3], rows};
    qmat_mul_multi(&j, 1);
    int silu = 1;
    for (int q = 0; q < n * rows; q++) silu &= o[3][q] == qsilu_mul(o[0][q], o[2][q]);
    CHECK(silu, "F16 %dx%d: silu pairing differs from the separate products", rows, cols);
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        dequant_row(GGML_F16, W + r * rb, deq, cols);
        qmat_row(&p, r, row);
        CHECK(memcmp(deq, row, sizeof(float) * cols) == 0, "qmat_row of transposed row %d", r);
        for (int i = 0; i < n; i++) {
            double ref = 0, mag = 0;
            for (int k = 0; k < cols; k++) {
                ref += (double)deq[k] * x[i * cols + k];
                mag += fabs((double)deq[k] * x[i * cols + k]);
            }
            double err = fabs(o[1][(size_t)i * rows + r] - ref) / (1e-6 * mag + 1e-9);
            worst = err > worst ? err : worst;
        }
    }
    CHECK(worst <= 1.0, "F16 transposed %dx%d: error %.3g x tolerance", rows, cols, worst);
    for (int i = 0; i < n; i++) {               /* one row at a time: the same bits */
        qact_prepare(&a, GGML_F16, x + (size_t)i * cols, 1, cols);
        qmat_mul(&p, &a, o[4], rows);
        CHECK(memcmp(o[4], o[1] + (size_t)i * rows, sizeof(float) * rows) == 0, "n=1 vs n=%d, row %d", n, i);
    }
    printf("  F16   %4dx%-4d n=%d transposed: packed == unpacked == n=1, worst err/tol %.3f\n", rows, cols, n, worst);
    qact_free(&a);
    for (int k = 0; k < 5; k++) free(o[k]);
    free(W); free(W2); free(P); free(x); free(row); free(deq);
}

/* A gate/up job whose matrices have different types (a file made with llama-quantize
 * --tensor-type): the pair's outputs are silu(w x) * (w2 x) of the two separate products, bit for
 * bit, packed or not, through a view of rows by index (the MoE's gathered rows) and in EXACT mode. */
static void test_mixed_pair(uint32_t t1, uint32_t t2, int rows, int cols, int n)
{
    const size_t rb1 = ggml_row_bytes(t1, cols), rb2 = ggml_row_bytes(t2, cols);
    uint8_t *W1 = malloc(rb1 * rows), *W2 = malloc(rb2 * rows);
    uint8_t *P1 = malloc(qpack_bytes(t1, rows, cols) + 64), *P2 = malloc(qpack_bytes(t2, rows, cols) + 64);
    float *x = malloc(sizeof(float) * 2 * n * cols), *a = malloc(sizeof(float) * n * rows),
          *b = malloc(sizeof(float) * n * rows), *o = malloc(sizeof(float) * n * rows);
    int *idx = malloc(sizeof(int) * n);
    for (int r = 0; r < rows; r++) {
        make_row(t1, W1 + r * rb1, cols);
        make_row(t2, W2 + r * rb2, cols);
    }
    for (int i = 0; i < 2 * n * cols; i++) x[i] = frand();
    for (int i = 0; i < n; i++) idx[i] = 2 * n - 1 - 2 * i;      /* every other row, backwards */
    qmat u1 = {t1, rows, cols, rb1, W1, 0}, u2 = {t2, rows, cols, rb2, W2, 0}, p1 = u1, p2 = u2;
    if (qpack_ok(t1, rows, cols)) { qpack(&u1, P1); p1.data = P1; p1.packed = 1; }
    if (qpack_ok(t2, rows, cols)) { qpack(&u2, P2); p2.data = P2; p2.packed = 1; }
    for (int mode = 0; mode < 4; mode++) {      /* unpacked, packed, packed + view, exact */
        const int view = mode == 2 && qpack_ok(t1, rows, cols) && qpack_ok(t2, rows, cols);
        if (mode == 2 && !view) continue;
        qact act = {0};
        act.exact = mode == 3;
        float *xs = x;
        if (!view) {                            /* the view's rows, gathered */
            xs = malloc(sizeof(float) * n * cols);
            for (int i = 0; i < n; i++) memcpy(xs + (size_t)i * cols, x + (size_t)(mode == 2 ? idx[i] : i) * cols,
                                               sizeof(float) * cols);
        }
        qact_prepare(&act, t1, xs, view ? 2 * n : n, cols);
        if (view) { act.n = n; act.idx = idx; }
        const qmat *w1 = mode == 0 ? &u1 : &p1, *w2 = mode == 0 ? &u2 : &p2;
        if (view) {                             /* the separate products on the gathered rows */
            qact g = {0};
            float *gx = malloc(sizeof(float) * n * cols);
            for (int i = 0; i < n; i++) memcpy(gx + (size_t)i * cols, x + (size_t)idx[i] * cols, sizeof(float) * cols);
            qact_prepare(&g, t1, gx, n, cols);
            qmat_mul(w1, &g, a, rows);
            qmat_mul(w2, &g, b, rows);
            qact_free(&g);
            free(gx);
        } else {
            qmat_mul(w1, &act, a, rows);
            qmat_mul(w2, &act, b, rows);
        }
        mm_job j = {w1, w2, &act, o, rows};
        qmat_mul_multi(&j, 1);
        int same = 1;
        for (int q = 0; q < n * rows; q++) same &= fbits(o[q]) == fbits(qsilu_mul(a[q], b[q]));
        CHECK(same, "%s gate + %s up %dx%d n=%d mode %d: the pair differs from silu(a) * b of the separate products",
              tname(t1), tname(t2), rows, cols, n, mode);
        int nonzero = 0;
        for (int q = 0; q < n * rows; q++) nonzero |= o[q] != 0.0f;
        CHECK(nonzero, "%s gate + %s up: all outputs zero (the job was refused)", tname(t1), tname(t2));
        qact_free(&act);
        if (!view) free(xs);
    }
    printf("  %-5s gate + %-5s up %4dx%-4d n=%d: silu(a) * b of the separate products\n", tname(t1), tname(t2), rows,
           cols, n);
    free(W1); free(W2); free(P1); free(P2); free(x); free(a); free(b); free(o); free(idx);
}

/* K-quants and BF16: qmat_mul equals, bit for bit, quant_k.h's canonical order rendered here in
 * plain scalar code from the unpacked integers (whatever SIMD path the build took), and is within
 * int8-activation rounding of a double dot with the dequantized row. */
static void test_kquant(uint32_t t, int rows, int cols, int n)
{
    size_t rb = ggml_row_bytes(t, cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows);
    float *deq = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand() * (i % 7 == 0 ? 3.0f : 1.0f);
    qmat m = {t, rows, cols, rb, W, 0};
    qact a = {0};
    qact_prepare(&a, t, x, n, cols);
    qmat_mul(&m, &a, out, rows);
    const int nb = cols / 32;
    int same = 1;
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        dequant_row(t, W + r * rb, deq, cols);
        for (int i = 0; i < n; i++) {
            float want;
            if (t == GGML_BF16) {
                want = qdot_exact(deq, x + (size_t)i * cols, cols);
            } else {
                const int8_t *xq = a.q + (size_t)i * cols;
                const float *xd = a.qd + (size_t)i * nb, *xs = a.qs + (size_t)i * nb;
                float L[8] = {0, 0, 0, 0, 0, 0, 0, 0};
                for (int s = 0; s < cols / 256; s++) {
                    int8_t q[256];
                    int sc[16], mm[16];
                    float d, dmin;
                    qk_unpack(t, W + r * rb + (rb / (cols / 256)) * s, q, sc, mm, &d, &dmin);
                    for (int b = 0; b < 8; b++) {
                        int32_t lo = 0, hi = 0, xl = 0, xh = 0;
                        const int8_t *xb = xq + 256 * s + 32 * b;
                        for (int j = 0; j < 16; j++) { lo += q[32 * b + j] * xb[j]; xl += xb[j]; }
                        for (int j = 16; j < 32; j++) { hi += q[32 * b + j] * xb[j]; xh += xb[j]; }
                        const int k = 8 * s + b;
                        if (t == GGML_Q4_K || t == GGML_Q5_K) {   /* packed like Q4_1: one accumulator, in L[0] */
                            const float dl = d * (float)sc[b], ml = -(dmin * (float)mm[b]);
                            L[0] = fmaf((float)(lo + hi), dl * xd[k], L[0]);
                            L[0] = fmaf(ml, xs[k], L[0]);
                        } else if (t == GGML_Q5_K) {
                            const float dl = d * (float)sc[b], ml = dmin * (float)mm[b];
                            L[b] = fmaf((float)(lo + hi), dl * xd[k], L[b]);
                            L[b] = fmaf(-ml, xs[k], L[b]);
                        } else if (t == GGML_Q6_K || t == GGML_Q3_K || t == GGML_Q2_K) {
                            L[0] = fmaf((float)(sc[2 * b] * lo + sc[2 * b + 1] * hi), d * xd[k], L[0]);
                            if (t == GGML_Q2_K)
                                L[0] = fmaf(-(float)(mm[2 * b] * xl + mm[2 * b + 1] * xh), dmin * xd[k], L[0]);
                        } else {
                            L[b] = fmaf((float)(sc[2 * b] * lo + sc[2 * b + 1] * hi), d * xd[k], L[b]);
                            if (t == GGML_Q2_K)
                                L[b] = fmaf(-(float)(mm[2 * b] * xl + mm[2 * b + 1] * xh), dmin * xd[k], L[b]);
                        }
                    }
                }
                want = t != GGML_BF16 ? L[0] : ((L[0] + L[4]) + (L[2] + L[6])) + ((L[1] + L[5]) + (L[3] + L[7]));
            }
            const float got = out[(size_t)i * rows + r];
            if (fbits(got) != fbits(want)) same = 0;
            double ref = 0, mag = 0, qerr = 0;
            const float *xi = x + (size_t)i * cols;
            for (int j = 0; j < cols; j++) {
                ref += (double)deq[j] * xi[j];
                mag += fabs((double)deq[j] * xi[j]);
            }
            if (t != GGML_BF16)
                for (int b = 0; b < nb; b++) {
                    double amax = 0, sw = 0;
                    for (int j = 32 * b; j < 32 * b + 32; j++) {
                        amax = fmax(amax, fabs(xi[j]));
                        sw += fabs(deq[j]) + 0.25;    /* the min term's share, generously */
                    }
                    qerr += amax / 127.0 * 0.5 * 1.0001 * sw * 4;
                }
            double tol = 1e-5 * mag + qerr + 1e-6, err = fabs(got - ref);
            if (err / tol > worst) worst = err / tol;
            CHECK(err <= tol, "%s %dx%d: out[%d][%d] = %.7g, ref %.7g", tname(t), rows, cols, i, r, got, ref);
        }
    }
    CHECK(same, "%s %dx%d n=%d: qmat_mul differs from the canonical order", tname(t), rows, cols, n);
    printf("  %-5s %4dx%-4d n=%d  canonical order bit-identical: %s, worst err/tol = %.3f\n", tname(t), rows, cols, n,
           same ? "yes" : "NO", worst);
    qact_free(&a);
    free(W); free(x); free(out); free(deq);
}

/* Q5_0 / Q5_1, packed like Q4_1 (quant_impl.h): one accumulator per output, blocks in order,
 * acc = fma(isum, d * d_x, acc) (isum = exact sum of q x_q, Q5_0's q = code - 16), Q5_1 then
 * acc = fma(m, s_x, acc): qmat_mul gives these bits for any n. */
static void test_q5_canonical(uint32_t t, int rows, int cols, int n)
{
    const size_t rb = ggml_row_bytes(t, cols);
    const int nb = cols / 32, t1 = t == GGML_Q5_1;
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    qmat m = {t, rows, cols, rb, W, 0};
    qact a = {0};
    qact_prepare(&a, t, x, n, cols);
    qmat_mul(&m, &a, out, rows);
    int same = 1;
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < n; i++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                const uint8_t *blk = W + r * rb + (size_t)b * (t1 ? 24 : 22), *qs = blk + (t1 ? 8 : 6);
                uint32_t qh;
                memcpy(&qh, blk + (t1 ? 4 : 2), 4);
                int32_t is = 0;
                for (int j = 0; j < 32; j++) {
                    const int c = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | ((qh >> j) & 1) << 4;
                    is += (t1 ? c : c - 16) * a.q[(size_t)i * cols + 32 * b + j];
                }
                acc = fmaf((float)is, (float)get16(blk) * a.qd[(size_t)i * nb + b], acc);
                if (t1) acc = fmaf((float)get16(blk + 2), a.qs[(size_t)i * nb + b], acc);
            }
            same &= fbits(acc) == fbits(out[(size_t)i * rows + r]);
        }
    CHECK(same, "%s %dx%d n=%d: qmat_mul differs from the canonical order", tname(t), rows, cols, n);
    printf("  %-5s %4dx%-4d n=%d  canonical order bit-identical: %s\n", tname(t), rows, cols, n, same ? "yes" : "NO");
    qact_free(&a);
    free(W); free(x); free(out);
}

int main(void)
{
    printf("short-row F16 (transposed packing)\n");
    test_transposed_f16(576, 48, 5);
    test_transposed_f16(64, 64, 2);
    test_transposed_f16(32, 13, 1);
    printf("rows of packed matrices\n");
    test_packed_rows(GGML_Q8_0, 21, 96);
    test_packed_rows(GGML_Q4_1, 21, 96);
    test_packed_rows(GGML_F16, 21, 40);
    test_packed_rows(GGML_Q4_K, 21, 512);
    test_packed_rows(GGML_Q6_K, 21, 512);
    test_packed_rows(GGML_Q5_K, 21, 512);
    test_packed_rows(GGML_Q3_K, 21, 512);
    test_packed_rows(GGML_Q2_K, 21, 512);
    test_packed_rows(GGML_BF16, 21, 42);
    test_packed_rows(GGML_Q5_0, 21, 96);
    test_packed_rows(GGML_Q5_1, 21, 352);
    test_packed_rows(GGML_BF16, 21, 512);
    printf("activation quantization\n");
    test_act_quant();
    printf("fp16 conversions\n");
    test_fp16();
    printf("qmat_mul vs double reference\n");
    uint32_t types[] = {GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1};
    for (int k = 0; k < 7; k++) {
        test_type(types[k], 37, 576, 1);
        test_type(types[k], 37, 96, 5);
        test_type(types[k], 300, 256, 3);     /* large enough to run in parallel */
        test_type(types[k], 5, 32, 2);
    }
    test_type(GGML_F32, 9, 45, 3);            /* float rows of any length */
    test_type(GGML_F16, 9, 13, 2);
    test_type(GGML_F32, 3, 1, 1);
    printf("determinism\n");
    for (int k = 0; k < 7; k++) test_determinism(types[k], 301, 256);
    test_tile_independence(GGML_Q5_0);
    test_tile_independence(GGML_Q5_1);
    printf("Q5_0 / Q5_1 packed: the canonical order\n");
    test_q5_canonical(GGML_Q5_0, 19, 352, 5);
    test_q5_canonical(GGML_Q5_1, 19, 352, 5);
    test_q5_canonical(GGML_Q5_0, 300, 256, 8);
    test_q5_canonical(GGML_Q5_1, 37, 96, 3);
    test_tile_independence(GGML_Q4_1);
    test_tile_independence(GGML_Q8_0);
    test_tile_independence(GGML_F16);
    test_tile_independence(GGML_Q4_K);
    test_tile_independence(GGML_Q6_K);
    test_tile_independence(GGML_Q5_K);
    test_tile_independence(GGML_Q3_K);
    test_tile_independence(GGML_Q2_K);
    test_tile_independence(GGML_BF16);
    printf("gate / up of different types\n");
    const uint32_t pairs[][2] = {{GGML_Q4_K, GGML_Q3_K}, {GGML_Q2_K, GGML_Q4_K}, {GGML_Q4_K, GGML_F32},
                                 {GGML_F16, GGML_Q6_K}, {GGML_Q8_0, GGML_Q4_1}, {GGML_Q4_0, GGML_Q5_K},
                                 {GGML_BF16, GGML_Q5_1}, {GGML_Q5_0, GGML_Q8_0}};
    for (int k = 0; k < (int)(sizeof pairs / sizeof pairs[0]); k++) {
        test_mixed_pair(pairs[k][0], pairs[k][1], 48, 512, 3);
        test_mixed_pair(pairs[k][0], pairs[k][1], 300, 256, 8);    /* parallel chunks */
    }
    printf("K-quants and BF16\n");
    uint32_t ktypes[] = {GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_BF16};
    for (int k = 0; k < 6; k++) {
        test_kquant(ktypes[k], 19, 512, 5);
        test_kquant(ktypes[k], 300, 256, 3);
        test_determinism(ktypes[k], 301, 256);
    }
    test_kquant(GGML_BF16, 19, 42, 5);        /* packed BF16: rows of any even length (a tail of 2) */
    test_kquant(GGML_BF16, 37, 90, 8);
    test_kquant(GGML_BF16, 7, 45, 3);         /* odd: the row kernel (it read nb * 32 columns) */
    if (fails) {
        printf("test_quant: %d FAILED\n", fails);
        return 1;
    }
    printf("test_quant: all passed\n");
    return 0;
}
