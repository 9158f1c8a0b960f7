/* quant.c — fp16 conversion, block formats (F32, F16, Q4_0, Q4_1, Q8_0) and the
 * batched matrix-times-rows kernel.
 *
 * Determinism: every output element out[i][r] is computed by exactly one thread with
 * one fixed sequence of operations that depends only on (weight row r, input row i).
 * So results are bit-identical whatever the batch size n and the thread count.
 *
 * Quantized weights are multiplied with activations quantized per 32-block to int8
 * (scale d = max|x| / 127), like ggml's q8_0; Q4_1's min term uses the exact float
 * sum of the block's activations (qs), which is more accurate than d * sum(q).
 *
 * Block layouts (32 values each):
 *   Q8_0: f16 d, int8 q[32]            value j = d * q[j]
 *   Q4_0: f16 d, u8 qs[16]             value j = d * (nib_j - 8)
 *   Q4_1: f16 d, f16 m, u8 qs[16]      value j = d * nib_j + m
 *   Q5_0: f16 d, u32 qh, u8 qs[16]     value j = d * (q5_j - 16)
 *   Q5_1: f16 d, f16 m, u32 qh, u8 qs[16]   value j = d * q5_j + m
 * with nib_j = qs[j] & 15 for j < 16 and qs[j-16] >> 4 for j >= 16, and
 * q5_j = nib_j | ((qh >> j) & 1) << 4 (qh little-endian). */
#include "quant.h"
#include "gguf.h"
#include "pool.h"
#include "quant_k.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define QK 32
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24

/* ---- fp16 ------------------------------------------------------------------------ */

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float sw_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 31, man = h & 0x3ff;
    if (exp == 0) {                        /* zero or subnormal: man * 2^-24, exact */
        float v = (float)man * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31)                         /* inf, or NaN (quieted, payload kept) */
        return bits_f32(sign | 0x7f800000u | (man ? 0x00400000u | (man << 13) : 0));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static uint16_t sw_f32_to_fp16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u)                  /* inf / NaN (NaN stays NaN, quiet) */
        return (uint16_t)(sign | 0x7c00 | (u > 0x7f800000u ? 0x200 | ((u >> 13) & 0x3ff) : 0));
    if (u >= 0x477ff000u)                  /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00);
    if (u < 0x38800000u) {                 /* below 2^-14: subnormal half (or zero) */
        float v = rintf(bits_f32(u) * 0x1p24f);   /* exact scaling, round to nearest even */
        return (uint16_t)(sign | (uint16_t)v);    /* 1024 becomes the smallest normal */
    }
    uint32_t h = (u >> 13) - (112u << 10);
    uint32_t rem = u & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float fp16_to_f32(uint16_t h)
{
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return sw_fp16_to_f32(h);
#endif
}

uint16_t f32_to_fp16(float f)
{
#ifdef __F16C__
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return sw_f32_to_fp16(f);
#endif
}

/* Exposed for tests only (not in quant.h): the portable conversions. */
float quant_sw_fp16_to_f32(uint16_t h);
uint16_t quant_sw_f32_to_fp16(float f);
float quant_sw_fp16_to_f32(uint16_t h) { return sw_fp16_to_f32(h); }
uint16_t quant_sw_f32_to_fp16(float f) { return sw_f32_to_fp16(f); }

static inline float ld_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

/* ---- dequantization ---------------------------------------------------------------- */

/* The 32 five-bit codes (0..31) of a Q5 block from its qh word (at p) and 16 nibble bytes
 * (at p + 4), minus off. */
static inline void q5_codes(const uint8_t *p, int off, int8_t *q)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
    const uint8_t *qs = p + 4;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | ((qh >> j) & 1) << 4) - off);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - off);
    }
}

void dequant_row(uint32_t type, const void *row, float *out, int n)
{
    const uint8_t *p = row;
    int nb = n / QK;
    switch (type) {
    case GGML_F32:
        memcpy(out, row, (size_t)n * sizeof(float));
        break;
    case GGML_F16:
        for (int j = 0; j < n; j++) out[j] = ld_f16(p + 2 * (size_t)j);
        break;
    case GGML_Q8_0:
        for (int b = 0; b < nb; b++, p += Q8_0_BYTES) {
            float d = ld_f16(p);
            const int8_t *q = (const int8_t *)(p + 2);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)q[j];
        }
        break;
    case GGML_Q4_0:
        for (int b = 0; b < nb; b++, p += Q4_0_BYTES) {
            float d = ld_f16(p);
            const uint8_t *qs = p + 2;
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = d * (float)((qs[j] & 15) - 8);
                out[b * QK + j + 16] = d * (float)((qs[j] >> 4) - 8);
            }
        }
        break;
    case GGML_Q4_1:
        for (int b = 0; b < nb; b++, p += Q4_1_BYTES) {
            float d = ld_f16(p), m = ld_f16(p + 2);
            const uint8_t *qs = p + 4;
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = d * (float)(qs[j] & 15) + m;
                out[b * QK + j + 16] = d * (float)(qs[j] >> 4) + m;
            }
        }
        break;
    case GGML_Q5_0:
        for (int b = 0; b < nb; b++, p += Q5_0_BYTES) {
            float d = ld_f16(p);
            int8_t q[QK];
            q5_codes(p + 2, 16, q);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)q[j];
        }
        break;
    case GGML_Q5_1:
        for (int b = 0; b < nb; b++, p += Q5_1_BYTES) {
            float d = ld_f16(p), m = ld_f16(p + 2);
            int8_t q[QK];
            q5_codes(p + 4, 0, q);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)q[j] + m;
        }
        break;
    default:
        if (qk_is_k(type) || type == GGML_BF16) qk_dequant(type, p, out, n);
        else memset(out, 0, (size_t)n * sizeof(float));
        break;
    }
}

/* ---- activations --------------------------------------------------------------------- */

static int is_quant(uint32_t t)
{
    return t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q4_1 || t == GGML_Q5_0 || t == GGML_Q5_1 ||
           qk_is_k(t);
}
/* types whose kernels read the float activations */
static int is_float(uint32_t t) { return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16; }

static void *alloc64(size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* Quantize one block of 32 floats to int8 with scale d = max|x| / 127 (round half away
 * from zero, clamped to +-127); also the float sum of the block and the integer sum of q.
 * The float sum has one fixed order on every path: lanes l < 8 hold
 * (x[l] + x[l+8]) + (x[l+16] + x[l+24]); then a_l = lane l + lane l+4 (l < 4);
 * sum = (a0 + a2) + (a1 + a3). */
static void quant_block(const float *x, int8_t *q, float *d_out, float *s_out, int32_t *i_out)
{
#ifdef __AVX2__
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 v[4];
    for (int k = 0; k < 4; k++) v[k] = _mm256_loadu_ps(x + 8 * k);
    __m256 am = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v[0]), _mm256_andnot_ps(sign, v[1])),
                              _mm256_max_ps(_mm256_andnot_ps(sign, v[2]), _mm256_andnot_ps(sign, v[3])));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(am), _mm256_extractf128_ps(am, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    __m256 s8 = _mm256_add_ps(_mm256_add_ps(v[0], v[1]), _mm256_add_ps(v[2], v[3]));
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    s4 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    s4 = _mm_add_ss(s4, _mm_movehdup_ps(s4));
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256i iv[4], isum = _mm256_setzero_si256();
    for (int k = 0; k < 4; k++) {
        __m256 t = _mm256_mul_ps(v[k], id);
        t = _mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(t, sign), half));   /* t +- 0.5 */
        iv[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(-127)),
                                 _mm256_set1_epi32(127));
        isum = _mm256_add_epi32(isum, iv[k]);
    }
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    __m128i i4 = _mm_add_epi32(_mm256_castsi256_si128(isum), _mm256_extracti128_si256(isum, 1));
    i4 = _mm_add_epi32(i4, _mm_shuffle_epi32(i4, 0x4e));
    i4 = _mm_add_epi32(i4, _mm_shuffle_epi32(i4, 0xb1));
    *d_out = d;
    *s_out = _mm_cvtss_f32(s4);
    *i_out = _mm_cvtsi128_si32(i4);
#else
    float amax = 0.0f, lane[8];
    for (int j = 0; j < QK; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    for (int l = 0; l < 8; l++) lane[l] = (x[l] + x[l + 8]) + (x[l + 16] + x[l + 24]);
    float a0 = lane[0] + lane[4], a1 = lane[1] + lane[5], a2 = lane[2] + lane[6], a3 = lane[3] + lane[7];
    float d = amax / 127.0f;
    float id = d != 0.0f ? 1.0f / d : 0.0f;
    int32_t isum = 0;
    for (int j = 0; j < QK; j++) {
        float v = x[j] * id;                       /* |v| <= 127 (+ rounding) */
        v = v >= 0.0f ? v + 0.5f : v - 0.5f;       /* round half away from zero */
        int iv = (int)v;
        q[j] = (int8_t)(iv > 127 ? 127 : iv < -127 ? -127 : iv);
        isum += q[j];
    }
    *d_out = d;
    *s_out = (a0 + a2) + (a1 + a3);
    *i_out = isum;
#endif
}

/* Rows [c * rpc, min(n, (c + 1) * rpc)) of a prepare: float copy and int8 blocks. */
#define PREP_ROWS 16
typedef struct { qact *a; const float *x; int rpc; } prep_ctx;

static void prep_chunk(void *vctx, int c)
{
    const prep_ctx *P = vctx;
    qact *a = P->a;
    const size_t cols = (size_t)a->cols;
    const int r0 = c * P->rpc, r1 = r0 + P->rpc < a->n ? r0 + P->rpc : a->n;
    memcpy(a->f + r0 * cols, P->x + r0 * cols, (size_t)(r1 - r0) * cols * sizeof(float));
    if (cols % QK == 0 && !a->exact)
        for (size_t b = r0 * cols / QK; b < r1 * cols / QK; b++)
            quant_block(P->x + b * QK, a->q + b * QK, &a->qd[b], &a->qs[b], &a->qi[b]);
}

/* The caller must zero-initialize a qact before the first prepare (qact a = {0}).
 * The float copy is always kept; int8 blocks are kept whenever cols % 32 == 0, so a
 * prepared qact can be used with weights of any type of the same cols. */
void qact_prepare(qact *a, uint32_t wtype, const float *x, int n, int cols)
{
    size_t need = (size_t)(n > 0 ? n : 0) * (size_t)(cols > 0 ? cols : 0);
    if (need > a->cap || !a->f) {
        qact_free(a);
        a->cap = need > 64 ? need : 64;
        a->f = alloc64(a->cap * sizeof(float));
        a->q = alloc64(a->cap);
        a->qd = alloc64((a->cap / QK + 1) * sizeof(float));
        a->qs = alloc64((a->cap / QK + 1) * sizeof(float));
        a->qi = alloc64((a->cap / QK + 1) * sizeof(int32_t));
        if (!a->f || !a->q || !a->qd || !a->qs || !a->qi) {
            fprintf(stderr, "qact_prepare: out of memory (%zu values)\n", need);
            abort();
        }
    }
    a->n = n;
    a->cols = cols;
    a->wtype = wtype;
    a->idx = NULL;
    if (need == 0) return;
    prep_ctx c = {a, x, PREP_ROWS};
    if (n >= 2 * PREP_ROWS && (long)n * cols >= (1L << 14))
        pool_run(prep_chunk, &c, (n + PREP_ROWS - 1) / PREP_ROWS);
    else {
        c.rpc = n;
        prep_chunk(&c, 0);
    }
}

int qact_gather(qact *dst, const qact *src, const int *rows, int cnt)
{
    const size_t cols = (size_t)src->cols, nb = cols / QK;
    size_t need = (size_t)(cnt > 0 ? cnt : 0) * cols;
    if (need > dst->cap || !dst->f) {
        qact_free(dst);
        dst->cap = need > 64 ? need : 64;
        dst->f = alloc64(dst->cap * sizeof(float));
        dst->q = alloc64(dst->cap);
        dst->qd = alloc64((dst->cap / QK + 1) * sizeof(float));
        dst->qs = alloc64((dst->cap / QK + 1) * sizeof(float));
        dst->qi = alloc64((dst->cap / QK + 1) * sizeof(int32_t));
        if (!dst->f || !dst->q || !dst->qd || !dst->qs || !dst->qi) {
            qact_free(dst);
            return -1;
        }
    }
    dst->n = cnt;
    dst->cols = src->cols;
    dst->wtype = src->wtype;
    dst->idx = NULL;
    dst->exact = src->exact;
    for (int j = 0; j < cnt; j++) {
        size_t i = (size_t)rows[j];
        memcpy(dst->f + j * cols, src->f + i * cols, cols * sizeof(float));
        if (cols % QK == 0 && !src->exact) {
            memcpy(dst->q + j * cols, src->q + i * cols, cols);
            memcpy(dst->qd + j * nb, src->qd + i * nb, nb * sizeof(float));
            memcpy(dst->qs + j * nb, src->qs + i * nb, nb * sizeof(float));
            memcpy(dst->qi + j * nb, src->qi + i * nb, nb * sizeof(int32_t));
        }
    }
    return 0;
}

void qact_free(qact *a)
{
    free(a->f);
    free(a->q);
    free(a->qd);
    free(a->qs);
    free(a->qi);
    a->f = NULL;
    a->q = NULL;
    a->qd = NULL;
    a->qs = NULL;
    a->qi = NULL;
    a->cap = 0;
}

/* ---- dot kernels: one weight row . one prepared activation row ------------------------ */

