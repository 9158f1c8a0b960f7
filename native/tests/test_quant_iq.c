/* test_quant_iq.c — IQ4_NL / IQ4_XS (src/quant_iq.c): dequant_row against the block layout
 * decoded here independently; qmat_mul (int8 activations) equal, bit for bit, to quant_iq.h's
 * canonical order written out in scalar code (whatever SIMD path the build took) and within the
 * activation rounding of a double dot; identical bits for n = 1 / n = 8 and 1-3 threads; the
 * EXACT mode (float activations) equal to qdot_exact of the dequantized row. */
#include "gguf.h"
#include "quant.h"
#include "quant_iq.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SEED 0x5851f42d4c957f2dull
#include "check.h"

static const int KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static void put16(uint8_t *p, float f) { uint16_t h = f32_to_fp16(f); memcpy(p, &h, 2); }
static float get16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_f32(h); }

/* Random codes and scales (not a quantizer), a sane f16 d; big = 1: the largest finite fp16 d. */
static void make_row(uint32_t t, uint8_t *p, int cols, int big)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    for (size_t j = 0; j < rb; j++) p[j] = (uint8_t)rnd32();
    const int step = t == GGML_IQ4_XS ? 136 : 18;
    for (size_t o = 0; o < rb; o += (size_t)step) put16(p + o, big ? (rnd32() & 1 ? 65504.0f : -65504.0f) : frand() * 0.01f);
}

/* The row's values decoded from the layout (IQ4_XS: f16 d, u16 scales_h, u8 scales_l[4], qs[128]). */
static void ref_decode(uint32_t t, const uint8_t *p, float *out, int cols)
{
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *qs;
        float s;
        if (t == GGML_IQ4_NL) {
            s = get16(p + 18 * b);
            qs = p + 18 * b + 2;
        } else {
            const uint8_t *sb = p + 136 * (b / 8);
            const int j = b % 8, sh = sb[2] | sb[3] << 8;
            const int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
            s = get16(sb) * (float)(ls - 32);
            qs = sb + 8 + 16 * j;
        }
        for (int i = 0; i < 16; i++) {
            out[32 * b + i] = s * (float)KV[qs[i] & 15];
            out[32 * b + 16 + i] = s * (float)KV[qs[i] >> 4];
        }
    }
}

static void test_dequant(uint32_t t, int cols)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb);
    float *a = malloc(sizeof(float) * cols), *b = malloc(sizeof(float) * cols);
    int same = 1;
    for (int r = 0; r < 40; r++) {
        make_row(t, W, cols, r % 4 == 3);
        dequant_row(t, W, a, cols);
        ref_decode(t, W, b, cols);
        same &= memcmp(a, b, sizeof(float) * cols) == 0;
    }
    CHECK(same, "%s: dequant_row differs from the layout", ggml_type_name(t));
    printf("  %-6s dequant_row = the layout decoded here, 40 rows x %d: %s\n", ggml_type_name(t), cols, same ? "yes" : "NO");
    free(W); free(a); free(b);
}

/* qmat_mul == the canonical order (8 lanes, block b in lane b % 8) bit for bit, and near the
 * double dot of the dequantized row with the float activations. */
static void test_kernel(uint32_t t, int rows, int cols, int n)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows);
    float *deq = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols, 0);
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
            const int8_t *xq = a.q + (size_t)i * cols;
            const float *xd = a.qd + (size_t)i * nb;
            float L[8] = {0, 0, 0, 0, 0, 0, 0, 0};
            for (int b = 0; b < nb; b++) {
                int8_t q[32];
                float s;
                qiq_block(t, W + r * rb, b, q, &s);
                int32_t is = 0;
                for (int j = 0; j < 32; j++) is += q[j] * xq[32 * b + j];
                L[b % 8] = fmaf((float)is, s * xd[b], L[b % 8]);
            }
            const float acc = ((L[0] + L[4]) + (L[2] + L[6])) + ((L[1] + L[5]) + (L[3] + L[7]));
            const float got = out[(size_t)i * rows + r];
            if (fbits(got) != fbits(acc)) same = 0;
            double ref = 0, mag = 0, qerr = 0;
            const float *xi = x + (size_t)i * cols;
            for (int j = 0; j < cols; j++) {
                ref += (double)deq[j] * xi[j];
                mag += fabs((double)deq[j] * xi[j]);
            }
            for (int b = 0; b < nb; b++) {
                double amax = 0, sw = 0;
                for (int j = 32 * b; j < 32 * b + 32; j++) {
                    amax = fmax(amax, fabs(xi[j]));
                    sw += fabs(deq[j]);
                }
                qerr += amax / 127.0 * 0.5 * 1.0001 * sw;
            }
            const double tol = 1e-5 * mag + qerr + 1e-6, err = fabs(got - ref);
            if (err / tol > worst) worst = err / tol;
            CHECK(err <= tol, "%s %dx%d: out[%d][%d] = %.7g, ref %.7g", ggml_type_name(t), rows, cols, i, r, got, ref);
        }
    }
    CHECK(same, "%s %dx%d n=%d: qmat_mul differs from the canonical order", ggml_type_name(t), rows, cols, n);
    printf("  %-6s %4dx%-4d n=%d  canonical order bit-identical: %s, worst err/tol = %.3f\n", ggml_type_name(t), rows,
           cols, n, same ? "yes" : "NO", worst);
    qact_free(&a);
    free(W); free(x); free(out); free(deq);
}

