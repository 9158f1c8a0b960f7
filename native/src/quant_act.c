/* quant_act.c — activations prepared for the kernels (quant.h's qact).
 * Owns: int8 quantization per 32-block (quant_block: scale, float sum, integer sum, one fixed
 * order on every path), qact_prepare / qact_gather / qact_free, and alloc64. */
#include "quant_impl.h"
#include "pool.h"

void *alloc64(size_t bytes)
{
    bytes = (bytes + 63) & ~(size_t)63;
    return aligned_alloc(64, bytes ? bytes : 64);
}

/* Quantize one block of 32 floats to int8 with scale d = max|x| / 127 (round half away
 * from zero, clamped to +-127); also the float sum of the block and the integer sum of q.
 * The float sum has one fixed order on every path: lanes l < 8 hold
 * (x[l] + x[l+8]) + (x[l+16] + x[l+24]); then a_l = lane l + lane l+4 (l < 4);
 * sum = (a0 + a2) + (a1 + a3). Also the integer sum of q[0..15] (h_out: the K-quant tiles' half sums). */
static void quant_block(const float *x, int8_t *q, float *d_out, float *s_out, int32_t *i_out, int32_t *h_out)
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
    const float d = amax / 127.0f;
    const __m256 id = _mm256_set1_ps(d != 0.0f ? 1.0f / d : 0.0f);
    const __m256 half = _mm256_set1_ps(0.5f);
    __m256i iv[4];
    for (int k = 0; k < 4; k++) {
        __m256 t = _mm256_mul_ps(v[k], id);
        t = _mm256_add_ps(t, _mm256_or_ps(_mm256_and_ps(t, sign), half));   /* t +- 0.5 */
        iv[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvttps_epi32(t), _mm256_set1_epi32(-127)),
                                 _mm256_set1_epi32(127));
    }
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(iv[0], iv[1]), _mm256_packs_epi32(iv[2], iv[3]));
    p = _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256((__m256i *)q, p);
    /* the halves' sums side by side: lanes 0-3 of h8 values 0-15, lanes 4-7 values 16-31 */
    const __m256i ha = _mm256_add_epi32(iv[0], iv[1]), hb = _mm256_add_epi32(iv[2], iv[3]);
    __m256i h8 = _mm256_add_epi32(_mm256_permute2x128_si256(ha, hb, 0x20), _mm256_permute2x128_si256(ha, hb, 0x31));
    h8 = _mm256_add_epi32(h8, _mm256_shuffle_epi32(h8, 0x4e));
    h8 = _mm256_add_epi32(h8, _mm256_shuffle_epi32(h8, 0xb1));
    const int32_t sa = _mm256_cvtsi256_si32(h8), sb = _mm_cvtsi128_si32(_mm256_extracti128_si256(h8, 1));
    *d_out = d;
    *s_out = hsum8(s8);
    *i_out = sa + sb;
    *h_out = sa;
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
    int32_t isum = 0, hsum = 0;
    for (int j = 0; j < QK; j++) {
        float v = x[j] * id;                       /* |v| <= 127 (+ rounding) */
        v = v >= 0.0f ? v + 0.5f : v - 0.5f;       /* round half away from zero */
        int iv = (int)v;
        q[j] = (int8_t)(iv > 127 ? 127 : iv < -127 ? -127 : iv);
        isum += q[j];
        if (j == 15) hsum = isum;
    }
    *d_out = d;
    *s_out = (a0 + a2) + (a1 + a3);
    *i_out = isum;
    *h_out = hsum;
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
            quant_block(P->x + b * QK, a->q + b * QK, &a->qd[b], &a->qs[b], &a->qi[b], &a->qh[b]);
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
        a->qh = alloc64((a->cap / QK + 1) * sizeof(int32_t));
        if (!a->f || !a->q || !a->qd || !a->qs || !a->qi || !a->qh) {
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
        dst->qh = alloc64((dst->cap / QK + 1) * sizeof(int32_t));
        if (!dst->f || !dst->q || !dst->qd || !dst->qs || !dst->qi || !dst->qh) {
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
            memcpy(dst->qh + j * nb, src->qh + i * nb, nb * sizeof(int32_t));
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
    free(a->qh);
    a->f = NULL;
    a->q = NULL;
    a->qd = NULL;
    a->qs = NULL;
    a->qi = NULL;
    a->qh = NULL;
    a->cap = 0;
}