#ifdef __AVX2__
static inline float hsum8(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sum of 8 int32 lanes of (unsigned u8 a) * (signed i8 b) over 32 bytes, as floats */
static inline __m256 dot_u8i8(__m256i a, __m256i b)
{
    __m256i p16 = _mm256_maddubs_epi16(a, b);               /* |pair| <= 2*255*127 ok */
    __m256i p32 = _mm256_madd_epi16(p16, _mm256_set1_epi16(1));
    return _mm256_cvtepi32_ps(p32);
}

/* signed x signed via sign trick */
static inline __m256 dot_i8i8(__m256i w, __m256i x)
{
    return dot_u8i8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
}

static inline __m256i unpack_nibbles(const uint8_t *qs)
{
    __m128i raw = _mm_loadu_si128((const __m128i *)qs);
    __m256i both = _mm256_set_m128i(_mm_srli_epi16(raw, 4), raw);
    return _mm256_and_si256(both, _mm256_set1_epi8(15));
}
#endif

static float dot_f32(const float *w, const float *x, int n)
{
    int j = 0;
    float s = 0.0f;
#ifdef __AVX2__
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (; j + 32 <= n; j += 32) {
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 8), _mm256_loadu_ps(x + j + 8), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 16), _mm256_loadu_ps(x + j + 16), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j + 24), _mm256_loadu_ps(x + j + 24), a3);
    }
    for (; j + 8 <= n; j += 8)
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(w + j), _mm256_loadu_ps(x + j), a0);
    s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#else
#pragma omp simd reduction(+ : s)
    for (int k = 0; k < n - n % 8; k++) s += w[k] * x[k];
    j = n - n % 8;
#endif
    for (; j < n; j++) s += w[j] * x[j];
    return s;
}

static float dot_f16(const uint8_t *w8, const float *x, int n)
{
    int j = 0;
    float s = 0.0f;
#if defined(__AVX2__) && defined(__F16C__)
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
#define LDH(k) _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w8 + 2 * (size_t)(k))))
    for (; j + 32 <= n; j += 32) {
        a0 = _mm256_fmadd_ps(LDH(j), _mm256_loadu_ps(x + j), a0);
        a1 = _mm256_fmadd_ps(LDH(j + 8), _mm256_loadu_ps(x + j + 8), a1);
        a2 = _mm256_fmadd_ps(LDH(j + 16), _mm256_loadu_ps(x + j + 16), a2);
        a3 = _mm256_fmadd_ps(LDH(j + 24), _mm256_loadu_ps(x + j + 24), a3);
    }
    for (; j + 8 <= n; j += 8) a0 = _mm256_fmadd_ps(LDH(j), _mm256_loadu_ps(x + j), a0);
#undef LDH
    s = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
#endif
    for (; j < n; j++) s += ld_f16(w8 + 2 * (size_t)j) * x[j];
    return s;
}

/* dot_f16 of one weight row against nx (1..4) activation rows at stride xst: the weight
 * values are converted once; every output gets exactly dot_f16's operations. */
static void dot_f16_n(const uint8_t *w8, const float *x, size_t xst, int nx, int n, float *res)
{
#if defined(__AVX2__) && defined(__F16C__)
    if (n % 8 == 0 && n <= 64) {
        __m256 wv[8];
        for (int k = 0; k < n / 8; k++)
            wv[k] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(w8 + 16 * (size_t)k)));
        for (int i = 0; i < nx; i++) {
            const float *xi = x + (size_t)i * xst;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            int j = 0;
            for (; j + 32 <= n; j += 32) {
                a0 = _mm256_fmadd_ps(wv[j / 8], _mm256_loadu_ps(xi + j), a0);
                a1 = _mm256_fmadd_ps(wv[j / 8 + 1], _mm256_loadu_ps(xi + j + 8), a1);
                a2 = _mm256_fmadd_ps(wv[j / 8 + 2], _mm256_loadu_ps(xi + j + 16), a2);
                a3 = _mm256_fmadd_ps(wv[j / 8 + 3], _mm256_loadu_ps(xi + j + 24), a3);
            }
            for (; j + 8 <= n; j += 8) a0 = _mm256_fmadd_ps(wv[j / 8], _mm256_loadu_ps(xi + j), a0);
            res[i] = hsum8(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
        }
        return;
    }
#endif
    for (int i = 0; i < nx; i++) res[i] = dot_f16(w8, x + (size_t)i * xst, n);
}

#ifdef __AVX2__
#define FORCE_INLINE static inline __attribute__((always_inline))

/* 8 int32 lanes: sums of 4 adjacent (u8 a) * (i8 b) products. The weights' magnitudes
 * (<= 15 for nibbles, <= 128 after the sign trick) keep maddubs' int16 pairs from
 * saturating, so VNNI (one instruction) gives exactly the same sums. */
FORCE_INLINE __m256i dot4_u8i8(__m256i a, __m256i b, __m256i ones)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    (void)ones;
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
    (void)ones;
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), ones);
#endif
}

/* Types with a min term m (f16 after d): value = d * q + m. */
#define HAS_MIN(t) ((t) == GGML_Q4_1 || (t) == GGML_Q5_1)

/* Bit 4 of the 32 codes of a Q5 block: byte j = 16 if bit j of the little-endian qh word. */
FORCE_INLINE __m256i q5_high(const uint8_t *qh)
{
    uint32_t h;
    memcpy(&h, qh, 4);
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)h), sel);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(16));
}

/* Weight block as 32 bytes: signed values for Q8_0/Q4_0/Q5_0, unsigned codes for Q4_1/Q5_1. */
FORCE_INLINE __m256i wblock(uint32_t t, const uint8_t *blk)
{
    if (t == GGML_Q8_0) return _mm256_loadu_si256((const __m256i *)(blk + 2));
    if (t == GGML_Q4_0) return _mm256_sub_epi8(unpack_nibbles(blk + 2), _mm256_set1_epi8(8));
    if (t == GGML_Q5_0)
        return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(blk + 6), q5_high(blk + 2)), _mm256_set1_epi8(16));
    if (t == GGML_Q5_1) return _mm256_or_si256(unpack_nibbles(blk + 8), q5_high(blk + 4));
    return unpack_nibbles(blk + 4);
}

/* Four consecutive f16 values at stride `st` bytes as a float vector. */
FORCE_INLINE __m128 ld4_f16(const uint8_t *p, size_t st)
{
    uint16_t h0, h1, h2, h3;
    memcpy(&h0, p, 2);
    memcpy(&h1, p + st, 2);
    memcpy(&h2, p + 2 * st, 2);
    memcpy(&h3, p + 3 * st, 2);
    uint64_t v = (uint64_t)h0 | (uint64_t)h1 << 16 | (uint64_t)h2 << 32 | (uint64_t)h3 << 48;
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)v));
}

/* One weight row against NX (1..4) activation rows i0..i0+NX-1. Weight blocks are
 * loaded and unpacked once for all NX rows. Groups of 4 blocks: the 4 per-block int32
 * sums are folded with horizontal adds into one vector, converted once and scaled by
 * [s0 s1 s2 s3 | s0 s1 s2 s3]; leftover blocks go to a second accumulator. For each
 * output the float operations and their order depend only on cols, never on NX, so
 * results are bit-identical across batch sizes. */
FORCE_INLINE void qdot_n(uint32_t t, const int NX, const uint8_t *w, const qact *x, int i0,
                         int nb, float *res)
{
    const size_t bsz = t == GGML_Q8_0 ? Q8_0_BYTES : t == GGML_Q4_0 ? Q4_0_BYTES : t == GGML_Q5_0 ? Q5_0_BYTES
                     : t == GGML_Q5_1 ? Q5_1_BYTES : Q4_1_BYTES;
    const size_t xst = (size_t)x->cols, bst = (size_t)nb;
    const int8_t *xq = x->q + (size_t)i0 * xst;
    const float *xd = x->qd + (size_t)i0 * bst, *xs = x->qs + (size_t)i0 * bst;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[4], tail[4];
    __m128 sm4[4];
    float sm[4];
    for (int k = 0; k < NX; k++) {
        acc[k] = tail[k] = _mm256_setzero_ps();
        sm4[k] = _mm_setzero_ps();
        sm[k] = 0.0f;
    }
    int b = 0;
    for (; b + 4 <= nb; b += 4) {
        const uint8_t *wb = w + (size_t)b * bsz;
        __m128 d4, m4 = _mm_setzero_ps();
        if (HAS_MIN(t)) {
            /* (d, m) f16 pairs of 4 blocks in one conversion, then split */
            uint32_t p0, p1, p2, p3;
            memcpy(&p0, wb, 4);
            memcpy(&p1, wb + bsz, 4);
            memcpy(&p2, wb + 2 * bsz, 4);
            memcpy(&p3, wb + 3 * bsz, 4);
            __m256 dm = _mm256_cvtph_ps(_mm_set_epi32((int)p3, (int)p2, (int)p1, (int)p0));
            dm = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
            d4 = _mm256_castps256_ps128(dm);
            m4 = _mm256_extractf128_ps(dm, 1);
        } else {
            d4 = ld4_f16(wb, bsz);
        }
        __m256i v[4], u[4];
        for (int j = 0; j < 4; j++) {
            v[j] = wblock(t, wb + j * bsz);
            u[j] = HAS_MIN(t) ? v[j] : _mm256_sign_epi8(v[j], v[j]);
        }
        for (int k = 0; k < NX; k++) {
            const int8_t *xk = xq + k * xst + (size_t)b * QK;
            __m256i p[4];
            for (int j = 0; j < 4; j++) {
                __m256i xv = _mm256_loadu_si256((const __m256i *)(xk + j * QK));
                if (!HAS_MIN(t)) xv = _mm256_sign_epi8(xv, v[j]);
                p[j] = dot4_u8i8(u[j], xv, ones);
            }
            __m256i h = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]),
                                          _mm256_hadd_epi32(p[2], p[3]));
            __m128 s4 = _mm_mul_ps(d4, _mm_loadu_ps(xd + k * bst + b));
            __m256 s8 = _mm256_insertf128_ps(_mm256_castps128_ps256(s4), s4, 1);
            acc[k] = _mm256_fmadd_ps(s8, _mm256_cvtepi32_ps(h), acc[k]);
        }
        if (HAS_MIN(t)) {
            for (int k = 0; k < NX; k++)
                sm4[k] = _mm_fmadd_ps(m4, _mm_loadu_ps(xs + k * bst + b), sm4[k]);
        }
    }
    for (; b < nb; b++) {
        const uint8_t *w0 = w + (size_t)b * bsz;
        const float d0 = ld_f16(w0);
        const __m256i v0 = wblock(t, w0);
        const __m256i u0 = HAS_MIN(t) ? v0 : _mm256_sign_epi8(v0, v0);
        for (int k = 0; k < NX; k++) {
            __m256i x0 = _mm256_loadu_si256((const __m256i *)(xq + k * xst + (size_t)b * QK));
            if (!HAS_MIN(t)) x0 = _mm256_sign_epi8(x0, v0);
            tail[k] = _mm256_fmadd_ps(_mm256_set1_ps(d0 * xd[k * bst + b]), dot_u8i8(u0, x0),
                                      tail[k]);
            if (HAS_MIN(t)) sm[k] += ld_f16(w0 + 2) * xs[k * bst + b];
        }
    }
    for (int k = 0; k < NX; k++) {
        float v = hsum8(_mm256_add_ps(acc[k], tail[k]));
        if (HAS_MIN(t)) {
            __m128 q = _mm_add_ps(sm4[k], _mm_movehl_ps(sm4[k], sm4[k]));
            q = _mm_add_ss(q, _mm_movehdup_ps(q));
            v += _mm_cvtss_f32(q) + sm[k];
        }
        res[k] = v;
    }
}

#define QDOT_DISPATCH(name, T)                                                              \
    static void name(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)   \
    {                                                                                       \
        switch (nx) {                                                                       \
        case 1: qdot_n(T, 1, w, x, i0, nb, res); break;                                     \
        case 2: qdot_n(T, 2, w, x, i0, nb, res); break;                                     \
        case 3: qdot_n(T, 3, w, x, i0, nb, res); break;                                     \
        default: qdot_n(T, 4, w, x, i0, nb, res); break;                                    \
        }                                                                                   \
    }
QDOT_DISPATCH(qdot_q8_0, GGML_Q8_0)
QDOT_DISPATCH(qdot_q4_0, GGML_Q4_0)
QDOT_DISPATCH(qdot_q4_1, GGML_Q4_1)
QDOT_DISPATCH(qdot_q5_0, GGML_Q5_0)
QDOT_DISPATCH(qdot_q5_1, GGML_Q5_1)
#define QDOT_MAX 4

#else /* portable kernels: one weight row . one activation row */

static float dot_q8_0(const uint8_t *w, const int8_t *xq, const float *xd, int nb)
{
    float s = 0.0f;
    for (int b = 0; b < nb; b++, w += Q8_0_BYTES, xq += QK) {
        const int8_t *q = (const int8_t *)(w + 2);
        int32_t is = 0;
        for (int j = 0; j < QK; j++) is += (int32_t)q[j] * xq[j];
        s += ld_f16(w) * xd[b] * (float)is;
    }
    return s;
}

static float dot_q4_0(const uint8_t *w, const int8_t *xq, const float *xd, int nb)
{
    float s = 0.0f;
    for (int b = 0; b < nb; b++, w += Q4_0_BYTES, xq += QK) {
        const uint8_t *qs = w + 2;
        int32_t is = 0;
        for (int j = 0; j < 16; j++)
            is += ((qs[j] & 15) - 8) * xq[j] + ((qs[j] >> 4) - 8) * xq[j + 16];
        s += ld_f16(w) * xd[b] * (float)is;
    }
    return s;
}

