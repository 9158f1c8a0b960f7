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
/* The 32 int8 values of a block from its 16 code bytes: nibbles -> table via one byte shuffle. */
static inline __m256i block_vals(const uint8_t *qs, __m256i tbl) {
    const __m128i raw = _mm_loadu_si128((const __m128i *)qs), m4 = _mm_set1_epi8(15);
    const __m128i lo = _mm_and_si128(raw, m4), hi = _mm_and_si128(_mm_srli_epi16(raw, 4), m4);
    return _mm256_shuffle_epi8(tbl, _mm256_set_m128i(hi, lo));
}

/* 8 int32 lanes whose sum is the exact dot of 32 int8 values w and x, given a = |w| (<= 127):
 * a times x with w's sign (|x| <= 127), pairs <= 2 * 127 * 127 < 32767, so maddubs never
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

/* Lane sums of v[0..7] as one vector of 8 int32 (integer adds: exact in any order). */
static inline __m256i red8(const __m256i *v) {
    const __m256i t0 = _mm256_hadd_epi32(v[0], v[1]), t1 = _mm256_hadd_epi32(v[2], v[3]);
    const __m256i t2 = _mm256_hadd_epi32(v[4], v[5]), t3 = _mm256_hadd_epi32(v[6], v[7]);
    const __m256i u0 = _mm256_hadd_epi32(t0, t1), u1 = _mm256_hadd_epi32(t2, t3);
    return _mm256_add_epi32(_mm256_permute2x128_si256(u0, u1, 0x20), _mm256_permute2x128_si256(u0, u1, 0x31));
}

/* The 8 blocks of a group of g (<= 8) blocks from block b0: |values| a[] and the values' signs
 * sg[] (the sign trick's operands, shared by every activation row) and the scales as a vector: an
 * IQ4_XS super-block (d converted once; ls of block j = (scales_l as u32 >> 4j) & 15 |
 * ((scales_h >> 2j) & 3) << 4, then d * (float)(ls - 32): dequantization's product), or IQ4_NL
 * blocks (padding: zero values and scales). */
static inline __m256 group_vals(uint32_t t, const uint8_t *w, int b0, int g, __m256i tbl, __m256i *a, __m256i *sg) {
    const __m256i m4 = _mm256_set1_epi8(15);
    if (t == GGML_IQ4_XS) {
        const uint8_t *sb = w + (size_t)(b0 / 8) * IQ4XS_BYTES;
        for (int j = 0; j < 8; j += 2) {   /* blocks j, j + 1: one 32-byte load, both halves through the table */
            const __m256i raw = _mm256_loadu_si256((const __m256i *)(sb + 8 + 16 * j));
            const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(raw, m4));
            const __m256i hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(raw, 4), m4));
            sg[j] = _mm256_permute2x128_si256(lo, hi, 0x20);
            sg[j + 1] = _mm256_permute2x128_si256(lo, hi, 0x31);
            a[j] = _mm256_abs_epi8(sg[j]);
            a[j + 1] = _mm256_abs_epi8(sg[j + 1]);
        }
        uint32_t sl;
        memcpy(&sl, sb + 4, 4);
        const __m256i lo = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)sl), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28)),
                                            _mm256_set1_epi32(15));
        const __m256i hi = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(sb[2] | sb[3] << 8), _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)),
                                            _mm256_set1_epi32(3));
        const __m256i ls = _mm256_or_si256(lo, _mm256_slli_epi32(hi, 4));
        return _mm256_mul_ps(_mm256_set1_ps(h2f(sb)), _mm256_cvtepi32_ps(_mm256_sub_epi32(ls, _mm256_set1_epi32(32))));
    }
    float sc[8];
    for (int b = 0; b < 8; b++) {
        sc[b] = 0.0f;
        sg[b] = b < g ? block_vals(blk_codes(t, w, b0 + b, &sc[b]), tbl) : _mm256_setzero_si256();
        a[b] = _mm256_abs_epi8(sg[b]);
    }
    return _mm256_loadu_ps(sc);
}

void qiq_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) {
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)qiq_kvalues));
    const size_t cols = (size_t)x->cols;
    __m256 acc[IQ_NX];
    for (int k = 0; k < IQ_NX; k++) acc[k] = _mm256_setzero_ps();
    for (int b0 = 0; b0 < nb; b0 += 8) {
        const int g = nb - b0 < 8 ? nb - b0 : 8;     /* IQ4_XS: always 8 (a super-block) */
        __m256i av[8], v[8];
        const __m256 scv = group_vals(t, w, b0, g, tbl, av, v);
        for (int k = 0; k < nx; k++) {
            const size_t r = (size_t)(i0 + k);
            const int8_t *xq = x->q + r * cols + (size_t)b0 * 32;
            const float *xdp = x->qd + r * (size_t)nb + b0;
            __m256i p[8];
            if (g == 8) {
                for (int b = 0; b < 8; b++) p[b] = dot32(av[b], v[b], _mm256_loadu_si256((const __m256i *)(xq + 32 * b)));
                const __m256 m = _mm256_mul_ps(scv, _mm256_loadu_ps(xdp));   /* scale * d_x, per block */
                acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(red8(p)), m, acc[k]);
            } else {   /* IQ4_NL's last blocks: lanes g.. keep their accumulators as they are */
                float xdt[8] = {0};
                int32_t lane[8];
                for (int b = 0; b < 8; b++) {
                    p[b] = b < g ? dot32(av[b], v[b], _mm256_loadu_si256((const __m256i *)(xq + 32 * b))) : _mm256_setzero_si256();
                    lane[b] = b < g ? -1 : 0;
                }
                for (int b = 0; b < g; b++) xdt[b] = xdp[b];
                const __m256 m = _mm256_mul_ps(scv, _mm256_loadu_ps(xdt));
                const __m256 a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(red8(p)), m, acc[k]);
                acc[k] = _mm256_blendv_ps(acc[k], a, _mm256_castsi256_ps(_mm256_loadu_si256((const __m256i *)lane)));
            }
        }
    }
    for (int k = 0; k < nx; k++) {
        float l[8];
        _mm256_storeu_ps(l, acc[k]);
        res[k] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
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
