/* quant_iq.c — IQ4_NL and IQ4_XS (see quant_iq.h). Block layouts (llama.cpp's ggml-common.h):
 *   IQ4_NL  18 B per 32 values: f16 d, qs[16].
 *   IQ4_XS 136 B per 256 values: f16 d, u16 scales_h, u8 scales_l[4], qs[128]; 32-block j
 *          (0..7) has ls_j = (scales_l[j / 2] >> 4 (j % 2)) & 15 | ((scales_h >> 2j) & 3) << 4
 *          and its 16 code bytes at qs + 16 j.
 * In a block's 16 code bytes, byte i holds value i (low nibble) and value 16 + i (high nibble).
 * Values: IQ4_NL d * kv[c]; IQ4_XS (d * (ls - 32)) * kv[c] — numpy's float32 operations (gguf's
 * dequantizers; this file is compiled without contraction, -std=c11), so the values are gguf's
 * bit for bit. */
#include "quant_iq.h"

#include "gguf.h"

#include <math.h>
#include <string.h>

#ifdef __AVX2__
#include <immintrin.h>
#endif

#define IQ4NL_BYTES 18
#define IQ4XS_BYTES 136

const int8_t qiq_kvalues[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

int qiq_is_iq(uint32_t t) { return t == GGML_IQ4_NL || t == GGML_IQ4_XS; }

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

/* Block b's 16 code bytes; *scale = its dequantization factor. */
static inline const uint8_t *blk_codes(uint32_t t, const uint8_t *row, int b, float *scale) {
    if (t == GGML_IQ4_NL) {
        const uint8_t *p = row + (size_t)b * IQ4NL_BYTES;
        *scale = h2f(p);
        return p + 2;
    }
    const uint8_t *sb = row + (size_t)(b / 8) * IQ4XS_BYTES;
    const int j = b % 8;
    uint16_t sh;
    memcpy(&sh, sb + 2, 2);
    const int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
    *scale = h2f(sb) * (float)(ls - 32);
    return sb + 8 + 16 * j;
}

void qiq_block(uint32_t t, const uint8_t *row, int b, int8_t q[32], float *scale) {
    const uint8_t *qs = blk_codes(t, row, b, scale);
    for (int i = 0; i < 16; i++) {
        q[i] = qiq_kvalues[qs[i] & 15];
        q[i + 16] = qiq_kvalues[qs[i] >> 4];
    }
}

void qiq_dequant(uint32_t t, const uint8_t *row, float *out, int n) {
    int8_t q[32];
    float s;
    for (int b = 0; b < n / 32; b++) {
        qiq_block(t, row, b, q, &s);
        for (int i = 0; i < 32; i++) out[32 * b + i] = s * (float)q[i];
    }
}

#define IQ_NX 4     /* activation rows per call, at most (quant.c's QDOT_MAX) */

#ifdef __AVX2__
/* Two blocks' 16 code bytes each (low / high 128-bit lane) through the table: lo = values 0-15,
 * hi = values 16-31 of the two blocks, and their magnitudes (the sign trick's unsigned operands). */
static inline void pair_vals(__m256i raw, __m256i tbl, __m256i *lo, __m256i *hi, __m256i *alo, __m256i *ahi) {
    const __m256i m4 = _mm256_set1_epi8(15);
    *lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(raw, m4));
    *hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
    *alo = _mm256_abs_epi8(*lo);
    *ahi = _mm256_abs_epi8(*hi);
}

/* 8 int32 lanes whose sums per 128-bit half are exact dots of int8 values w and x, given a = |w|
 * (<= 127): a times x with w's sign (|x| <= 127), pairs <= 2 * 127 * 127 < 32767, so maddubs never
 * saturates and VNNI gives the same sums. */
static inline __m256i dot32(__m256i a, __m256i w, __m256i x) {
    const __m256i b = _mm256_sign_epi8(x, w);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

static inline __m256i load2x128(const int8_t *a, const int8_t *b) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)a)),
                                   _mm_loadu_si128((const __m128i *)b), 1);
}

/* The vector lanes hold the canonical order's 8 lanes permuted: physical lane p = logical lane
 * (block of the group) LANE[p], the order the pairwise reduction of the blocks' sums leaves them in
 * (blocks 0/1, 2/3, ... share a 256-bit vector; the 128-bit halves reduce separately). */
#define IQ_PERM _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7)
static const int LANE_POS[8] = {0, 4, 1, 5, 2, 6, 3, 7};   /* logical lane l sits in physical lane LANE_POS[l] */