static float dot_q4_1(const uint8_t *w, const int8_t *xq, const float *xd, const float *xs,
                      int nb)
{
    float s = 0.0f, sm = 0.0f;
    for (int b = 0; b < nb; b++, w += Q4_1_BYTES, xq += QK) {
        const uint8_t *qs = w + 4;
        int32_t is = 0;
        for (int j = 0; j < 16; j++) is += (qs[j] & 15) * xq[j] + (qs[j] >> 4) * xq[j + 16];
        s += ld_f16(w) * xd[b] * (float)is;
        sm += ld_f16(w + 2) * xs[b];
    }
    return s + sm;
}

#define QDOT_PORTABLE(name, call)                                                           \
    static void name(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)   \
    {                                                                                       \
        for (int k = 0; k < nx; k++) {                                                      \
            const int8_t *xq = x->q + (size_t)(i0 + k) * x->cols;                           \
            const float *xd = x->qd + (size_t)(i0 + k) * nb;                                \
            const float *xs = x->qs + (size_t)(i0 + k) * nb;                                \
            (void)xs;                                                                       \
            res[k] = call;                                                                  \
        }                                                                                   \
    }
QDOT_PORTABLE(qdot_q8_0, dot_q8_0(w, xq, xd, nb))
QDOT_PORTABLE(qdot_q4_0, dot_q4_0(w, xq, xd, nb))
QDOT_PORTABLE(qdot_q4_1, dot_q4_1(w, xq, xd, xs, nb))
#define QDOT_MAX 4

/* Q5_0 / Q5_1: each weight block's codes unpacked once for the nx rows,
 * an int32 dot with the int8 activations, then per block s += (d * xd) * is in block order;
 * Q5_1 adds m * xs (the block's float activation sum) in a second sum, like Q4_1. */
static void q5_dot(int t1, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)
{
    const size_t bsz = t1 ? Q5_1_BYTES : Q5_0_BYTES, xst = (size_t)x->cols, bst = (size_t)nb;
    float s[QDOT_MAX] = {0}, sm[QDOT_MAX] = {0};
    for (int b = 0; b < nb; b++, w += bsz) {
        int8_t q[QK];
        const float d = ld_f16(w), m = t1 ? ld_f16(w + 2) : 0.0f;
        q5_codes(w + (t1 ? 4 : 2), t1 ? 0 : 16, q);
        for (int k = 0; k < nx; k++) {
            const int8_t *xq = x->q + (size_t)(i0 + k) * xst + (size_t)b * QK;
            int32_t is = 0;
            for (int j = 0; j < QK; j++) is += (int32_t)q[j] * xq[j];
            s[k] += d * x->qd[(size_t)(i0 + k) * bst + b] * (float)is;
            if (t1) sm[k] += m * x->qs[(size_t)(i0 + k) * bst + b];
        }
    }
    for (int k = 0; k < nx; k++) res[k] = s[k] + sm[k];
}

static void qdot_q5_0(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)
{
    q5_dot(0, w, x, i0, nx, nb, res);
}

static void qdot_q5_1(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)
{
    q5_dot(1, w, x, i0, nx, nb, res);
}
#endif

/* ---- packed (interleaved) layout and its register-blocked kernels ----------------------
 *
 * A group is 8 consecutive weight rows r0..r0+7 (j = r - r0); groups follow each other,
 * each 8 * row_bytes long. Within a group, per 32-block b (quantized types) or per value k
 * (F16):
 *   Q4_1: 160 bytes per block: f16 d[8], f16 m[8], then 4 vectors of 32 bytes; vector t,
 *         bytes 4j..4j+3 = qs_j[4t..4t+3] (low nibbles: values 4t..4t+3 of row j, high
 *         nibbles: values 16+4t..16+4t+3).
 *   Q8_0: 272 bytes per block: f16 d[8], then 8 vectors of 32 bytes; vector g, bytes
 *         4j..4j+3 = q_j[4g..4g+3] ^ 0x80 (q + 128 as unsigned: with VNNI, vpdpbusd takes
 *         them as the unsigned operand and the activations as the signed one; the sum is
 *         corrected by -128 * sum(x_q), the block's integer activation sum qact.qi).
 *   F16:  16 bytes per value k: the 8 rows' f16 values of column k.
 * One vpdpbusd (or maddubs+madd) of a weight vector with 4 activation bytes broadcast to
 * all lanes advances 8 dot products by 4 values: no horizontal reductions at all, the
 * unpacked weight vector is reused for every input row of the tile, the activation
 * broadcast for every weight group of the tile.
 *
 * Canonical operation order of one output (row r, input i), shared by every kernel here
 * (vector tiles of any size, the scalar fallback), so results never depend on n, the tile
 * or the thread count:
 *   quantized: acc = 0; for each block b in order:
 *                  isum = exact int32 sum of w_q * x_q over the block;
 *                  acc = fma((float)isum, d_w[b] * d_x[b], acc);
 *                  Q4_1 only: acc = fma(m_w[b], s_x[b], acc);       result acc
 *   F16:       e = o = 0; for k in order: (k even ? e : o) = fma(w_k, x_k, .); result e + o
 * Unpacked matrices are packed on the fly, 8 rows at a time, into a per-thread buffer. */

#define PK_ROWS 8

static int pk_type(uint32_t t)
{
    return t == GGML_Q4_1 || t == GGML_Q8_0 || t == GGML_F16 || t == GGML_Q4_K || t == GGML_Q5_K ||
           t == GGML_Q6_K || t == GGML_Q3_K || t == GGML_Q2_K;
}

int qpack_ok(uint32_t type, int rows, int cols)
{
    if (!pk_type(type) || rows <= 0 || cols <= 0) return 0;
    const int k = type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K || type == GGML_Q3_K || type == GGML_Q2_K;
    return type == GGML_F16 || cols % (k ? 256 : QK) == 0;
}

/* Bytes of one 32-value block of a packed group (Q4_1, Q8_0). Q4_K is packed like Q4_1 with
 * its own scales, 1184 bytes per super-block of a group (148 per row and 256 values, the file:
 * 144): f16 d[8], f16 dmin[8] of the 8 rows, then 8 blocks of 144 bytes: u8 sc[8], u8 m[8] (the
 * rows' 6-bit scale and min of that sub-block) and Q4_1's 4 nibble vectors. The kernels form
 * dl = d * sc and ml = -(dmin * m) (dequant_row's products) and run Q4_1's tiles and order:
 * acc = fma(isum, dl * d_x, acc); acc = fma(ml, s_x, acc). */
#define PK_BLK(t) ((t) == GGML_Q4_1 ? 160 : 272)
#define PK_K4_SB 1184
/* Q6_K: 1680 bytes per super-block of a group (the file's 8 x 210): f16 d[8], then 8 blocks of
 * 208 bytes: int8 sc_a[8], sc_b[8] (the scales of values 0-15 and 16-31), 4 vectors N_t of
 * 32 bytes (bytes 4j..4j+3: row j's codes u = q + 32 of values 4t..4t+3, low nibbles, and of
 * values 16+4t.., high nibbles) and 2 vectors H_h (byte 4j+k: the codes' top 2 bits of values
 * 8h+k, 8h+4+k at bits 0, 2 and of values 16+8h+k, 16+8h+4+k at bits 4, 6). Per block the tile
 * keeps the two halves' exact sums apart: isum = sc_a (sum_a u x - 32 sum_a x) +
 * sc_b (sum_b u x - 32 sum_b x) (= sum sc q x, the row kernel's), then acc = fma(isum, d * d_x,
 * acc), blocks in order. */
#define PK_K6_SB 1680
/* Q3_K uses Q6_K's packed layout (codes u = q + 4, 0..7; its 6-bit scales as int8): 1680 bytes per
 * 8 rows x 256 values against the file's 880 — a speed-for-memory trade (2x the weight bytes in
 * RAM) until it gets a layout of its own. */
#define K6LIKE(t) ((t) == GGML_Q6_K || (t) == GGML_Q3_K || (t) == GGML_Q2_K)
#define K6OFF(t) ((t) == GGML_Q6_K ? 32 : (t) == GGML_Q3_K ? 4 : 0)
/* Q2_K: the same blocks (codes 0..3, offset 0) with a 32-byte super-block header, f16 d[8] and
 * dmin[8] (1696 bytes per 8 rows x 256 values, the file 672), and per block the byte
 * sc | m << 4 of each half in place of the int8 scale; the tile adds Q2_K's min term
 * acc = fma(-(m_a sum_a x + m_b sum_b x), dmin * d_x, acc) after the scale term. */
#define PK_K2_SB 1696
#define K6SB(t) ((t) == GGML_Q2_K ? PK_K2_SB : PK_K6_SB)
#define K6HDR(t) ((t) == GGML_Q2_K ? 32 : 16)
/* Q5_K: as Q4_K (1440 bytes per super-block of a group: 180 per row, the file 176) with a fifth
 * vector per block after the nibbles, H: byte 4j+k holds the codes' bit 4 of values 4t+k at bit t
 * and of values 16+4t+k at bit 4+t (t < 4). */
#define PK_K5_SB 1440
#define PK_KSB(t) ((t) == GGML_Q5_K ? PK_K5_SB : PK_K4_SB)
#define PK_NIB(t) ((t) == GGML_Q4_K || (t) == GGML_Q5_K ? 16 : 32)

/* Block b of a packed group g (Q4_1, Q8_0: fixed stride; Q4_K: within its super-block). */
static inline const uint8_t *pk_blk(uint32_t t, const uint8_t *g, int b)
{
    if (t == GGML_Q4_K) return g + (size_t)(b / 8) * PK_K4_SB + 32 + (size_t)(b % 8) * 144;
    if (t == GGML_Q5_K) return g + (size_t)(b / 8) * PK_K5_SB + 32 + (size_t)(b % 8) * 176;
    if (K6LIKE(t)) return g + (size_t)(b / 8) * K6SB(t) + K6HDR(t) + (size_t)(b % 8) * 208;
    return g + (size_t)b * PK_BLK(t);
}

/* Q4_K: row j's dl and ml of block b of packed group g (scalar, the kernels' values). */
static inline void pk_k4_scales(uint32_t t, const uint8_t *g, int b, int j, float *dl, float *ml)
{
    const uint8_t *h = g + (size_t)(b / 8) * PK_KSB(t), *blk = pk_blk(t, g, b);
    *dl = ld_f16(h + 2 * j) * (float)blk[j];
    *ml = -(ld_f16(h + 16 + 2 * j) * (float)blk[8 + j]);
}

/* Q6_K: row j's code u (0..63) of value v (0..31) of packed block blk. */
static inline int pk_k6_code(const uint8_t *blk, int j, int v)
{
    const int half = v / 16, w = v % 16, t = w / 4, k = w % 4, hh = w / 8, e = (w / 4) % 2;
    const int nib = (blk[16 + 32 * t + 4 * j + k] >> (4 * half)) & 15;
    const int top = (blk[144 + 32 * hh + 4 * j + k] >> (4 * half + 2 * e)) & 3;
    return nib | top << 4;
}

static size_t pk_group_bytes(uint32_t t, int cols)
{
    if (t == GGML_Q4_K || t == GGML_Q5_K) return (size_t)(cols / 256) * PK_KSB(t);
    if (K6LIKE(t)) return (size_t)(cols / 256) * K6SB(t);
    return t == GGML_F16 ? (size_t)cols * 16 : (size_t)(cols / QK) * PK_BLK(t);
}

size_t qpack_bytes(uint32_t type, int rows, int cols)
{
    if (!qpack_ok(type, rows, cols)) return 0;
    return (size_t)((rows + PK_ROWS - 1) / PK_ROWS) * pk_group_bytes(type, cols);
}

