/* test_exact.c — the EXACT-mode matmul (qact.exact: float activations, weight rows
 * dequantized by dequant_row, float32 dots in qdot_exact's fixed order): every output equals,
 * bit for bit, this file's portable rendering of that order, whatever the batch size, thread
 * count, index view, gather or silu pairing; and it is within float rounding of a double dot. */
#include "gguf.h"
#include "quant.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SEED 0x2545f4914f6cdd1dull
#include "check.h"

#include "rows.h"

/* The documented order, portable: lane l = fmaf chain over k % 8 == l, then the fixed tree. */
static float dot_spec(const float *w, const float *x, int n)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int k = 0; k < n; k++) l[k % 8] = fmaf(w[k], x[k], l[k % 8]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

static void test_case(uint32_t t, int rows, int cols)
{
    const int n = 8;
    size_t rb = ggml_row_bytes(t, cols);
    uint8_t *W = malloc(rb * rows), *W2 = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *wd = malloc(sizeof(float) * cols), *wd2 = malloc(sizeof(float) * cols);
    float *want = malloc(sizeof(float) * n * rows), *want2 = malloc(sizeof(float) * n * rows);
    float *got = malloc(sizeof(float) * n * rows), *one = malloc(sizeof(float) * rows);
    for (int r = 0; r < rows; r++) { make_row(t, W + r * rb, cols); make_row(t, W2 + r * rb, cols); }
    for (int i = 0; i < n * cols; i++) x[i] = frand() * (i % 13 == 0 ? 40.0f : 1.0f);
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        dequant_row(t, W + r * rb, wd, cols);
        dequant_row(t, W2 + r * rb, wd2, cols);
        for (int i = 0; i < n; i++) {
            const float *xi = x + (size_t)i * cols;
            float a = dot_spec(wd, xi, cols);
            want[(size_t)i * rows + r] = a;
            want2[(size_t)i * rows + r] = qsilu_mul(a, dot_spec(wd2, xi, cols));
            CHECK(qdot_exact(wd, xi, cols) == a, "%s qdot_exact differs from the spec", ggml_type_name(t));
            double ref = 0, mag = 0;
            for (int j = 0; j < cols; j++) {
                ref += (double)wd[j] * xi[j];
                mag += fabs((double)wd[j] * xi[j]);
            }
            double e = fabs(a - ref) / (1e-6 * mag + 1e-30);
            if (e > worst) worst = e;
        }
    }
    CHECK(worst <= 1.0, "%s %dx%d: float32 dot off by %.3g x 1e-6 sum|w x|", ggml_type_name(t), rows, cols, worst);
    qmat m = {t, rows, cols, rb, W, 0}, m2 = {t, rows, cols, rb, W2, 0};
    qact a = {0}, g = {0};
    a.exact = 1;
    int ok = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        qact_prepare(&a, t, x, n, cols);
        qmat_mul(&m, &a, got, rows);
        ok &= same_bits(got, want, (size_t)n * rows);
        mm_job j = {&m, &m2, &a, got, rows};
        qmat_mul_multi(&j, 1);
        ok &= same_bits(got, want2, (size_t)n * rows);
        for (int i = 0; i < n; i++) {
            qact_prepare(&a, t, x + (size_t)i * cols, 1, cols);
            qmat_mul(&m, &a, one, rows);
            ok &= same_bits(one, want + (size_t)i * rows, (size_t)rows);
        }
        /* index view and gather of rows 5, 2, 7 */
        static const int pick[3] = {5, 2, 7};
        qact_prepare(&a, t, x, n, cols);
        qact v = a;
        v.n = 3;
        v.idx = pick;
        qmat_mul(&m, &v, got, rows);
        CHECK(qact_gather(&g, &a, pick, 3) == 0 && g.exact == 1, "gather");
        qmat_mul(&m, &g, got + 3 * rows, rows);
        for (int k = 0; k < 3; k++) {
            ok &= same_bits(got + (size_t)k * rows, want + (size_t)pick[k] * rows, (size_t)rows);
            ok &= same_bits(got + (size_t)(3 + k) * rows, want + (size_t)pick[k] * rows, (size_t)rows);
        }
    }
    omp_set_num_threads(omp_get_num_procs());
    if (qpack_ok(t, rows, cols)) {        /* packed weights: the same values (qmat_row) */
        uint8_t *P = aligned_alloc(64, (qpack_bytes(t, rows, cols) + 63) & ~(size_t)63);
        uint8_t *P2 = aligned_alloc(64, (qpack_bytes(t, rows, cols) + 63) & ~(size_t)63);
        qpack(&m, P);
        qpack(&m2, P2);
        qmat pm = m, pm2 = m2;
        pm.data = P, pm.packed = 1;
        pm2.data = P2, pm2.packed = 1;
        qact_prepare(&a, t, x, n, cols);
        mm_job j = {&pm, &pm2, &a, got, rows};
        qmat_mul_multi(&j, 1);
        ok &= same_bits(got, want2, (size_t)n * rows);
        qmat_mul(&pm, &a, got, rows);
        ok &= same_bits(got, want, (size_t)n * rows);
        free(P);
        free(P2);
    }
    CHECK(ok, "%s %dx%d: outputs differ from the spec (batch, threads, view, gather, silu or packing)",
          ggml_type_name(t), rows, cols);
    printf("  %-5s %4dx%-4d bit-identical to the spec (n=1/8, 1-3 threads, views, silu, packed): %s;"
           " |err| <= %.2f x 1e-6 sum|w x|\n", ggml_type_name(t), rows, cols, ok ? "yes" : "NO", worst);
    qact_free(&a);
    qact_free(&g);
    free(W); free(W2); free(x); free(wd); free(wd2); free(want); free(want2); free(got); free(one);
}

int main(void)
{
    printf("EXACT matmul (float activations)\n");
    uint32_t types[] = {GGML_F32, GGML_F16, GGML_Q8_0, GGML_Q4_0, GGML_Q4_1, GGML_Q5_0, GGML_Q5_1};
    for (int k = 0; k < 7; k++) {
        test_case(types[k], 37, 576);
        test_case(types[k], 301, 256);      /* large enough to run in parallel */
        test_case(types[k], 9, 32);
    }
    uint32_t ktypes[] = {GGML_Q2_K, GGML_Q3_K, GGML_Q4_K, GGML_Q5_K, GGML_Q6_K, GGML_BF16};
    for (int k = 0; k < 6; k++) {
        test_case(ktypes[k], 37, 512);
        test_case(ktypes[k], 301, 256);
    }
    test_case(GGML_F32, 9, 45);             /* float rows of any length: the scalar tail */
    test_case(GGML_F16, 17, 13);
    if (fails) {
        printf("test_exact: %d FAILED\n", fails);
        return 1;
    }
    printf("test_exact: all passed\n");
    return 0;
}
