/* quant.h — weight formats and the matmul kernels over them.
 * Owns: the API above the per-format files: dequant_row's dispatch, packing, activations, the
 * batched matrix-times-rows kernel (each weight row read once for all input rows), exp/SiLU.
 * The types and fp16 are quant_base.h's. */
#ifndef COLI_QUANT_H
#define COLI_QUANT_H
#include <stddef.h>
#include <stdint.h>

#include "quant_base.h"
#include <math.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

/* Dequantize one row of n values of `type` into out. */
void dequant_row(uint32_t type, const void *row, float *out, int n);

/* Interleaved ("packed") layout: groups of 8 rows, values of the 8 rows side by side so
 * one vector instruction works on 8 output rows. Supported for Q4_1, Q8_0 (cols % 32 == 0)
 * and F16. qpack_ok: the type/shape can be packed. qpack_bytes: size of the packed matrix
 * (rows rounded up to 8). qpack: writes it to dst (padding rows are zero). */
int qpack_ok(uint32_t type, int rows, int cols);
size_t qpack_bytes(uint32_t type, int rows, int cols);
void qpack(const qmat *w, uint8_t *dst);
/* qpack a slab at a time: rows r0 .. r0 + n - 1 (r0 a multiple of 8; clipped to the matrix) into
 * their place in the packed layout at dst, the whole matrix's buffer. -1 for a layout that is not
 * grouped by rows (small F16 matrices are transposed whole): qpack those. */
int qpack_rows(const qmat *w, int r0, int n, uint8_t *dst);

/* Row r of w dequantized (the values dequant_row gives), from either layout. */
void qmat_row(const qmat *w, int r, float *out);

void qact_prepare(qact *a, uint32_t wtype, const float *x, int n, int cols);
void qact_free(qact *a);
/* dst = rows[0..cnt) of src (floats and int8 blocks). 0 ok, -1 OOM. */
int qact_gather(qact *dst, const qact *src, const int *rows, int cnt);

/* out[i*out_stride + r] = dot(W row r, x row i) for r in [0,W.rows), i in [0,n).
 * Parallel over weight rows with OpenMP; every weight row is read once for all n rows. */
void qmat_mul(const qmat *w, const qact *x, float *out, int out_stride);
/* Several independent matmuls run as one parallel job (one synchronization).
 * w2 != NULL (same shape and type as w): out = silu(w x) * (w2 x) elementwise. */
typedef struct {
    const qmat *w, *w2;
    const qact *x;
    float *out;
    int out_stride;
} mm_job;
void qmat_mul_multi(const mm_job *jobs, int cnt);
/* Convenience: prepares activations internally (allocates scratch). */
void qmat_mul_f32(const qmat *w, const float *x, int n, float *out, int out_stride);
/* exp for softmax and SiLU, one fixed sequence of float operations (vector and scalar give the
 * same bits): x clamped to [-87, 88]; n = rint(x * log2 e); r = x - n ln2 (two fmas);
 * degree-6 Taylor polynomial (Horner, fmas); times 2^n. Max relative error ~2e-7. */
#define EXP_LO -87.0f
#define EXP_HI 88.0f
#define EXP_L2E 1.44269504088896341f
#define EXP_LN2H 0.693145751953125f
#define EXP_LN2L 1.428606765330187e-06f

static inline float qexp_s(float x) {
    x = fminf(fmaxf(x, EXP_LO), EXP_HI);
    float n = rintf(x * EXP_L2E);
    float r = fmaf(n, -EXP_LN2H, x);
    r = fmaf(n, -EXP_LN2L, r);
    float p = 1.0f / 720;
    p = fmaf(p, r, 1.0f / 120);
    p = fmaf(p, r, 1.0f / 24);
    p = fmaf(p, r, 1.0f / 6);
    p = fmaf(p, r, 0.5f);
    p = fmaf(p, r, 1.0f);
    p = fmaf(p, r, 1.0f);
    uint32_t bits = (uint32_t)((int)n + 127) << 23;
    float sc;
    memcpy(&sc, &bits, 4);
    return p * sc;
}

#ifdef __AVX2__
/* The 8 lanes' sum, halves added 8 -> 4 -> 2 -> 1 (a fixed order). */
static inline float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline __m256 qexp_v(__m256 x) {
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(EXP_LO)), _mm256_set1_ps(EXP_HI));
    __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_L2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2H), x);
    r = _mm256_fmadd_ps(n, _mm256_set1_ps(-EXP_LN2L), r);
    __m256 p = _mm256_set1_ps(1.0f / 720);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}
#endif

/* silu(a) * b computed as a / (1 + qexp(-a)) * b (vector and scalar: same bits). */
static inline float qsilu_mul(float a, float b) { return a / (1.0f + qexp_s(-a)) * b; }
#ifdef __AVX2__
static inline __m256 qsilu_mul_v(__m256 a, __m256 b) {
    __m256 e = qexp_v(_mm256_sub_ps(_mm256_setzero_ps(), a));
    return _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(_mm256_set1_ps(1.0f), e)), b);
}
#endif
#endif