/* Packs group rows r0..r0+7 (rows >= nrows are zero) of row-major data into dst. */
static void pk_group(uint32_t t, int cols, size_t row_bytes, const uint8_t *data, int r0, int nrows,
                     uint8_t *dst)
{
    const uint8_t *src[PK_ROWS];
    for (int j = 0; j < PK_ROWS; j++) src[j] = r0 + j < nrows ? data + (size_t)(r0 + j) * row_bytes : NULL;
    if (t == GGML_F16) {
        for (int k = 0; k < cols; k++)
            for (int j = 0; j < PK_ROWS; j++) {
                if (src[j]) memcpy(dst + 16 * (size_t)k + 2 * j, src[j] + 2 * (size_t)k, 2);
                else memset(dst + 16 * (size_t)k + 2 * j, 0, 2);
            }
        return;
    }
    const int nb = cols / QK;
#ifdef __SSE2__
    if (t == GGML_Q4_1 && r0 + PK_ROWS <= nrows) {
        /* all 8 rows present: the quants' 8 x 4 dword transpose in registers */
        for (int b = 0; b < nb; b++) {
            uint8_t *o = dst + (size_t)b * 160;
            __m128i q[8];
            for (int j = 0; j < PK_ROWS; j++) {
                const uint8_t *s = src[j] + (size_t)b * Q4_1_BYTES;
                memcpy(o + 2 * j, s, 2);
                memcpy(o + 16 + 2 * j, s + 2, 2);
                q[j] = _mm_loadu_si128((const __m128i *)(s + 4));
            }
            for (int h = 0; h < 2; h++) {     /* rows 4h..4h+3 -> bytes 16h..16h+15 of each vector */
                const __m128i *a = q + 4 * h;
                __m128i t0 = _mm_unpacklo_epi32(a[0], a[1]), t1 = _mm_unpacklo_epi32(a[2], a[3]);
                __m128i t2 = _mm_unpackhi_epi32(a[0], a[1]), t3 = _mm_unpackhi_epi32(a[2], a[3]);
                _mm_storeu_si128((__m128i *)(o + 32 + 16 * h), _mm_unpacklo_epi64(t0, t1));
                _mm_storeu_si128((__m128i *)(o + 64 + 16 * h), _mm_unpackhi_epi64(t0, t1));
                _mm_storeu_si128((__m128i *)(o + 96 + 16 * h), _mm_unpacklo_epi64(t2, t3));
                _mm_storeu_si128((__m128i *)(o + 128 + 16 * h), _mm_unpackhi_epi64(t2, t3));
            }
        }
        return;
    }
#endif
    if (K6LIKE(t)) {
        const size_t fb = t == GGML_Q6_K ? 210 : t == GGML_Q3_K ? 110 : 84;
        const size_t doff = t == GGML_Q6_K ? 208 : t == GGML_Q3_K ? 108 : 80;
        for (int s = 0; s < nb / 8; s++) {
            uint8_t *h = dst + (size_t)s * K6SB(t);
            for (int j = 0; j < PK_ROWS; j++) {
                int8_t q[256];
                int sc[16], m[16];
                float d = 0.0f, dmin;
                if (src[j]) qk_unpack(t, src[j] + (size_t)s * fb, q, sc, m, &d, &dmin);
                else {
                    memset(q, 0, sizeof q);
                    memset(sc, 0, sizeof sc);
                }
                if (src[j]) memcpy(h + 2 * j, src[j] + (size_t)s * fb + doff, 2);
                else memset(h + 2 * j, 0, 2);
                if (t == GGML_Q2_K) {
                    if (src[j]) memcpy(h + 16 + 2 * j, src[j] + (size_t)s * fb + doff + 2, 2);
                    else memset(h + 16 + 2 * j, 0, 2);
                    if (!src[j]) memset(m, 0, sizeof m);
                }
                for (int bb = 0; bb < 8; bb++) {
                    uint8_t *o = (uint8_t *)pk_blk(t, dst, 8 * s + bb), u[32];
                    for (int v = 0; v < 32; v++) u[v] = (uint8_t)(q[32 * bb + v] + K6OFF(t));
                    if (t == GGML_Q2_K) {
                        o[j] = (uint8_t)(sc[2 * bb] | m[2 * bb] << 4);
                        o[8 + j] = (uint8_t)(sc[2 * bb + 1] | m[2 * bb + 1] << 4);
                    } else {
                        o[j] = (uint8_t)(int8_t)sc[2 * bb];
                        o[8 + j] = (uint8_t)(int8_t)sc[2 * bb + 1];
                    }
                    for (int tt = 0; tt < 4; tt++)
                        for (int k = 0; k < 4; k++)
                            o[16 + 32 * tt + 4 * j + k] = (uint8_t)((u[4 * tt + k] & 15) | (u[16 + 4 * tt + k] & 15) << 4);
                    for (int hh = 0; hh < 2; hh++)
                        for (int k = 0; k < 4; k++) {
                            uint8_t byte = 0;
                            for (int e = 0; e < 2; e++) {
                                byte |= (uint8_t)((u[8 * hh + 4 * e + k] >> 4) << (2 * e));
                                byte |= (uint8_t)((u[16 + 8 * hh + 4 * e + k] >> 4) << (4 + 2 * e));
                            }
                            o[144 + 32 * hh + 4 * j + k] = byte;
                        }
                }
            }
        }
        return;
    }
    if (t == GGML_Q5_K) {
        for (int b = 0; b < nb; b++) {
            uint8_t *h = dst + (size_t)(b / 8) * PK_K5_SB, *o = (uint8_t *)pk_blk(t, dst, b);
            for (int j = 0; j < PK_ROWS; j++) {
                int8_t q[256] = {0};
                int sc[16] = {0}, m[16] = {0};
                float d, dmin;
                uint8_t d4[4] = {0};
                if (src[j]) {
                    qk_unpack(t, src[j] + (size_t)(b / 8) * 176, q, sc, m, &d, &dmin);
                    memcpy(d4, src[j] + (size_t)(b / 8) * 176, 4);
                }
                if (b % 8 == 0) {
                    memcpy(h + 2 * j, d4, 2);
                    memcpy(h + 16 + 2 * j, d4 + 2, 2);
                }
                const int8_t *u = q + 32 * (b % 8);
                o[j] = (uint8_t)sc[b % 8];
                o[8 + j] = (uint8_t)m[b % 8];
                for (int tt = 0; tt < 4; tt++)
                    for (int k = 0; k < 4; k++) {
                        const int a = u[4 * tt + k], c = u[16 + 4 * tt + k];
                        o[16 + 32 * tt + 4 * j + k] = (uint8_t)((a & 15) | (c & 15) << 4);
                    }
                for (int k = 0; k < 4; k++) {
                    uint8_t byte = 0;
                    for (int tt = 0; tt < 4; tt++)
                        byte |= (uint8_t)(((u[4 * tt + k] >> 4) & 1) << tt | ((u[16 + 4 * tt + k] >> 4) & 1) << (4 + tt));
                    o[144 + 4 * j + k] = byte;
                }
            }
        }
        return;
    }
    for (int b = 0; b < nb; b++) {
        if (t == GGML_Q4_K) {
            uint8_t *h = dst + (size_t)(b / 8) * PK_K4_SB, *o = (uint8_t *)pk_blk(t, dst, b);
            for (int j = 0; j < PK_ROWS; j++) {
                uint8_t qs[16] = {0}, d4[4] = {0};
                int sc = 0, m = 0;
                if (src[j]) {
                    const uint8_t *sb = src[j] + (size_t)(b / 8) * 144;
                    qk_q4k_raw(sb, b % 8, &sc, &m, qs);
                    memcpy(d4, sb, 4);
                }
                if (b % 8 == 0) {
                    memcpy(h + 2 * j, d4, 2);
                    memcpy(h + 16 + 2 * j, d4 + 2, 2);
                }
                o[j] = (uint8_t)sc;
                o[8 + j] = (uint8_t)m;
                for (int v = 0; v < 4; v++) memcpy(o + 16 + 32 * v + 4 * j, qs + 4 * v, 4);
            }
        } else if (t == GGML_Q4_1) {
            uint8_t *o = dst + (size_t)b * 160;
            for (int j = 0; j < PK_ROWS; j++) {
                const uint8_t *s = src[j] ? src[j] + (size_t)b * Q4_1_BYTES : NULL;
                if (!s) {
                    memset(o + 2 * j, 0, 2);
                    memset(o + 16 + 2 * j, 0, 2);
                    for (int v = 0; v < 4; v++) memset(o + 32 + 32 * v + 4 * j, 0, 4);
                    continue;
                }
                memcpy(o + 2 * j, s, 2);
                memcpy(o + 16 + 2 * j, s + 2, 2);
                for (int v = 0; v < 4; v++) memcpy(o + 32 + 32 * v + 4 * j, s + 4 + 4 * v, 4);
            }
        } else {
            uint8_t *o = dst + (size_t)b * 272;
            for (int j = 0; j < PK_ROWS; j++) {
                const uint8_t *s = src[j] ? src[j] + (size_t)b * Q8_0_BYTES : NULL;
                if (!s) {
                    memset(o + 2 * j, 0, 2);
                    for (int v = 0; v < 8; v++) memset(o + 16 + 32 * v + 4 * j, 0x80, 4);
                    continue;
                }
                memcpy(o + 2 * j, s, 2);
                for (int v = 0; v < 8; v++) {
                    uint32_t q4;
                    memcpy(&q4, s + 2 + 4 * v, 4);
                    q4 ^= 0x80808080u;
                    memcpy(o + 16 + 32 * v + 4 * j, &q4, 4);
                }
            }
        }
    }
}

/* Short-row F16 matrices (the routed experts' down projections: 48 values per row) are
 * packed TRANSPOSED instead, in blocks of 32 rows: block b holds, for each column k, the 32
 * values W[32b .. 32b+31][k] side by side (data[((b * cols + k) * 32 + r % 32]), so one
 * block is read front to back. Their products run "row-major over outputs" (tp_mm below): 32 outputs of one
 * input row are 4 vector accumulators, each a single fma chain over k, so a row of 48
 * values costs 48 fmas per 8 outputs without per-tile reductions. Canonical order for every
 * product with such a matrix, packed or not, any n: acc = 0; for k ascending:
 * acc = fma(w_k, x_k, acc). */
#define TP_MAXCOLS 64
#define TP_ROWS 32
static int tp_shape(uint32_t type, int rows, int cols)
{
    return type == GGML_F16 && cols <= TP_MAXCOLS && rows % TP_ROWS == 0 && rows > 0;
}

static size_t tp_index(int r, int k, int cols)
{
    return ((size_t)(r / TP_ROWS) * cols + k) * TP_ROWS + r % TP_ROWS;
}

#ifdef __SSE2__
/* 8 rows x 8 values (16-bit) at src (rows sst bytes apart) -> 8 columns at dst (dst_step bytes apart). */
static inline void tr8x8_16(const uint8_t *src, size_t sst, uint8_t *dst, size_t dst_step)
{
    __m128i a[8], t[8], u[8];
    for (int i = 0; i < 8; i++) a[i] = _mm_loadu_si128((const __m128i *)(src + (size_t)i * sst));
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    /* u[0..3]: columns {0,1} {2,3} {4,5} {6,7} of rows 0-3; u[4..7]: the same of rows 4-7 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int c = 0; c < 4; c++) {
        _mm_storeu_si128((__m128i *)(dst + (size_t)(2 * c) * dst_step), _mm_unpacklo_epi64(u[c], u[4 + c]));
        _mm_storeu_si128((__m128i *)(dst + (size_t)(2 * c + 1) * dst_step), _mm_unpackhi_epi64(u[c], u[4 + c]));
    }
}
#endif

static void tp_transpose(const uint8_t *src, size_t row_bytes, int rows, int cols, uint8_t *dst)
{
    /* block by block: rows read front to back, a block's 32 x cols values written in L1;
     * 8 x 8 tiles of 16-bit values where SSE2 has them (an expert read from disk is packed
     * on every use; a scalar scatter cost as much as the read) */
    for (int b = 0; b < rows / TP_ROWS; b++) {
        uint8_t *blk = dst + 2 * (size_t)b * TP_ROWS * cols;
        int k0 = 0;
#ifdef __SSE2__
        for (; k0 + 8 <= cols; k0 += 8)
            for (int o = 0; o < TP_ROWS; o += 8)
                tr8x8_16(src + (size_t)(b * TP_ROWS + o) * row_bytes + 2 * (size_t)k0, row_bytes,
                         blk + 2 * ((size_t)k0 * TP_ROWS + o), 2 * TP_ROWS);
#endif
        for (int o = 0; o < TP_ROWS; o++) {
            const uint8_t *row = src + (size_t)(b * TP_ROWS + o) * row_bytes;
            for (int k = k0; k < cols; k++) {
                uint16_t v;
                memcpy(&v, row + 2 * k, 2);
                memcpy(blk + 2 * ((size_t)k * TP_ROWS + o), &v, 2);
            }
        }
    }
}

void qpack(const qmat *w, uint8_t *dst)
{
    if (tp_shape(w->type, w->rows, w->cols)) {
        tp_transpose(w->data, w->row_bytes, w->rows, w->cols, dst);
        return;
    }
    const size_t gb = pk_group_bytes(w->type, w->cols);
    for (int r = 0; r < w->rows; r += PK_ROWS)
        pk_group(w->type, w->cols, w->row_bytes, w->data, r, w->rows, dst + (size_t)(r / PK_ROWS) * gb);
}