/* n = 1 against n = 8, 1-3 threads: the same bits; EXACT (float activations) = qdot_exact of
 * dequant_row's values. */
static void test_determinism_exact(uint32_t t, int rows, int cols)
{
    const int n = 8;
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *big = malloc(sizeof(float) * n * rows);
    float *first = malloc(sizeof(float) * n * rows), *one = malloc(sizeof(float) * rows);
    float *deq = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) make_row(t, W + r * rb, cols, 0);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    qmat m = {t, rows, cols, rb, W, 0};
    qact a = {0};
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        qact_prepare(&a, t, x, n, cols);
        qmat_mul(&m, &a, big, rows);
        for (int i = 0; i < n; i++) {
            qact_prepare(&a, t, x + (size_t)i * cols, 1, cols);
            qmat_mul(&m, &a, one, rows);
            same &= memcmp(one, big + (size_t)i * rows, sizeof(float) * rows) == 0;
        }
        if (threads == 1) memcpy(first, big, sizeof(float) * n * rows);
        else same &= memcmp(first, big, sizeof(float) * n * rows) == 0;
    }
    omp_set_num_threads(omp_get_num_procs());
    CHECK(same, "%s %dx%d: outputs differ between n=1/n=8 or thread counts", ggml_type_name(t), rows, cols);
    qact e = {0};
    e.exact = 1;
    qact_prepare(&e, t, x, n, cols);
    qmat_mul(&m, &e, big, rows);
    int exact = 1;
    for (int r = 0; r < rows; r++) {
        dequant_row(t, W + r * rb, deq, cols);
        for (int i = 0; i < n; i++)
            exact &= fbits(big[(size_t)i * rows + r]) == fbits(qdot_exact(deq, x + (size_t)i * cols, cols));
    }
    CHECK(exact, "%s %dx%d: EXACT differs from qdot_exact of dequant_row", ggml_type_name(t), rows, cols);
    printf("  %-6s %4dx%-4d bit-identical for n=1/n=8, 1-3 threads: %s; EXACT = qdot_exact(dequant_row): %s\n",
           ggml_type_name(t), rows, cols, same ? "yes" : "NO", exact ? "yes" : "NO");
    qact_free(&a);
    qact_free(&e);
    free(W); free(x); free(big); free(first); free(one); free(deq);
}

int main(void)
{
    printf("IQ4_NL / IQ4_XS\n");
    test_dequant(GGML_IQ4_XS, 1024);
    test_dequant(GGML_IQ4_NL, 352);
    test_kernel(GGML_IQ4_XS, 19, 512, 5);
    test_kernel(GGML_IQ4_XS, 300, 256, 3);     /* large enough to run in parallel */
    test_kernel(GGML_IQ4_XS, 7, 2048, 4);
    test_kernel(GGML_IQ4_NL, 19, 96, 5);       /* 3 blocks: a short group */
    test_kernel(GGML_IQ4_NL, 37, 288, 2);      /* 9 blocks: 8 + 1 */
    test_kernel(GGML_IQ4_NL, 300, 352, 3);
    test_determinism_exact(GGML_IQ4_XS, 301, 256);
    test_determinism_exact(GGML_IQ4_NL, 301, 352);
    if (fails) {
        printf("test_quant_iq: %d FAILED\n", fails);
        return 1;
    }
    printf("test_quant_iq: all passed\n");
    return 0;
}
