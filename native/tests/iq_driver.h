/* iq_driver.h — the kernel checks the IQ tests share (test_quant_iq.c, test_quant_iqlow.c): a file
 * gives its formats' random rows and its canonical order, and the driver checks qmat_mul against
 * that order bit for bit and against a double dot within the activation rounding; identical bits
 * for n = 1 / n = 8 and 1-3 threads; EXACT (float activations) = qdot_exact of dequant_row.
 * Include after check.h with TEST_SEED defined, and after quant.h / gguf.h. */
#ifndef COLI_TEST_IQ_DRIVER_H
#define COLI_TEST_IQ_DRIVER_H
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A random row of format t (random codes and scales, not a quantizer). */
typedef void (*iq_row_fn)(uint32_t t, uint8_t *p, int cols);
/* 1 when got (qmat_mul's output for activation i and this row) is the format's canonical order
 * written out in scalar code, bit for bit (and any other kernel its own order). */
typedef int (*iq_order_fn)(uint32_t t, const uint8_t *row, const qact *a, int i, int cols, float got);

static uint32_t fbits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* The double dot of the dequantized row with the activation (*ref), and how far an int8 dot may
 * fall from it: float rounding plus half a step of each block's activation scale. */
static double iq_tolerance(const float *deq, const float *xi, int cols, double *ref)
{
    double dot = 0, mag = 0, qerr = 0;
    for (int b = 0; b < cols / 32; b++) {
        double amax = 0, sw = 0;
        for (int j = 32 * b; j < 32 * b + 32; j++) {
            dot += (double)deq[j] * xi[j];
            mag += fabs((double)deq[j] * xi[j]);
            amax = fmax(amax, fabs(xi[j]));
            sw += fabs(deq[j]);
        }
        qerr += amax / 127.0 * 0.5 * 1.0001 * sw;
    }
    *ref = dot;
    return 1e-5 * mag + qerr + 1e-6;
}

/* qmat_mul == the canonical order bit for bit, and near the double dot of the dequantized row. */
static void iq_test_kernel(uint32_t t, int rows, int cols, int n, iq_row_fn make, iq_order_fn order)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *out = malloc(sizeof(float) * n * rows), *deq = malloc(sizeof(float) * cols);
    for (int r = 0; r < rows; r++) make(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand() * (i % 7 == 0 ? 3.0f : 1.0f);
    const qmat m = {t, rows, cols, rb, W, 0};
    qact a = {0};
    qact_prepare(&a, t, x, n, cols);
    qmat_mul(&m, &a, out, rows);
    int same = 1;
    double worst = 0;
    for (int r = 0; r < rows; r++) {
        dequant_row(t, W + r * rb, deq, cols);
        for (int i = 0; i < n; i++) {
            const float got = out[(size_t)i * rows + r];
            same &= order(t, W + r * rb, &a, i, cols, got);
            double ref;
            const double tol = iq_tolerance(deq, x + (size_t)i * cols, cols, &ref), err = fabs(got - ref);
            if (err / tol > worst) worst = err / tol;
            CHECK(err <= tol, "%s %dx%d: out[%d][%d] = %.7g, ref %.7g", ggml_type_name(t), rows, cols, i, r, got, ref);
        }
    }
    CHECK(same, "%s %dx%d n=%d: qmat_mul differs from the canonical order", ggml_type_name(t), rows, cols, n);
    printf("  %-7s %4dx%-4d n=%d  canonical order bit-identical: %s, worst err/tol = %.3f\n", ggml_type_name(t), rows, cols,
           n, same ? "yes" : "NO", worst);
    qact_free(&a);
    free(W); free(x); free(out); free(deq);
}

/* 1 when qmat_mul gives the same bits for the n activations at once and one by one, with 1-3
 * threads (big: n * rows floats of scratch). */
static int iq_same_bits(const qmat *m, const float *x, int n, float *big)
{
    const int rows = m->rows, cols = m->cols;
    float *first = malloc(sizeof(float) * n * rows), *one = malloc(sizeof(float) * rows);
    qact a = {0};
    int same = 1;
    for (int threads = 1; threads <= 3; threads++) {
        omp_set_num_threads(threads);
        qact_prepare(&a, m->type, x, n, cols);
        qmat_mul(m, &a, big, rows);
        for (int i = 0; i < n; i++) {
            qact_prepare(&a, m->type, x + (size_t)i * cols, 1, cols);
            qmat_mul(m, &a, one, rows);
            same &= memcmp(one, big + (size_t)i * rows, sizeof(float) * rows) == 0;
        }
        if (threads == 1) memcpy(first, big, sizeof(float) * n * rows);
        else same &= memcmp(first, big, sizeof(float) * n * rows) == 0;
    }
    omp_set_num_threads(omp_get_num_procs());
    qact_free(&a);
    free(first); free(one);
    return same;
}

/* 1 when EXACT (float activations) gives qdot_exact of dequant_row's values (big: scratch). */
static int iq_exact(const qmat *m, const float *x, int n, float *big)
{
    const int rows = m->rows, cols = m->cols;
    float *deq = malloc(sizeof(float) * cols);
    qact e = {0};
    e.exact = 1;
    qact_prepare(&e, m->type, x, n, cols);
    qmat_mul(m, &e, big, rows);
    int exact = 1;
    for (int r = 0; r < rows; r++) {
        dequant_row(m->type, (const uint8_t *)m->data + (size_t)r * m->row_bytes, deq, cols);
        for (int i = 0; i < n; i++)
            exact &= fbits(big[(size_t)i * rows + r]) == fbits(qdot_exact(deq, x + (size_t)i * cols, cols));
    }
    qact_free(&e);
    free(deq);
    return exact;
}

/* n = 1 against n = 8, 1-3 threads: the same bits; EXACT = qdot_exact of dequant_row's values. */
static void iq_test_determinism_exact(uint32_t t, int rows, int cols, iq_row_fn make)
{
    const int n = 8;
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb * rows);
    float *x = malloc(sizeof(float) * n * cols), *big = malloc(sizeof(float) * n * rows);
    for (int r = 0; r < rows; r++) make(t, W + r * rb, cols);
    for (int i = 0; i < n * cols; i++) x[i] = frand();
    const qmat m = {t, rows, cols, rb, W, 0};
    const int same = iq_same_bits(&m, x, n, big);
    CHECK(same, "%s %dx%d: outputs differ between n=1/n=8 or thread counts", ggml_type_name(t), rows, cols);
    const int exact = iq_exact(&m, x, n, big);
    CHECK(exact, "%s %dx%d: EXACT differs from qdot_exact of dequant_row", ggml_type_name(t), rows, cols);
    printf("  %-7s %4dx%-4d bit-identical for n=1/n=8, 1-3 threads: %s; EXACT = qdot_exact(dequant_row): %s\n",
           ggml_type_name(t), rows, cols, same ? "yes" : "NO", exact ? "yes" : "NO");
    free(W); free(x); free(big);
}
#endif