void qmat_row(const qmat *w, int r, float *out)
{
    if (!w->packed) {
        dequant_row(w->type, w->data + (size_t)r * w->row_bytes, out, w->cols);
        return;
    }
    if (tp_shape(w->type, w->rows, w->cols)) {
        for (int k = 0; k < w->cols; k++) out[k] = ld_f16(w->data + 2 * tp_index(r, k, w->cols));
        return;
    }
    /* the inverse of pk_group for one row, with dequant_row's arithmetic */
    const uint8_t *g = w->data + (size_t)(r / PK_ROWS) * pk_group_bytes(w->type, w->cols);
    const int j = r % PK_ROWS, cols = w->cols;
    if (w->type == GGML_F16) {
        for (int k = 0; k < cols; k++) out[k] = ld_f16(g + 16 * (size_t)k + 2 * j);
        return;
    }
    for (int b = 0; b < cols / QK; b++) {
        float *o = out + b * QK;
        if (w->type == GGML_Q8_0) {
            const uint8_t *blk = g + (size_t)b * 272;
            const float d = ld_f16(blk + 2 * j);
            for (int v = 0; v < QK; v++) o[v] = d * (float)(int8_t)(blk[16 + 32 * (v / 4) + 4 * j + v % 4] ^ 0x80);
        } else if (w->type == GGML_Q2_K) {   /* (d * sc) * q - dmin * m, dequant_row's */
            const uint8_t *blk = pk_blk(GGML_Q2_K, g, b), *hd = g + (size_t)(b / 8) * PK_K2_SB;
            const float d = ld_f16(hd + 2 * j), dm = ld_f16(hd + 16 + 2 * j);
            for (int v = 0; v < QK; v++) {
                const uint8_t sm = blk[(v < 16 ? 0 : 8) + j];
                o[v] = d * (float)(sm & 15) * (float)pk_k6_code(blk, j, v) - dm * (float)(sm >> 4);
            }
        } else if (K6LIKE(w->type)) {   /* (d * sc) * q, dequant_row's */
            const uint8_t *blk = pk_blk(w->type, g, b);
            const float d = ld_f16(g + (size_t)(b / 8) * PK_K6_SB + 2 * j);
            const float da = d * (float)(int8_t)blk[j], db = d * (float)(int8_t)blk[8 + j];
            for (int v = 0; v < QK; v++) o[v] = (v < 16 ? da : db) * (float)(pk_k6_code(blk, j, v) - K6OFF(w->type));
        } else if (w->type == GGML_Q4_K || w->type == GGML_Q5_K) {   /* dl * q + (-ml): dequant_row's dl * q - ml */
            const uint8_t *blk = pk_blk(w->type, g, b);
            float d, m;
            pk_k4_scales(w->type, g, b, j, &d, &m);
            for (int k = 0; k < 16; k++) {
                const uint8_t byte = blk[16 + 32 * (k / 4) + 4 * j + k % 4];
                int a = byte & 15, c = byte >> 4;
                if (w->type == GGML_Q5_K) {
                    const uint8_t hb = blk[144 + 4 * j + k % 4];
                    a |= ((hb >> (k / 4)) & 1) << 4;
                    c |= ((hb >> (4 + k / 4)) & 1) << 4;
                }
                o[k] = d * (float)a + m;
                o[k + 16] = d * (float)c + m;
            }
        } else {
            const uint8_t *blk = g + (size_t)b * 160;
            const float d = ld_f16(blk + 2 * j), m = ld_f16(blk + 16 + 2 * j);
            for (int k = 0; k < 16; k++) {
                const uint8_t byte = blk[32 + 32 * (k / 4) + 4 * j + k % 4];
                o[k] = d * (float)(byte & 15) + m;
                o[k + 16] = d * (float)(byte >> 4) + m;
            }
        }
    }
}

/* Kernel: res[k * 8 * NG + g * 8 + j] = output (row j of group gp[g], input row i0 + k)
 * for g < NG, k < NX. */
#ifdef __AVX2__
FORCE_INLINE __m256i pk_dot4(__m256i acc, __m256i a, __m256i b)
{
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(acc, a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(acc, a, b);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1)));
#endif
}

/* Pointers to the int8 blocks, block scales, block sums (xs) and integer block sums (xi) of
 * input rows i0 .. i0 + NX - 1 (through x->idx when set); xs / xi may be NULL. */
FORCE_INLINE void act_rows(const qact *x, int i0, const int NX, int nb, const int8_t **xq, const float **xd,
                           const float **xs, const int32_t **xi)
{
    for (int k = 0; k < NX; k++) {
        const size_t i = (size_t)(x->idx ? x->idx[i0 + k] : i0 + k);
        xq[k] = x->q + i * (size_t)x->cols;
        xd[k] = x->qd + i * nb;
        if (xs) xs[k] = x->qs + i * nb;
        if (xi) xi[k] = x->qi + i * nb;
    }
}

/* The integer sums of one 32-byte activation block's two halves (bytes 0-15 and 16-31): the
 * offset terms of the K-quant tiles. */
FORCE_INLINE void act_half_sums(const int8_t *x32, int32_t *sa, int32_t *sb)
{
    const __m256i hs = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), _mm256_loadu_si256((const __m256i *)x32)),
                                         _mm256_set1_epi16(1));
    __m128i h4 = _mm_hadd_epi32(_mm256_castsi256_si128(hs), _mm256_extracti128_si256(hs, 1));
    h4 = _mm_hadd_epi32(h4, h4);
    *sa = _mm_cvtsi128_si32(h4);
    *sb = _mm_extract_epi32(h4, 1);
}

FORCE_INLINE __m256i bc4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm256_set1_epi32(v);
}

/* Software prefetch, PK_PFD bytes ahead in a packed matrix, into L2: a decode step streams
 * ~100 MB of weights from DRAM, and one core's hardware prefetch alone leaves it waiting on
 * memory, more so when a tile also computes for 8 rows. Measured (bench_fwd, 2 threads,
 * ~120-250 tokens of context, medians of 4-6 alternated runs): 8 slots: none 428 tok/s,
 * 4 / 8 / 16 KiB into L1 450 / 489 / 530; one slot: none 128, 16 KiB into L1 143. Then, on
 * a later build, 16 KiB into L1 vs L2: 8 slots 673 -> 728, one slot 177 -> 220 (32 KiB into
 * L2: 716 / 207). Prefetches into L1 hold its few miss buffers; into L2 more lines fly. */
#ifndef PK_PFD
#define PK_PFD 16384
#endif
#ifndef PK_HINT
#define PK_HINT _MM_HINT_T1
#endif
/* Q4_K: dl = d * sc and ml = -(dmin * m) of the 8 rows of block b of packed group g. */
FORCE_INLINE void k4_scales(uint32_t t, const uint8_t *g, int b, __m256 *dl, __m256 *ml)
{
    const uint8_t *h = g + (size_t)(b / 8) * PK_KSB(t), *blk = pk_blk(t, g, b);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 16)));
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)blk)));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 8))));
    *dl = _mm256_mul_ps(d, sc);
    *ml = _mm256_xor_ps(_mm256_mul_ps(dm, m), _mm256_set1_ps(-0.0f));
}

FORCE_INLINE void pk_q41k(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                          float *res, const int kq)
{
    const size_t NO = kq ? 16 : 32;
    const uint32_t T = kq == 2 ? GGML_Q5_K : kq ? GGML_Q4_K : GGML_Q4_1;
    const __m256i m1 = _mm256_set1_epi8(1);
    const int8_t *xq[4];
    const float *xd[4], *xs[4];
    act_rows(x, i0, NX, nb, xq, xd, xs, NULL);
    const __m256i m15 = _mm256_set1_epi8(15);
    __m256 acc[2][4];
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i is[2][4];
        for (int g = 0; g < NG; g++)
            for (int k = 0; k < NX; k++) is[g][k] = _mm256_setzero_si256();
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            if (t < 3)
                for (int g = 0; g < NG; g++) _mm_prefetch((const char *)pk_blk(T, gp[g], b) + 64 * t + PK_PFD, PK_HINT);
            for (int g = 0; g < NG; g++) {
                __m256i v = _mm256_loadu_si256((const __m256i *)(pk_blk(T, gp[g], b) + NO + 32 * t));
                lo[g] = _mm256_and_si256(v, m15);
                hi[g] = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
                if (kq == 2) {   /* Q5_K: bit 4 of the codes from the H vector */
                    const __m256i H = _mm256_loadu_si256((const __m256i *)(pk_blk(T, gp[g], b) + 144));
                    lo[g] = _mm256_or_si256(lo[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, t), m1), 4));
                    hi[g] = _mm256_or_si256(hi[g], _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(H, 4 + t), m1), 4));
                }
            }
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                __m256i xl = bc4(xk), xh = bc4(xk + 16);
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
                for (int g = 0; g < NG; g++) is[g][k] = pk_dot4(pk_dot4(is[g][k], lo[g], xl), hi[g], xh);
#else
                /* int16 partial sums over the whole block, widened once after it: a pair
                 * of products is at most 2 * 15 * 127 = 3810, eight pairs 30480 < 2^15 (Q5_K's
                 * 5-bit codes would not fit: widened at every step) */
                for (int g = 0; g < NG; g++)
                    is[g][k] = kq == 2 ? pk_dot4(pk_dot4(is[g][k], lo[g], xl), hi[g], xh)
                                       : _mm256_add_epi16(is[g][k], _mm256_add_epi16(_mm256_maddubs_epi16(lo[g], xl),
                                                                                     _mm256_maddubs_epi16(hi[g], xh)));
#endif
            }
        }
#if !((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
        if (kq != 2)
            for (int g = 0; g < NG; g++)
                for (int k = 0; k < NX; k++) is[g][k] = _mm256_madd_epi16(is[g][k], _mm256_set1_epi16(1));
#endif
        for (int g = 0; g < NG; g++) {
            const uint8_t *gb = pk_blk(T, gp[g], b);
            __m256 dw, mw;
            if (kq) k4_scales(T, gp[g], b, &dw, &mw);
            else {
                dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb));
                mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16)));
            }
            for (int k = 0; k < NX; k++) {
                __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[k][b]));
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[g][k]), s, acc[g][k]);
                acc[g][k] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[k][b]), acc[g][k]);
            }
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

/* Q6_K tile (layout at PK_K6_SB): per block the two halves' exact sums (vpdpbusd of the codes),
 * the offset 32 and the int8 scales applied in int32, then Q4_1's float step. */
FORCE_INLINE void pk_q6k_o(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                           float *res, const uint32_t T)
{
    const int off = K6OFF(T), k2 = T == GGML_Q2_K;
    const int8_t *xq[4];
    const float *xd[4];
    act_rows(x, i0, NX, nb, xq, xd, NULL, NULL);
    const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    __m256 acc[2][4];
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    __m256 dv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, mv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int b = 0; b < nb; b++) {
        if (b % 8 == 0)
            for (int g = 0; g < NG; g++)
            {
                dv[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + (size_t)(b / 8) * K6SB(T))));
                if (k2) mv[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + (size_t)(b / 8) * K6SB(T) + 16)));
            }
        __m256i ia[2][4], ib[2][4];
        for (int g = 0; g < NG; g++)
            for (int k = 0; k < NX; k++) ia[g][k] = ib[g][k] = _mm256_setzero_si256();
        const uint8_t *bp[2];
        __m256i H[2][2];
        for (int g = 0; g < NG; g++) {
            bp[g] = pk_blk(T, gp[g], b);
            _mm_prefetch((const char *)bp[g] + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 64 + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 128 + PK_PFD, PK_HINT);
            for (int hh = 0; hh < 2; hh++) H[g][hh] = _mm256_loadu_si256((const __m256i *)(bp[g] + 144 + 32 * hh));
        }
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            for (int g = 0; g < NG; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(bp[g] + 16 + 32 * t));
                const __m256i h = _mm256_srli_epi16(H[g][t / 2], 2 * (t % 2));
                lo[g] = _mm256_or_si256(_mm256_and_si256(v, m15), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
                hi[g] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v, 4), m15),
                                        _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
            }
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                const __m256i xl = bc4(xk), xh = bc4(xk + 16);
                for (int g = 0; g < NG; g++) {
                    ia[g][k] = pk_dot4(ia[g][k], lo[g], xl);
                    ib[g][k] = pk_dot4(ib[g][k], hi[g], xh);
                }
            }
        }
        for (int k = 0; k < NX; k++) {
            int32_t sa, sb;
            act_half_sums(xq[k] + (size_t)b * QK, &sa, &sb);
            const __m256i oa = _mm256_set1_epi32(off * sa), ob = _mm256_set1_epi32(off * sb);
            const __m256 xs = _mm256_set1_ps(xd[k][b]);
            for (int g = 0; g < NG; g++) {
                __m256i sca, scb;
                if (k2) {
                    const __m256i ra = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bp[g]));
                    const __m256i rb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bp[g] + 8)));
                    sca = _mm256_and_si256(ra, _mm256_set1_epi32(15));
                    scb = _mm256_and_si256(rb, _mm256_set1_epi32(15));
                    const __m256i ms = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_srli_epi32(ra, 4), _mm256_set1_epi32(sa)),
                                                        _mm256_mullo_epi32(_mm256_srli_epi32(rb, 4), _mm256_set1_epi32(sb)));
                    const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(ia[g][k], sca), _mm256_mullo_epi32(ib[g][k], scb));
                    acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv[g], xs), acc[g][k]);
                    acc[g][k] = _mm256_fmadd_ps(_mm256_xor_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(-0.0f)),
                                                _mm256_mul_ps(mv[g], xs), acc[g][k]);
                    continue;
                }
                sca = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)bp[g]));
                scb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(bp[g] + 8)));
                const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(ia[g][k], oa), sca),
                                                    _mm256_mullo_epi32(_mm256_sub_epi32(ib[g][k], ob), scb));
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv[g], xs), acc[g][k]);
            }
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

#define pk_q6k(gp, NG, x, i0, NX, nb, res) pk_q6k_o(gp, NG, x, i0, NX, nb, res, GGML_Q6_K)
#define pk_q3k(gp, NG, x, i0, NX, nb, res) pk_q6k_o(gp, NG, x, i0, NX, nb, res, GGML_Q3_K)
#define pk_q2k(gp, NG, x, i0, NX, nb, res) pk_q6k_o(gp, NG, x, i0, NX, nb, res, GGML_Q2_K)
#define pk_q41(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 0)
#define pk_q4k(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 1)
#define pk_q5k(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 2)

