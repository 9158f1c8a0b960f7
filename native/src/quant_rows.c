/* quant_rows.c — the row kernels: one unpacked weight row against up to QDOT_MAX prepared
 * activation rows, for the types and shapes that are not packed (Q4_0, Q5_0, Q5_1, F32, F16, the
 * K-quants' and BF16's row kernels through qk_dot, IQ4 through qiq_dot, IQ1-IQ3 through qiql_dot, any matrix whose shape qpack_ok refuses).
 * Owns: dot_f32 / dot_f16 (float activations), qdot_n (AVX2: int8 blocks, 4 blocks per step) and
 * the portable loops, kern_for (the kernel of a type) and row_all (one row against all inputs). */
#include "quant_impl.h"
#include "quant_iq.h"
#include "quant_iqlow.h"

/* ---- dot kernels: one weight row . one prepared activation row ------------------------ */

#ifdef __AVX2__
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

float dot_f32(const float *w, const float *x, int n)
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

float dot_f16(const uint8_t *w8, const float *x, int n)
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

/* The scales d (and mins m, HAS_MIN types) of the 4 blocks at wb, bsz bytes apart. */
FORCE_INLINE void qdot_scales4(uint32_t t, const uint8_t *wb, size_t bsz, __m128 *d4, __m128 *m4)
{
    *m4 = _mm_setzero_ps();
    if (!HAS_MIN(t)) {
        *d4 = ld4_f16(wb, bsz);
        return;
    }
    /* (d, m) f16 pairs of 4 blocks in one conversion, then split */
    uint32_t p0, p1, p2, p3;
    memcpy(&p0, wb, 4);
    memcpy(&p1, wb + bsz, 4);
    memcpy(&p2, wb + 2 * bsz, 4);
    memcpy(&p3, wb + 3 * bsz, 4);
    __m256 dm = _mm256_cvtph_ps(_mm_set_epi32((int)p3, (int)p2, (int)p1, (int)p0));
    dm = _mm256_permutevar8x32_ps(dm, _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7));
    *d4 = _mm256_castps256_ps128(dm);
    *m4 = _mm256_extractf128_ps(dm, 1);
}

/* The 4 blocks' exact int32 sums against one activation row's 128 int8 values at xk, folded into
 * one vector [s0 s1 | s2 s3 ...] by horizontal adds (v: the weight blocks, u: their unsigned form). */
FORCE_INLINE __m256i qdot_isums4(uint32_t t, const __m256i *v, const __m256i *u, const int8_t *xk, __m256i ones)
{
    __m256i p[4];
    for (int j = 0; j < 4; j++) {
        __m256i xv = _mm256_loadu_si256((const __m256i *)(xk + j * QK));
        if (!HAS_MIN(t)) xv = _mm256_sign_epi8(xv, v[j]);
        p[j] = dot4_u8i8(u[j], xv, ones);
    }
    return _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
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
        __m128 d4, m4;
        qdot_scales4(t, wb, bsz, &d4, &m4);
        __m256i v[4], u[4];
        for (int j = 0; j < 4; j++) {
            v[j] = wblock(t, wb + j * bsz);
            u[j] = HAS_MIN(t) ? v[j] : _mm256_sign_epi8(v[j], v[j]);
        }
        for (int k = 0; k < NX; k++) {
            const __m256i h = qdot_isums4(t, v, u, xq + k * xst + (size_t)b * QK, ones);
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


void row_all(const qmat *w, const qact *x, qkern kern, int r, float *res)
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
static void qdot_iq4_nl(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) { qiq_dot(GGML_IQ4_NL, w, x, i0, nx, nb, res); }
static void qdot_iq4_xs(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) { qiq_dot(GGML_IQ4_XS, w, x, i0, nx, nb, res); }
#define QDOT_IQL(name, T)                                                                   \
    static void name(const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)   \
    {                                                                                       \
        qiql_dot(T, w, x, i0, nx, nb, res);                                                 \
    }
QDOT_IQL(qdot_iq1_s, GGML_IQ1_S)
QDOT_IQL(qdot_iq1_m, GGML_IQ1_M)
QDOT_IQL(qdot_iq2_xxs, GGML_IQ2_XXS)
QDOT_IQL(qdot_iq2_xs, GGML_IQ2_XS)
QDOT_IQL(qdot_iq2_s, GGML_IQ2_S)
QDOT_IQL(qdot_iq3_xxs, GGML_IQ3_XXS)
QDOT_IQL(qdot_iq3_s, GGML_IQ3_S)

qkern kern_for(uint32_t t)
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
    case GGML_IQ4_NL: return qdot_iq4_nl;
    case GGML_IQ4_XS: return qdot_iq4_xs;
    case GGML_IQ1_S: return qdot_iq1_s;
    case GGML_IQ1_M: return qdot_iq1_m;
    case GGML_IQ2_XXS: return qdot_iq2_xxs;
    case GGML_IQ2_XS: return qdot_iq2_xs;
    case GGML_IQ2_S: return qdot_iq2_s;
    case GGML_IQ3_XXS: return qdot_iq3_xxs;
    case GGML_IQ3_S: return qdot_iq3_s;
    default: return NULL;
    }
}