void qiq_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qiq_kvalues));
    const size_t cols = (size_t)x->cols;
    __m256 acc[IQ_NX];
    for (int k = 0; k < IQ_NX; k++) acc[k] = _mm256_setzero_ps();
    const int nfull = nb / 8 * 8;
    for (int b0 = 0; b0 < nfull; b0 += 8) {
        __m256i lo[4], hi[4], alo[4], ahi[4];
        __m256 scv;
        if (t == GGML_IQ4_XS) {   /* one super-block: d once, the 8 scales ls_j as one vector */
            const uint8_t *sb = w + (size_t)(b0 / 8) * IQ4XS_BYTES;
            for (int q = 0; q < 4; q++)
                pair_vals(_mm256_loadu_si256((const __m256i *)(sb + 8 + 32 * q)), tbl, &lo[q], &hi[q], &alo[q], &ahi[q]);
            uint32_t sl;
            memcpy(&sl, sb + 4, 4);
            const __m256i l4 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                                _mm256_set1_epi32(15));
            const __m256i h2 = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sb[2] | sb[3] << 8), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                                _mm256_set1_epi32(3));
            const __m256i ls = _mm256_or_si256(l4, _mm256_slli_epi32(h2, 4));
            scv = _mm256_mul_ps(_mm256_set1_ps(h2f(sb)), _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
        } else {                  /* IQ4_NL: 8 blocks of 18 bytes */
            float sc[8];
            const uint8_t *c[8];
            for (int b = 0; b < 8; b++) c[b] = blk_codes(t, w, b0 + b, &sc[b]);
            for (int q = 0; q < 4; q++)
                pair_vals(load2x128((const int8_t *)c[2 * q], (const int8_t *)c[2 * q + 1]), tbl, &lo[q], &hi[q], &alo[q], &ahi[q]);
            scv = _mm256_loadu_ps(sc);
        }
        const __m256 scp = _mm256_permutevar8x32_ps(scv, IQ_PERM);
        for (int k = 0; k < nx; k++) {
            const size_t r = (size_t)(i0 + k);
            const int8_t *xq = x->q + r * cols + (size_t)b0 * 32;
            __m256i sq[4];
            for (int q = 0; q < 4; q++) {
                const int8_t *xb = xq + 64 * q;
                sq[q] = _mm256_add_epi32(dot32(alo[q], lo[q], load2x128(xb, xb + 32)),
                                         dot32(ahi[q], hi[q], load2x128(xb + 16, xb + 48)));
            }
            /* lanes: blocks 0, 2, 4, 6 | 1, 3, 5, 7 (integer adds: exact in any order) */
            const __m256i isum = _mm256_hadd_epi32(_mm256_hadd_epi32(sq[0], sq[1]), _mm256_hadd_epi32(sq[2], sq[3]));
            const __m256 xd = _mm256_permutevar8x32_ps(_mm256_loadu_ps(x->qd + r * (size_t)nb + b0), IQ_PERM);
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scp, xd), acc[k]);   /* scale * d_x per block */
        }
    }
    for (int k = 0; k < nx; k++) {
        float P[8];
        _mm256_storeu_ps(P, acc[k]);
        if (nfull < nb) {   /* IQ4_NL's last blocks (fewer than 8): lanes 0.. of the canonical order */
            const size_t r = (size_t)(i0 + k);
            for (int b = nfull; b < nb; b++) {
                int8_t q[32];
                float s;
                qiq_block(t, w, b, q, &s);
                const int8_t *xq = x->q + r * cols + (size_t)b * 32;
                int32_t is = 0;
                for (int i = 0; i < 32; i++) is += (int32_t)q[i] * xq[i];
                float *a = &P[LANE_POS[b % 8]];
                *a = fmaf((float)is, s * x->qd[r * (size_t)nb + b], *a);
            }
        }
        /* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) in physical lanes */
        res[k] = ((P[0] + P[2]) + (P[1] + P[3])) + ((P[4] + P[6]) + (P[5] + P[7]));
    }
}
#else
void qiq_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) {
    const size_t cols = (size_t)x->cols;
    float acc[IQ_NX][8] = {{0}};
    int8_t q[32];
    float s;
    for (int b = 0; b < nb; b++) {
        qiq_block(t, w, b, q, &s);
        for (int k = 0; k < nx; k++) {
            const size_t r = (size_t)(i0 + k);
            const int8_t *xq = x->q + r * cols + (size_t)b * 32;
            int32_t is = 0;
            for (int i = 0; i < 32; i++) is += (int32_t)q[i] * xq[i];
            acc[k][b % 8] = fmaf((float)is, s * x->qd[r * (size_t)nb + b], acc[k][b % 8]);
        }
    }
    for (int k = 0; k < nx; k++) {
        const float *l = acc[k];
        res[k] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
}
#endif