FORCE_INLINE void pk_q80(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                         float *res)
{
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xi[4];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    __m256 acc[2][4];
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        __m256i is[2][4];
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
        /* sum (w + 128) x - 128 sum x: exact, no sign fix-ups */
        for (int k = 0; k < NX; k++) {
            __m256i c = _mm256_set1_epi32(-128 * xi[k][b]);
            for (int g = 0; g < NG; g++) is[g][k] = c;
        }
        for (int t = 0; t < 8; t++) {
            __m256i u[2];
            if (t < 5)
                for (int g = 0; g < NG; g++) _mm_prefetch((const char *)gp[g] + (size_t)b * 272 + 64 * t + PK_PFD, PK_HINT);
            for (int g = 0; g < NG; g++)
                u[g] = _mm256_loadu_si256((const __m256i *)(gp[g] + (size_t)b * 272 + 16 + 32 * t));
            for (int k = 0; k < NX; k++) {
                __m256i xb = bc4(xq[k] + (size_t)b * QK + 4 * t);
                for (int g = 0; g < NG; g++) is[g][k] = pk_dot4(is[g][k], u[g], xb);
            }
        }
#else
        /* maddubs would saturate on (w + 128) x: signed weights, sign trick */
        (void)xi;
        for (int g = 0; g < NG; g++)
            for (int k = 0; k < NX; k++) is[g][k] = _mm256_setzero_si256();
        for (int t = 0; t < 8; t++) {
            __m256i w[2], a[2];
            for (int g = 0; g < NG; g++) {
                w[g] = _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(gp[g] + (size_t)b * 272 + 16 + 32 * t)),
                                        _mm256_set1_epi8((char)0x80));
                a[g] = _mm256_sign_epi8(w[g], w[g]);
            }
            for (int k = 0; k < NX; k++) {
                __m256i xb = bc4(xq[k] + (size_t)b * QK + 4 * t);
                for (int g = 0; g < NG; g++) is[g][k] = pk_dot4(is[g][k], a[g], _mm256_sign_epi8(xb, w[g]));
            }
        }
#endif
        for (int g = 0; g < NG; g++) {
            __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + (size_t)b * 272)));
            for (int k = 0; k < NX; k++) {
                __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[k][b]));
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[g][k]), s, acc[g][k]);
            }
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

FORCE_INLINE void pk_f16(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int cols,
                         float *res)
{
    const float *xf[4];
    for (int k = 0; k < NX; k++) xf[k] = x->f + (size_t)(x->idx ? x->idx[i0 + k] : i0 + k) * cols;
    __m256 e[2][4], o[2][4];
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) e[g][k] = o[g][k] = _mm256_setzero_ps();
    int c = 0;
    for (; c + 2 <= cols; c += 2) {
        __m256 w0[2], w1[2];
        for (int g = 0; g < NG; g++) {
            w0[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + 16 * (size_t)c)));
            w1[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + 16 * (size_t)c + 16)));
        }
        for (int k = 0; k < NX; k++) {
            __m256 x0 = _mm256_broadcast_ss(xf[k] + c);
            __m256 x1 = _mm256_broadcast_ss(xf[k] + c + 1);
            for (int g = 0; g < NG; g++) {
                e[g][k] = _mm256_fmadd_ps(w0[g], x0, e[g][k]);
                o[g][k] = _mm256_fmadd_ps(w1[g], x1, o[g][k]);
            }
        }
    }
    if (c < cols)
        for (int g = 0; g < NG; g++) {
            __m256 w0 = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + 16 * (size_t)c)));
            for (int k = 0; k < NX; k++)
                e[g][k] = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(xf[k] + c), e[g][k]);
        }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, _mm256_add_ps(e[g][k], o[g][k]));
}

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
/* Two groups (16 rows) in one 512-bit register: the same per-lane operations and order as
 * pk_q41 / pk_q80 with NG = 2 (bit-identical), half the instructions, and registers for 8
 * input rows, so a batch of 8 unpacks each weight vector once. */
#define PK_ZMM 1
FORCE_INLINE __m512i z_load2(const uint8_t *a, const uint8_t *b)
{
    return _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)a)),
                              _mm256_loadu_si256((const __m256i *)b), 1);
}

FORCE_INLINE __m512 z_half2(const uint8_t *a, const uint8_t *b)
{
    return _mm512_cvtph_ps(_mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                                   _mm_loadu_si128((const __m128i *)b), 1));
}

FORCE_INLINE __m512 z_join(__m256 a, __m256 b)
{
    return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(a)), _mm256_castps_pd(b), 1));
}

FORCE_INLINE __m512i z_bc4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

FORCE_INLINE void pkz_q41k(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res, const int kq)
{
    const size_t NO = kq ? 16 : 32;
    const uint32_t T = kq == 2 ? GGML_Q5_K : kq ? GGML_Q4_K : GGML_Q4_1;
    const __m512i m1 = _mm512_set1_epi8(1);
    const int8_t *xq[8];
    const float *xd[8], *xs[8];
    act_rows(x, i0, NX, nb, xq, xd, xs, NULL);
    const __m512i m15 = _mm512_set1_epi8(15);
    __m512 acc[8];
    for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *b0 = pk_blk(T, gp[0], b), *b1 = pk_blk(T, gp[1], b);
        __m512i is[8];
        for (int k = 0; k < NX; k++) is[k] = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            if (t < 3) {
                _mm_prefetch((const char *)b0 + 64 * t + PK_PFD, PK_HINT);
                _mm_prefetch((const char *)b1 + 64 * t + PK_PFD, PK_HINT);
            }
            const __m512i v = z_load2(b0 + NO + 32 * t, b1 + NO + 32 * t);
            __m512i lo = _mm512_and_si512(v, m15), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
            if (kq == 2) {
                const __m512i H = z_load2(b0 + 144, b1 + 144);
                lo = _mm512_or_si512(lo, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, t), m1), 4));
                hi = _mm512_or_si512(hi, _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(H, 4 + t), m1), 4));
            }
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                is[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(is[k], lo, z_bc4(xk)), hi, z_bc4(xk + 16));
            }
        }
        __m512 dw, mw;
        if (kq) {
            __m256 d0, m0, d1, m1_;
            k4_scales(T, gp[0], b, &d0, &m0);
            k4_scales(T, gp[1], b, &d1, &m1_);
            dw = z_join(d0, d1);
            mw = z_join(m0, m1_);
        } else {
            dw = z_half2(b0, b1);
            mw = z_half2(b0 + 16, b1 + 16);
        }
        for (int k = 0; k < NX; k++) {
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xd[k][b]));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[k]), sc, acc[k]);
            acc[k] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[k][b]), acc[k]);
        }
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}

#define pkz_q41(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 0)
#define pkz_q4k(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 1)
#define pkz_q5k(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 2)

/* pk_q6k_o with NG = 2 in 512-bit registers (bit-identical), up to 8 input rows. */
FORCE_INLINE void pkz_q6k_o(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res,
                            const uint32_t T)
{
    const int off = K6OFF(T), k2 = T == GGML_Q2_K;
    const int8_t *xq[8];
    const float *xd[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, NULL);
    const __m512i m15 = _mm512_set1_epi8(15), m3 = _mm512_set1_epi8(3);
    __m512 acc[8];
    for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_ps();
    __m512 dv = _mm512_setzero_ps(), mv = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (b % 8 == 0) {
            const uint8_t *h0 = gp[0] + (size_t)(b / 8) * K6SB(T), *h1 = gp[1] + (size_t)(b / 8) * K6SB(T);
            dv = z_half2(h0, h1);
            if (k2) mv = z_half2(h0 + 16, h1 + 16);
        }
        const uint8_t *b0 = pk_blk(T, gp[0], b), *b1 = pk_blk(T, gp[1], b);
        _mm_prefetch((const char *)b0 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)b1 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)b0 + 128 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)b1 + 128 + PK_PFD, PK_HINT);
        const __m512i H0 = z_load2(b0 + 144, b1 + 144), H1 = z_load2(b0 + 176, b1 + 176);
        __m512i ia[8], ib[8];
        for (int k = 0; k < NX; k++) ia[k] = ib[k] = _mm512_setzero_si512();
        for (int t = 0; t < 4; t++) {
            const __m512i v = z_load2(b0 + 16 + 32 * t, b1 + 16 + 32 * t);
            const __m512i h = _mm512_srli_epi16(t < 2 ? H0 : H1, 2 * (t % 2));
            const __m512i lo = _mm512_or_si512(_mm512_and_si512(v, m15), _mm512_slli_epi16(_mm512_and_si512(h, m3), 4));
            const __m512i hi = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(v, 4), m15),
                                               _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(h, 4), m3), 4));
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                ia[k] = _mm512_dpbusd_epi32(ia[k], lo, z_bc4(xk));
                ib[k] = _mm512_dpbusd_epi32(ib[k], hi, z_bc4(xk + 16));
            }
        }
        const __m128i ra8 = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)b0), _mm_loadl_epi64((const __m128i *)b1));
        const __m128i rb8 = _mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(b0 + 8)), _mm_loadl_epi64((const __m128i *)(b1 + 8)));
        __m512i sca, scb, ma = _mm512_setzero_si512(), mb = _mm512_setzero_si512();
        if (k2) {
            const __m512i ra = _mm512_cvtepu8_epi32(ra8), rb = _mm512_cvtepu8_epi32(rb8);
            sca = _mm512_and_si512(ra, _mm512_set1_epi32(15));
            scb = _mm512_and_si512(rb, _mm512_set1_epi32(15));
            ma = _mm512_srli_epi32(ra, 4);
            mb = _mm512_srli_epi32(rb, 4);
        } else {
            sca = _mm512_cvtepi8_epi32(ra8);
            scb = _mm512_cvtepi8_epi32(rb8);
        }
        for (int k = 0; k < NX; k++) {
            int32_t sa, sb;
            act_half_sums(xq[k] + (size_t)b * QK, &sa, &sb);
            const __m512 xs = _mm512_set1_ps(xd[k][b]);
            const __m512i is = _mm512_add_epi32(
                _mm512_mullo_epi32(_mm512_sub_epi32(ia[k], _mm512_set1_epi32(off * sa)), sca),
                _mm512_mullo_epi32(_mm512_sub_epi32(ib[k], _mm512_set1_epi32(off * sb)), scb));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, xs), acc[k]);
            if (k2) {
                const __m512i ms = _mm512_add_epi32(_mm512_mullo_epi32(ma, _mm512_set1_epi32(sa)),
                                                    _mm512_mullo_epi32(mb, _mm512_set1_epi32(sb)));
                acc[k] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_cvtepi32_ps(ms)),
                                                                              _mm512_set1_epi32((int)0x80000000u))),
                                         _mm512_mul_ps(mv, xs), acc[k]);
            }
        }
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}
#define pkz_q6k(gp, x, i0, NX, nb, res) pkz_q6k_o(gp, x, i0, NX, nb, res, GGML_Q6_K)
#define pkz_q3k(gp, x, i0, NX, nb, res) pkz_q6k_o(gp, x, i0, NX, nb, res, GGML_Q3_K)
#define pkz_q2k(gp, x, i0, NX, nb, res) pkz_q6k_o(gp, x, i0, NX, nb, res, GGML_Q2_K)

FORCE_INLINE void pkz_q80(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res)
{
    const int8_t *xq[8];
    const float *xd[8];
    const int32_t *xi[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    __m512 acc[8];
    for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *b0 = gp[0] + (size_t)b * 272, *b1 = gp[1] + (size_t)b * 272;
        __m512i is[8];
        for (int k = 0; k < NX; k++) is[k] = _mm512_set1_epi32(-128 * xi[k][b]);
        for (int t = 0; t < 8; t++) {
            if (t < 5) {
                _mm_prefetch((const char *)b0 + 64 * t + PK_PFD, PK_HINT);
                _mm_prefetch((const char *)b1 + 64 * t + PK_PFD, PK_HINT);
            }
            const __m512i u = z_load2(b0 + 16 + 32 * t, b1 + 16 + 32 * t);
            for (int k = 0; k < NX; k++) is[k] = _mm512_dpbusd_epi32(is[k], u, z_bc4(xq[k] + (size_t)b * QK + 4 * t));
        }
        const __m512 dw = z_half2(b0, b1);
        for (int k = 0; k < NX; k++)
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[k]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[k][b])), acc[k]);
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}
#endif

#else /* portable: the same canonical order with scalar fmaf */

static int pk_wval(uint32_t t, const uint8_t *blk, int j, int v)
{
    if (K6LIKE(t)) return pk_k6_code(blk, j, v) - K6OFF(t);
    if (t == GGML_Q4_1 || t == GGML_Q4_K || t == GGML_Q5_K) {
        uint8_t byte = blk[PK_NIB(t) + 32 * ((v % 16) / 4) + 4 * j + v % 4];
        int c = v < 16 ? byte & 15 : byte >> 4;
        if (t == GGML_Q5_K) c |= ((blk[144 + 4 * j + v % 4] >> ((v % 16) / 4 + (v < 16 ? 0 : 4))) & 1) << 4;
        return c;
    }
    return (int8_t)(blk[16 + 32 * (v / 4) + 4 * j + v % 4] ^ 0x80);
}

static void pk_scalar(uint32_t t, const uint8_t *const *gp, int NG, const qact *x, int i0, int NX, int cols,
                      float *res)
{
    const int nb = cols / QK;
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++)
            for (int j = 0; j < PK_ROWS; j++) {
                const size_t xi = (size_t)(x->idx ? x->idx[i0 + k] : i0 + k);
                float r;
                if (t == GGML_F16) {
                    const float *xf = x->f + xi * cols;
                    float e = 0.0f, o = 0.0f;
                    for (int c = 0; c < cols; c++) {
                        float w = ld_f16(gp[g] + 16 * (size_t)c + 2 * j);
                        if (c % 2 == 0) e = fmaf(w, xf[c], e);
                        else o = fmaf(w, xf[c], o);
                    }
                    r = e + o;
                } else {
                    const int8_t *xq = x->q + xi * cols;
                    const float *xd = x->qd + xi * nb, *xs = x->qs + xi * nb;
                    float acc = 0.0f;
                    for (int b = 0; b < nb; b++) {
                        const uint8_t *blk = pk_blk(t, gp[g], b);
                        int32_t is = 0;
                        if (K6LIKE(t)) {
                            int32_t sa = 0, sb = 0;
                            for (int v = 0; v < QK; v++) {
                                const int32_t p = pk_wval(t, blk, j, v) * xq[b * QK + v];
                                if (v < 16) sa += p;
                                else sb += p;
                            }
                            const uint8_t *hd = gp[g] + (size_t)(b / 8) * K6SB(t);
                            const float d = ld_f16(hd + 2 * j);
                            if (t == GGML_Q2_K) {
                                int32_t xa = 0, xb2 = 0;
                                for (int v = 0; v < 16; v++) {
                                    xa += xq[b * QK + v];
                                    xb2 += xq[b * QK + 16 + v];
                                }
                                is = (blk[j] & 15) * sa + (blk[8 + j] & 15) * sb;
                                acc = fmaf((float)is, d * xd[b], acc);
                                const int32_t ms = (blk[j] >> 4) * xa + (blk[8 + j] >> 4) * xb2;
                                acc = fmaf(-(float)ms, ld_f16(hd + 16 + 2 * j) * xd[b], acc);
                                continue;
                            }
                            is = (int8_t)blk[j] * sa + (int8_t)blk[8 + j] * sb;
                            acc = fmaf((float)is, d * xd[b], acc);
                            continue;
                        }
                        for (int v = 0; v < QK; v++) is += pk_wval(t, blk, j, v) * xq[b * QK + v];
                        if (t == GGML_Q4_K || t == GGML_Q5_K) {
                            float dl, ml;
                            pk_k4_scales(t, gp[g], b, j, &dl, &ml);
                            acc = fmaf((float)is, dl * xd[b], acc);
                            acc = fmaf(ml, xs[b], acc);
                            continue;
                        }
                        acc = fmaf((float)is, ld_f16(blk + 2 * j) * xd[b], acc);
                        if (t == GGML_Q4_1) acc = fmaf(ld_f16(blk + 16 + 2 * j), xs[b], acc);
                    }
                    r = acc;
                }
                res[k * 8 * NG + g * 8 + j] = r;
            }
}
#define pk_q41(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q4_1, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q4k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q4_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q5k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q5_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q6k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q6_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q3k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q3_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q2k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q2_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q80(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q8_0, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_f16(gp, NG, x, i0, NX, cols, res) pk_scalar(GGML_F16, gp, NG, x, i0, NX, cols, res)
#endif

#ifdef PK_ZMM
#define PK_NX 8     /* input rows of a 16-row tile (zmm kernels); a single group takes 4 */
#else
#define PK_NX 4
#endif
/* One tile: NG (1, 2) groups x NX (1..PK_NX; at most 4 unless the zmm kernels take it) input rows. */
static void pk_tile(uint32_t t, const uint8_t *const *gp, int NG, const qact *x, int i0, int NX, float *res)
{
    const int cols = x->cols, nb = cols / QK;
#define PK_CASE(KERN, LEN)                                                                  \
    switch (NG * 8 + NX) {                                                                  \
    case 9: KERN(gp, 1, x, i0, 1, LEN, res); break;                                         \
    case 10: KERN(gp, 1, x, i0, 2, LEN, res); break;                                        \
    case 11: KERN(gp, 1, x, i0, 3, LEN, res); break;                                        \
    case 12: KERN(gp, 1, x, i0, 4, LEN, res); break;                                        \
    case 17: KERN(gp, 2, x, i0, 1, LEN, res); break;                                        \
    case 18: KERN(gp, 2, x, i0, 2, LEN, res); break;                                        \
    case 19: KERN(gp, 2, x, i0, 3, LEN, res); break;                                        \
    default: KERN(gp, 2, x, i0, 4, LEN, res); break;                                        \
    }
#ifdef PK_ZMM
#define PKZ_CASE(KERN)                                                                      \
    switch (NX) {                                                                           \
    case 1: KERN(gp, x, i0, 1, nb, res); break;                                             \
    case 2: KERN(gp, x, i0, 2, nb, res); break;                                             \
    case 3: KERN(gp, x, i0, 3, nb, res); break;                                             \
    case 4: KERN(gp, x, i0, 4, nb, res); break;                                             \
    case 5: KERN(gp, x, i0, 5, nb, res); break;                                             \
    case 6: KERN(gp, x, i0, 6, nb, res); break;                                             \
    case 7: KERN(gp, x, i0, 7, nb, res); break;                                             \
    default: KERN(gp, x, i0, 8, nb, res); break;                                            \
    }
    if (NG == 2 && t == GGML_Q4_1) { PKZ_CASE(pkz_q41) return; }
    if (NG == 2 && t == GGML_Q4_K) { PKZ_CASE(pkz_q4k) return; }
    if (NG == 2 && t == GGML_Q5_K) { PKZ_CASE(pkz_q5k) return; }
    /* the Q6_K-layout types take the 512-bit tile only for more than 4 input rows: with fewer it
     * measured slower than two 256-bit groups (decode of the bench shape: 3.4 vs 2.3 ms per token) */
    if (NG == 2 && NX > 4 && t == GGML_Q6_K) { PKZ_CASE(pkz_q6k) return; }
    if (NG == 2 && NX > 4 && t == GGML_Q3_K) { PKZ_CASE(pkz_q3k) return; }
    if (NG == 2 && NX > 4 && t == GGML_Q2_K) { PKZ_CASE(pkz_q2k) return; }
    if (NG == 2 && t == GGML_Q8_0) { PKZ_CASE(pkz_q80) return; }
#undef PKZ_CASE
#endif
    if (t == GGML_Q4_1) { PK_CASE(pk_q41, nb) }
    else if (t == GGML_Q4_K) { PK_CASE(pk_q4k, nb) }
    else if (t == GGML_Q5_K) { PK_CASE(pk_q5k, nb) }
    else if (t == GGML_Q6_K) { PK_CASE(pk_q6k, nb) }
    else if (t == GGML_Q3_K) { PK_CASE(pk_q3k, nb) }
    else if (t == GGML_Q2_K) { PK_CASE(pk_q2k, nb) }
    else if (t == GGML_Q8_0) { PK_CASE(pk_q80, nb) }
    else { PK_CASE(pk_f16, cols) }
#undef PK_CASE
}

/* Per-thread buffer for packing unpacked matrices on the fly. */
static _Thread_local uint8_t *pk_buf;
static _Thread_local size_t pk_cap;

static uint8_t *pk_scratch(size_t bytes)
{
    if (bytes > pk_cap) {
        free(pk_buf);
        pk_buf = alloc64(bytes);
        pk_cap = pk_buf ? bytes : 0;
    }
    return pk_buf;
}

/* Group pointer of rows r..r+7 of w: in place when packed, else packed into buf. */
static const uint8_t *pk_get(const qmat *w, int r, uint8_t *buf)
{
    const size_t gb = pk_group_bytes(w->type, w->cols);
    if (w->packed) return w->data + (size_t)(r / PK_ROWS) * gb;
    pk_group(w->type, w->cols, w->row_bytes, w->data, r, w->rows, buf);
    return buf;
}


/* Rows [r0, r1) of a packable job (r0 a multiple of 8). */
static int mm_rows_packed(const mm_job *j, int r0, int r1)
{
    const qmat *w = j->w, *w2 = j->w2;
    const int n = j->x->n, rows = w->rows;
    const size_t st = (size_t)j->out_stride, gb = pk_group_bytes(w->type, w->cols);
    uint8_t *buf = NULL;
    if (!w->packed || (w2 && !w2->packed)) {
        buf = pk_scratch(4 * gb);
        if (!buf) return -1;
    }
    float a[PK_NX * 16], b[PK_NX * 16];
    for (int r = r0; r < r1; r += 2 * PK_ROWS) {
        const int ng = r1 - r > PK_ROWS ? 2 : 1;
        const uint8_t *g1[2], *g2[2];
        for (int g = 0; g < ng; g++) {
            g1[g] = pk_get(w, r + g * PK_ROWS, buf ? buf + g * gb : NULL);
            if (w2) g2[g] = pk_get(w2, r + g * PK_ROWS, buf ? buf + (2 + g) * gb : NULL);
        }
        const int nr = (rows - r < ng * PK_ROWS ? rows - r : ng * PK_ROWS);
        /* F16 with 2 groups keeps 4 accumulators per input row: at most 2 rows a tile */
        int nxmax = w->type == GGML_F16 && ng == 2 ? 2 : 4;
#ifdef PK_ZMM
        if (ng == 2 && w->type != GGML_F16) nxmax = PK_NX;
#endif
        for (int i0 = 0; i0 < n; i0 += nxmax) {
            const int nx = n - i0 < nxmax ? n - i0 : nxmax;
            pk_tile(w->type, g1, ng, j->x, i0, nx, a);
            if (w2) pk_tile(w2->type, g2, ng, j->x, i0, nx, b);
            for (int k = 0; k < nx; k++) {
                float *o = j->out + (size_t)(i0 + k) * st + r;
                const float *ak = a + k * 8 * ng, *bk = b + k * 8 * ng;
                if (w2) {
                    int q = 0;
#ifdef __AVX2__
                    for (; q + 8 <= nr; q += 8)
                        _mm256_storeu_ps(o + q, qsilu_mul_v(_mm256_loadu_ps(ak + q), _mm256_loadu_ps(bk + q)));
#endif
                    for (; q < nr; q++) o[q] = qsilu_mul(ak[q], bk[q]);
                }
                else {
                    int q = 0;
#ifdef __AVX2__
                    /* inline stores: a libc memcpy call per 64 bytes showed as 2 % of a batched step */
                    for (; q + 8 <= nr; q += 8) _mm256_storeu_ps(o + q, _mm256_loadu_ps(ak + q));
#endif
                    for (; q < nr; q++) o[q] = ak[q];
                }
            }
        }
    }
    return 0;
}

/* ---- matrix x rows ------------------------------------------------------------------- */

#define PAR_MIN_WORK (1L << 15)    /* multiply-adds below which threads cost more than they give */
#define CHUNK_WORK (1L << 17)      /* multiply-adds per chunk (at least one weight row) */


typedef void (*qkern)(const uint8_t *, const qact *, int, int, int, float *);

/* One weight row r against all x rows: res[i] for i < n (n values written). */
static inline void row_all(const qmat *w, const qact *x, qkern kern, int r, float *res)
{
    const uint8_t *wr = w->data + (size_t)r * w->row_bytes;
    const int n = x->n, cols = w->cols;
    if (kern) {
        for (int i = 0; i < n; i += QDOT_MAX) {
            int nx = n - i < QDOT_MAX ? n - i : QDOT_MAX;
            kern(wr, x, i, nx, cols / QK, res + i);
        }
    } else if (w->type == GGML_F32) {
        for (int i = 0; i < n; i++) res[i] = dot_f32((const float *)(const void *)wr, x->f + (size_t)i * cols, cols);
    } else {
        for (int i = 0; i < n; i += 4) dot_f16_n(wr, x->f + (size_t)i * cols, (size_t)cols, n - i < 4 ? n - i : 4, cols, res + i);
    }
}

#define QDOT_K(name, T)                                                                     \
    static void name(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)   \
    {                                                                                       \
        qk_dot(T, w, x, i0, nx, nb, res);                                                   \
    }
QDOT_K(qdot_q2_k, GGML_Q2_K)
QDOT_K(qdot_q3_k, GGML_Q3_K)
QDOT_K(qdot_q4_k, GGML_Q4_K)
QDOT_K(qdot_q5_k, GGML_Q5_K)
QDOT_K(qdot_q6_k, GGML_Q6_K)
QDOT_K(qdot_bf16, GGML_BF16)

static qkern kern_for(uint32_t t)
{
    switch (t) {
    case GGML_Q8_0: return qdot_q8_0;
    case GGML_Q4_0: return qdot_q4_0;
    case GGML_Q4_1: return qdot_q4_1;
    case GGML_Q5_0: return qdot_q5_0;
    case GGML_Q5_1: return qdot_q5_1;
    case GGML_Q2_K: return qdot_q2_k;
    case GGML_Q3_K: return qdot_q3_k;
    case GGML_Q4_K: return qdot_q4_k;
    case GGML_Q5_K: return qdot_q5_k;
    case GGML_Q6_K: return qdot_q6_k;
    case GGML_BF16: return qdot_bf16;
    default: return NULL;
    }
}

static int job_packed(const mm_job *j)
{
    return qpack_ok(j->w->type, j->w->rows, j->w->cols) && (!j->w2 || j->w2->type == j->w->type);
}

static void mm_rows_exact(const mm_job *j, int r0, int r1);

/* out[i * ost + o] for o < 32, i < NX (1 .. TP_NX): the 32 outputs of one transposed block wt
 * (cols x 32 values) against float input rows xs[i]. With AVX-512 one block's 32 weights of a
 * column are two registers, converted once for up to 8 input rows (same fma per lane). */
#ifdef __AVX512F__
#define TP_NX 8
#else
#define TP_NX 2
#endif
static inline __attribute__((always_inline)) void tp_tile(const uint8_t *wt, int cols, const float *const *xs,
                                                          const int NX, float *out, size_t ost)
{
#if defined(__AVX512F__)
    __m512 acc[TP_NX][2];
    for (int i = 0; i < NX; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k++) {
        const uint8_t *wk = wt + 2 * (size_t)k * TP_ROWS;
        const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wk));
        const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wk + 32)));
        for (int i = 0; i < NX; i++) {
            const __m512 xb = _mm512_set1_ps(xs[i][k]);
            acc[i][0] = _mm512_fmadd_ps(w0, xb, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(w1, xb, acc[i][1]);
        }
    }
    for (int i = 0; i < NX; i++) {
        _mm512_storeu_ps(out + (size_t)i * ost, acc[i][0]);
        _mm512_storeu_ps(out + (size_t)i * ost + 16, acc[i][1]);
    }
#elif defined(__AVX2__)
    __m256 acc[2][4];
    for (int i = 0; i < NX; i++)
        for (int c = 0; c < 4; c++) acc[i][c] = _mm256_setzero_ps();
    for (int k = 0; k < cols; k++) {
        const uint8_t *wk = wt + 2 * (size_t)k * TP_ROWS;
        __m256 w[4];
        for (int c = 0; c < 4; c++) w[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wk + 16 * c)));
        for (int i = 0; i < NX; i++) {
            const __m256 xb = _mm256_broadcast_ss(xs[i] + k);
            for (int c = 0; c < 4; c++) acc[i][c] = _mm256_fmadd_ps(w[c], xb, acc[i][c]);
        }
    }
    for (int i = 0; i < NX; i++)
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + (size_t)i * ost + 8 * c, acc[i][c]);
#else
    for (int i = 0; i < NX; i++)
        for (int o = 0; o < TP_ROWS; o++) {
            float a = 0.0f;
            for (int k = 0; k < cols; k++) a = fmaf(ld_f16(wt + 2 * ((size_t)k * TP_ROWS + o)), xs[i][k], a);
            out[(size_t)i * ost + o] = a;
        }
#endif
}

/* tp_tile for nx (1 .. TP_NX) input rows, each NX a compile-time constant. */
static void tp_tiles(const uint8_t *wt, int cols, const float *const *xs, int nx, float *out, size_t ost)
{
    switch (nx) {
    case 1: tp_tile(wt, cols, xs, 1, out, ost); break;
#if TP_NX > 2
    case 2: tp_tile(wt, cols, xs, 2, out, ost); break;
    case 3: tp_tile(wt, cols, xs, 3, out, ost); break;
    case 4: tp_tile(wt, cols, xs, 4, out, ost); break;
    case 5: tp_tile(wt, cols, xs, 5, out, ost); break;
    case 6: tp_tile(wt, cols, xs, 6, out, ost); break;
    case 7: tp_tile(wt, cols, xs, 7, out, ost); break;
#endif
    default: tp_tile(wt, cols, xs, TP_NX, out, ost); break;
    }
}

/* Rows [r0, r1) (multiples of TP_ROWS) of a job whose matrix has tp_shape. Unpacked matrices
 * are transposed chunk by chunk into a per-thread buffer: the same products either way. */
static int mm_rows_tp(const mm_job *j, int r0, int r1)
{
    const int n = j->x->n, cols = j->x->cols, nr = r1 - r0;
    const size_t st = (size_t)j->out_stride, bb = 2 * (size_t)TP_ROWS * cols;   /* bytes per block */
    const qmat *ws[2] = {j->w, j->w2};
    const uint8_t *wt[2] = {NULL, NULL};
    uint8_t *buf = NULL;
    for (int m = 0; m < (j->w2 ? 2 : 1); m++) {
        if (ws[m]->packed) {
            wt[m] = ws[m]->data + (size_t)(r0 / TP_ROWS) * bb;
        } else {
            if (!buf) buf = pk_scratch(2 * (size_t)nr * cols * 2);
            if (!buf) return -1;
            uint8_t *t = buf + (size_t)m * nr * cols * 2;
            tp_transpose(ws[m]->data + (size_t)r0 * ws[m]->row_bytes, ws[m]->row_bytes, nr, cols, t);
            wt[m] = t;
        }
    }
    float a[TP_NX * TP_ROWS], b[TP_NX * TP_ROWS];
    for (int r = 0; r < nr; r += TP_ROWS) {
        const size_t off = (size_t)(r / TP_ROWS) * bb;
        for (int i0 = 0; i0 < n; i0 += TP_NX) {
            const int nx = n - i0 < TP_NX ? n - i0 : TP_NX;
            const float *xs[TP_NX];
            for (int k = 0; k < nx; k++) {
                const int i = i0 + k;
                xs[k] = j->x->f + (size_t)(j->x->idx ? j->x->idx[i] : i) * cols;
            }
            if (!j->w2) {
                tp_tiles(wt[0] + off, cols, xs, nx, j->out + (size_t)i0 * st + r0 + r, st);
                continue;
            }
            tp_tiles(wt[0] + off, cols, xs, nx, a, TP_ROWS);
            tp_tiles(wt[1] + off, cols, xs, nx, b, TP_ROWS);
            for (int k = 0; k < nx; k++)
                for (int q = 0; q < TP_ROWS; q++)
                    j->out[(size_t)(i0 + k) * st + r0 + r + q] = qsilu_mul(a[k * TP_ROWS + q], b[k * TP_ROWS + q]);
        }
    }
    return 0;
}

static void mm_rows(const mm_job *j, int r0, int r1)
{
    if (j->x->exact) {
        mm_rows_exact(j, r0, r1);
        return;
    }
    if (job_packed(j)) {
        if ((tp_shape(j->w->type, j->w->rows, j->w->cols) ? mm_rows_tp(j, r0, r1) : mm_rows_packed(j, r0, r1)) != 0) {
            fprintf(stderr, "qmat_mul: out of memory\n");
            abort();
        }
        return;
    }
    const int n = j->x->n, cols = j->x->cols;
    const size_t st = (size_t)j->out_stride;
    qkern k1 = kern_for(j->w->type), k2 = j->w2 ? kern_for(j->w2->type) : NULL;
    float a[QDOT_MAX * 4], b[QDOT_MAX * 4];
    for (int i0 = 0; i0 < n; i0 += QDOT_MAX * 4) {
        /* a window of at most 16 activation rows against every weight row of the chunk */
        qact xw = *j->x;
        const int nw = n - i0 < QDOT_MAX * 4 ? n - i0 : QDOT_MAX * 4;
        xw.n = nw;
        xw.f += (size_t)i0 * cols;
        if (cols % QK == 0) {
            xw.q += (size_t)i0 * cols;
            xw.qd += (size_t)i0 * (cols / QK);
            xw.qs += (size_t)i0 * (cols / QK);
        }
        float *out = j->out + (size_t)i0 * st;
        if (nw == 1 && !j->w2 && !k1) {
            const uint8_t *wr = j->w->data + (size_t)r0 * j->w->row_bytes;
            if (j->w->type == GGML_F16)
                for (int r = r0; r < r1; r++, wr += j->w->row_bytes) out[r] = dot_f16(wr, xw.f, cols);
            else
                for (int r = r0; r < r1; r++, wr += j->w->row_bytes)
                    out[r] = dot_f32((const float *)(const void *)wr, xw.f, cols);
            continue;
        }
        for (int r = r0; r < r1; r++) {
            row_all(j->w, &xw, k1, r, a);
            if (j->w2) {
                row_all(j->w2, &xw, k2, r, b);
                for (int i = 0; i < nw; i++) out[(size_t)i * st + r] = qsilu_mul(a[i], b[i]);
            } else {
                for (int i = 0; i < nw; i++) out[(size_t)i * st + r] = a[i];
            }
        }
    }
}

typedef struct { int job, r0, r1; } mm_chunk;
typedef struct { const mm_job *jobs; const mm_chunk *ch; } mm_ctx;

static void mm_chunk_fn(void *vctx, int c)
{
    const mm_ctx *m = vctx;
    mm_rows(&m->jobs[m->ch[c].job], m->ch[c].r0, m->ch[c].r1);
}

static int job_ok(const mm_job *j)
{
    const qmat *w = j->w;
    const uint32_t type = w->type;
    int ok = j->x->cols == w->cols && (is_float(type) || (is_quant(type) && w->cols % QK == 0));
    if (ok && j->w2)
        ok = j->w2->rows == w->rows && j->w2->cols == w->cols && j->w2->type == type;
    if (!ok) {
        fprintf(stderr, "qmat_mul: unsupported case (type %u, cols %d, act cols %d)\n", type,
                w->cols, j->x->cols);
        for (int i = 0; i < j->x->n; i++)
            for (int r = 0; r < w->rows; r++) j->out[(size_t)i * j->out_stride + r] = 0.0f;
    }
    return ok;
}

static int job_ok_quiet(const mm_job *j)
{
    const qmat *w = j->w;
    int ok = j->x->cols == w->cols && (is_float(w->type) || (is_quant(w->type) && w->cols % QK == 0));
    if (ok && j->w2) ok = j->w2->rows == w->rows && j->w2->cols == w->cols && j->w2->type == w->type;
    return ok;
}

void qmat_mul_multi(const mm_job *jobs, int cnt)
{
    long total = 0;
    int nch = 0;
    mm_chunk stack_ch[512], *ch = stack_ch;
    for (int pass = 0; pass < 2; pass++) {
        for (int j = 0; j < cnt; j++) {
            const mm_job *J = &jobs[j];
            if (J->w->rows <= 0 || J->x->n <= 0) continue;
            if (pass == 0 && !job_ok(J)) continue;
            long per_row = (long)J->w->cols * J->x->n * (J->w2 ? 2 : 1);
            int rpc = (int)(CHUNK_WORK / (per_row > 0 ? per_row : 1));
            if (rpc < 1) rpc = 1;
            if (job_packed(J)) rpc = (rpc + 15) / 16 * 16;    /* whole 16-row tiles */
            if (job_packed(J) && tp_shape(J->w->type, J->w->rows, J->w->cols))
                rpc = (rpc + TP_ROWS - 1) / TP_ROWS * TP_ROWS;
            if (pass == 0) {
                total += per_row * J->w->rows;
                nch += (J->w->rows + rpc - 1) / rpc;
                continue;
            }
            if (!job_ok_quiet(J)) continue;
            for (int r = 0; r < J->w->rows; r += rpc) {
                ch[nch].job = j;
                ch[nch].r0 = r;
                ch[nch].r1 = r + rpc < J->w->rows ? r + rpc : J->w->rows;
                nch++;
            }
        }
        if (pass == 0) {
            if (nch == 0) return;
            if (total < PAR_MIN_WORK || pool_threads() == 1) {
                for (int j = 0; j < cnt; j++)
                    if (jobs[j].w->rows > 0 && jobs[j].x->n > 0 && job_ok_quiet(&jobs[j]))
                        mm_rows(&jobs[j], 0, jobs[j].w->rows);
                return;
            }
            if (nch > (int)(sizeof stack_ch / sizeof stack_ch[0])) {
                ch = malloc(sizeof *ch * (size_t)nch);
                if (!ch) {
                    for (int j = 0; j < cnt; j++)
                        if (jobs[j].w->rows > 0 && jobs[j].x->n > 0 && job_ok_quiet(&jobs[j]))
                            mm_rows(&jobs[j], 0, jobs[j].w->rows);
                    return;
                }
            }
            nch = 0;
        }
    }
    mm_ctx m = {jobs, ch};
    pool_run(mm_chunk_fn, &m, nch);
    if (ch != stack_ch) free(ch);
}

void qmat_mul(const qmat *w, const qact *x, float *out, int out_stride)
{
    mm_job j = {w, NULL, x, out, out_stride};
    qmat_mul_multi(&j, 1);
}

void qmat_mul_f32(const qmat *w, const float *x, int n, float *out, int out_stride)
{
    qact a = {0};
    qact_prepare(&a, w->type, x, n, w->cols);
    qmat_mul(w, &a, out, out_stride);
    qact_free(&a);
}

/* ---- EXACT mode: float activations (qact.exact) ---------------------------------------- */

float qdot_exact(const float *w, const float *x, int n)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int k = 0;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc);
    _mm256_storeu_ps(l, acc);
#endif
    for (; k < n; k++) l[k % 8] = fmaf(w[k], x[k], l[k % 8]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

static _Thread_local float *ex_buf;
static _Thread_local size_t ex_cap;

/* Rows [r0, r1) of a job whose activations are floats only: each weight row dequantized
 * (qmat_row: dequant_row's values, packed or not) once, dotted with every input row
 * (qdot_exact); w2: silu(a) * b. One fixed operation order per output, whatever the batch,
 * chunking or thread count. */
static void mm_rows_exact(const mm_job *j, int r0, int r1)
{
    const qmat *w = j->w, *w2 = j->w2;
    const qact *x = j->x;
    const int n = x->n, cols = w->cols;
    const size_t st = (size_t)j->out_stride;
    if ((size_t)2 * cols > ex_cap) {
        free(ex_buf);
        ex_cap = (size_t)2 * cols;
        ex_buf = alloc64(ex_cap * sizeof(float));
        if (!ex_buf) {
            fprintf(stderr, "qmat_mul: out of memory\n");
            abort();
        }
    }
    float *wa = ex_buf, *wb = ex_buf + cols;
    for (int r = r0; r < r1; r++) {
        qmat_row(w, r, wa);
        if (w2) qmat_row(w2, r, wb);
        for (int i = 0; i < n; i++) {
            const float *xi = x->f + (size_t)(x->idx ? x->idx[i] : i) * (size_t)cols;
            float a = qdot_exact(wa, xi, cols);
            j->out[(size_t)i * st + r] = w2 ? qsilu_mul(a, qdot_exact(wb, xi, cols)) : a;
        }
    }
}
