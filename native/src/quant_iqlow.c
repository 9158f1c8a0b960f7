/* quant_iqlow.c — IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S (see quant_iqlow.h).
 * Owns: the super-block layouts (llama.cpp's ggml-common.h, read the way gguf-py's dequantizers
 * read them), qiql_dequant (numpy's float32 operations, this file compiled without contraction:
 * gguf-py's values bit for bit), qiql_block and the row kernel qiql_dot.
 *
 * A super-block holds 256 values as 8 blocks of 32, each 4 groups of 8 values (IQ3: 8 groups of 4
 * for the grid, signs still per 8). Bytes per super-block, in order:
 *   IQ2_XXS  66: f16 d; per block two u32: a0 = 4 grid indices (bytes, 256-entry grid of 8),
 *                a1 = 4 x 7 sign bits (bits 7l..7l+6: group l) and the scale ls = a1 >> 28.
 *   IQ2_XS   74: f16 d; u16 qs[32] (per group: grid index 9 bits, 7 sign bits above); u8 scales[8]
 *                (byte j: ls of block j's values 0-15 low nibble, 16-31 high).
 *   IQ2_S    82: f16 d; u8 qs[32] (index bits 0-7 per group); u8 signs[32] (8 raw sign bits per
 *                group); u8 qh[8] (byte j: index bits 8-9 of block j's group l at bits 2l);
 *                u8 scales[8] (as IQ2_XS).
 *   IQ3_XXS  98: f16 d; u8 qs[64] (grid index per 4 values); u32 per block: 4 x 7 sign bits, ls >> 28.
 *   IQ3_S   110: f16 d; u8 qs[64]; u8 qh[8] (byte j bit i: index bit 8 of block j's i-th index);
 *                u8 signs[32] (raw bits per group of 8); u8 scales[4] (block j: nibble j).
 *   IQ1_S    50: f16 d; u8 qs[32] (index bits 0-7 per group); u16 qh[8] (block j: bits 3l..3l+2
 *                index bits 8-10 of group l, bits 12-14 ls, bit 15 the delta's sign).
 *   IQ1_M    56: u8 qs[32]; u8 qh[16] (byte 2j + h: nibbles for groups 4j + 2h, 4j + 2h + 1: index
 *                bits 8-10, bit 3 the delta's sign); u16 sc[4]: 3-bit scales of the 16 halves (half
 *                4i + k at bits 3k of sc[i]) and d's f16 bits in the four top nibbles (sc[i] >> 12
 *                is bits 4i..4i+3 of d).
 * A 7-bit sign field s stands for 8 sign bits: s and, as bit 7, the parity of s (an even number of
 * negatives; llama.cpp's ksigns table). Values (numpy's order of operations):
 *   IQ2_*:   db = (d * (0.5 + ls)) * 0.25, value = (db * g) * (+-1)
 *   IQ3_XXS: db = (d * (0.5 + ls)) * 0.5,  value = (db * g) * (+-1)
 *   IQ3_S:   db = d * (1 + 2 ls),          value = (db * g) * (+-1)
 *   IQ1_*:   dl = d * (2 ls + 1),          value = dl * (g + delta), delta = +-0.125 */
#include "quant_iqlow.h"

#include "gguf.h"
#include "quant_iq_grids.h"

#include <math.h>
#include <string.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif

int qiql_is(uint32_t t)
{
    return t == GGML_IQ1_S || t == GGML_IQ1_M || t == GGML_IQ2_XXS || t == GGML_IQ2_XS || t == GGML_IQ2_S ||
           t == GGML_IQ3_XXS || t == GGML_IQ3_S;
}

static size_t sb_bytes(uint32_t t)
{
    switch (t) {
    case GGML_IQ1_S: return 50;
    case GGML_IQ1_M: return 56;
    case GGML_IQ2_XXS: return 66;
    case GGML_IQ2_XS: return 74;
    case GGML_IQ2_S: return 82;
    case GGML_IQ3_XXS: return 98;
    default: return 110;    /* IQ3_S */
    }
}

static inline uint16_t rd16(const uint8_t *p) { uint16_t v; memcpy(&v, p, 2); return v; }
static inline uint32_t rd32(const uint8_t *p) { uint32_t v; memcpy(&v, p, 4); return v; }
static inline float h2f(uint16_t h)
{
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return fp16_to_f32(h);
#endif
}

/* the 8 sign bits a 7-bit field stands for (quant_iq_grids.c's table) */
static inline uint32_t ksign(uint32_t s)
{
    return qiq_ksigns[s & 127];
}

/* Block j (0..7) of super-block p, as fields: the grid rows of its groups (idx[0..3] for 8-value
 * grids, idx[0..7] for IQ3's 4-value ones), neg (bit v: value v negative; IQ2 / IQ3), the scale
 * fields ls[2] of values 0-15 / 16-31, dneg (IQ1: bit l: group l's delta is negative). */
typedef struct {
    uint32_t idx[8], neg, dneg;
    int ls[2];
} iq_raw;

/* The super-block's d (IQ1_M: its f16 bits from the top nibbles of sc[0..3]). */
static inline float sb_d(uint32_t t, const uint8_t *p)
{
    if (t != GGML_IQ1_M) return h2f(rd16(p));
    uint16_t h = 0;
    for (int i = 0; i < 4; i++) h |= (uint16_t)((rd16(p + 48 + 2 * i) >> 12) << (4 * i));
    return h2f(h);
}

static inline __attribute__((always_inline)) void raw_block(uint32_t t, const uint8_t *p, int j, iq_raw *r)
{
    r->neg = r->dneg = 0;
    switch (t) {
    case GGML_IQ2_XXS: {
        const uint32_t a0 = rd32(p + 2 + 8 * j), a1 = rd32(p + 6 + 8 * j);
        for (int l = 0; l < 4; l++) {
            r->idx[l] = (a0 >> (8 * l)) & 255;
            r->neg |= ksign(a1 >> (7 * l)) << (8 * l);
        }
        r->ls[0] = r->ls[1] = (int)(a1 >> 28);
        break;
    }
    case GGML_IQ2_XS:
        for (int l = 0; l < 4; l++) {
            const uint32_t v = rd16(p + 2 + 2 * (4 * j + l));
            r->idx[l] = v & 511;
            r->neg |= ksign(v >> 9) << (8 * l);
        }
        r->ls[0] = p[66 + j] & 15;
        r->ls[1] = p[66 + j] >> 4;
        break;
    case GGML_IQ2_S:
        for (int l = 0; l < 4; l++) {
            r->idx[l] = p[2 + 4 * j + l] | ((uint32_t)(p[66 + j] >> (2 * l)) & 3) << 8;
            r->neg |= (uint32_t)p[34 + 4 * j + l] << (8 * l);
        }
        r->ls[0] = p[74 + j] & 15;
        r->ls[1] = p[74 + j] >> 4;
        break;
    case GGML_IQ3_XXS: {
        const uint32_t a = rd32(p + 66 + 4 * j);
        for (int i = 0; i < 8; i++) r->idx[i] = p[2 + 8 * j + i];
        for (int l = 0; l < 4; l++) r->neg |= ksign(a >> (7 * l)) << (8 * l);
        r->ls[0] = r->ls[1] = (int)(a >> 28);
        break;
    }
    case GGML_IQ3_S:
        for (int i = 0; i < 8; i++) r->idx[i] = p[2 + 8 * j + i] | ((uint32_t)(p[66 + j] >> i) & 1) << 8;
        r->neg = rd32(p + 74 + 4 * j);
        r->ls[0] = r->ls[1] = (p[106 + j / 2] >> (4 * (j % 2))) & 15;
        break;
    case GGML_IQ1_S: {
        const uint32_t h = rd16(p + 34 + 2 * j);
        for (int l = 0; l < 4; l++) r->idx[l] = p[2 + 4 * j + l] | ((h >> (3 * l)) & 7) << 8;
        r->ls[0] = r->ls[1] = (int)((h >> 12) & 7);
        r->dneg = h & 0x8000 ? 15 : 0;
        break;
    }
    default: {   /* IQ1_M */
        uint16_t sc[4];
        for (int i = 0; i < 4; i++) sc[i] = rd16(p + 48 + 2 * i);
        for (int l = 0; l < 4; l++) {
            const uint32_t nib = (uint32_t)(p[32 + 2 * j + l / 2] >> (4 * (l % 2))) & 15;
            r->idx[l] = p[4 * j + l] | (nib & 7) << 8;
            r->dneg |= (nib >> 3) << l;
        }
        for (int h = 0; h < 2; h++) r->ls[h] = (sc[(2 * j + h) / 4] >> (3 * ((2 * j + h) % 4))) & 7;
        break;
    }
    }
}

static int is_iq3(uint32_t t) { return t == GGML_IQ3_XXS || t == GGML_IQ3_S; }
static int is_iq1(uint32_t t) { return t == GGML_IQ1_S || t == GGML_IQ1_M; }

/* Value v's grid entry g (int8) of a decoded block. */
static inline int grid_val(uint32_t t, const iq_raw *r, int v)
{
    if (is_iq3(t)) {
        const uint32_t row = t == GGML_IQ3_XXS ? qiq_grid_iq3xxs[r->idx[v / 4]] : qiq_grid_iq3s[r->idx[v / 4]];
        return (int8_t)(row >> (8 * (v % 4)));
    }
    const uint64_t *grid = is_iq1(t) ? qiq_grid_iq1s : t == GGML_IQ2_XXS ? qiq_grid_iq2xxs
                         : t == GGML_IQ2_XS ? qiq_grid_iq2xs : qiq_grid_iq2s;
    return (int8_t)(grid[r->idx[v / 8]] >> (8 * (v % 8)));
}

void qiql_dequant(uint32_t t, const uint8_t *row, float *out, int n)
{
    const size_t sbb = sb_bytes(t);
    for (int s = 0; s < n / 256; s++) {
        const uint8_t *p = row + (size_t)s * sbb;
        const float d = sb_d(t, p);
        for (int j = 0; j < 8; j++) {
            iq_raw r;
            raw_block(t, p, j, &r);
            float *o = out + 256 * s + 32 * j;
            for (int h = 0; h < 2; h++) {
                const float ls = (float)r.ls[h];
                float db;
                if (is_iq1(t)) db = d * (float)(2 * r.ls[h] + 1);
                else if (t == GGML_IQ3_S) db = d * (float)(1 + 2 * r.ls[h]);
                else if (t == GGML_IQ3_XXS) db = (d * (0.5f + ls)) * 0.5f;
                else db = (d * (0.5f + ls)) * 0.25f;
                for (int v = 16 * h; v < 16 * h + 16; v++) {
                    const float g = (float)grid_val(t, &r, v);
                    if (is_iq1(t)) o[v] = db * (g + ((r.dneg >> (v / 8)) & 1 ? -0.125f : 0.125f));
                    else o[v] = (db * g) * ((r.neg >> v) & 1 ? -1.0f : 1.0f);
                }
            }
        }
    }
}

/* the kernel's integer multipliers and factor of a decoded block (quant_iqlow.h) */
static inline float blk_factor(uint32_t t, const iq_raw *r, float d, int32_t m[2])
{
    m[0] = 2 * r->ls[0] + 1;
    m[1] = 2 * r->ls[1] + 1;
    return t == GGML_IQ3_S ? d : t == GGML_IQ3_XXS ? d * 0.25f : d * 0.125f;
}

void qiql_block(uint32_t t, const uint8_t *row, int b, int8_t q[32], int32_t m[2], float *f)
{
    iq_raw r;
    const uint8_t *p = row + (size_t)(b / 8) * sb_bytes(t);
    raw_block(t, p, b % 8, &r);
    *f = blk_factor(t, &r, sb_d(t, p), m);
    for (int v = 0; v < 32; v++) {
        const int g = grid_val(t, &r, v);
        q[v] = (int8_t)(is_iq1(t) ? 8 * g + ((r.dneg >> (v / 8)) & 1 ? -1 : 1) : (r.neg >> v) & 1 ? -g : g);
    }
}

/* ---- the packed layout's view (quant_impl.h) ---- */

void qiql_table(uint32_t t, int8_t tab[16], int *off)
{
    static const int8_t iq2[3] = {8, 25, 43}, iq3x[8] = {4, 12, 20, 28, 36, 44, 52, 62},
                        iq3s[8] = {1, 3, 5, 7, 9, 11, 13, 15}, iq1[3] = {1, 7, 9};
    const int8_t *lv = is_iq1(t) ? iq1 : t == GGML_IQ3_XXS ? iq3x : t == GGML_IQ3_S ? iq3s : iq2;
    const int n = is_iq3(t) ? 8 : 3;
    memset(tab, 0, 16);
    for (int i = 0; i < n; i++) {
        tab[i] = lv[i];
        tab[8 + i] = (int8_t)-lv[i];
    }
    *off = lv[n - 1];
}

float qiql_fscale(uint32_t t) { return t == GGML_IQ3_S ? 1.0f : t == GGML_IQ3_XXS ? 0.25f : 0.125f; }

/* a signed code's index in qiql_table: its level (position among the magnitudes) + 8 if negative */
static inline int code_of(uint32_t t, int q)
{
    const int a = q < 0 ? -q : q;
    const int lv = is_iq1(t) ? (a > 1) + (a > 7) : t == GGML_IQ3_XXS ? (a - 4) >> 3 : t == GGML_IQ3_S ? (a - 1) >> 1
                 : (a > 8) + (a > 25);
    return lv | (q < 0) << 3;
}

float qiql_value(uint32_t t, float d, int m, int q)
{
    const int ls = (m - 1) / 2;
    if (is_iq1(t)) {   /* q = 8 g +- 1 */
        const int g = (q + (q > 0 ? 4 : -4)) / 8;
        return (d * (float)m) * ((float)g + (q - 8 * g > 0 ? 0.125f : -0.125f));
    }
    const int g = q < 0 ? -q : q;
    float db;
    if (t == GGML_IQ3_S) db = d * (float)m;
    else if (t == GGML_IQ3_XXS) db = (d * (0.5f + (float)ls)) * 0.5f;
    else db = (d * (0.5f + (float)ls)) * 0.25f;
    return (db * (float)g) * (q < 0 ? -1.0f : 1.0f);
}

#define IQL_NX 4    /* activation rows per call, at most (quant_impl.h's QDOT_MAX) */

#ifdef __AVX2__
/* A decoded block's 32 codes as vpdpbusd's operands: *a their magnitudes (unsigned), *sv a vector whose
 * byte signs are theirs (the activations take them by vpsignb). IQ2 / IQ3: the grid rows side by
 * side, the signs a byte mask from neg; IQ1: 8 g +- 1. */
static inline __attribute__((always_inline)) void blk_vec(uint32_t t, const iq_raw *r, __m256i *a, __m256i *sv)
{
    __m256i g;
    if (is_iq3(t)) {
        const uint32_t *grid = t == GGML_IQ3_XXS ? qiq_grid_iq3xxs : qiq_grid_iq3s;
        g = _mm256_setr_epi32((int)grid[r->idx[0]], (int)grid[r->idx[1]], (int)grid[r->idx[2]], (int)grid[r->idx[3]],
                              (int)grid[r->idx[4]], (int)grid[r->idx[5]], (int)grid[r->idx[6]], (int)grid[r->idx[7]]);
    } else {
        const uint64_t *grid = is_iq1(t) ? qiq_grid_iq1s : t == GGML_IQ2_XXS ? qiq_grid_iq2xxs
                             : t == GGML_IQ2_XS ? qiq_grid_iq2xs : qiq_grid_iq2s;
        g = _mm256_setr_epi64x((long long)grid[r->idx[0]], (long long)grid[r->idx[1]], (long long)grid[r->idx[2]],
                               (long long)grid[r->idx[3]]);
    }
    if (is_iq1(t)) {   /* 8 g + 1, minus 2 where the group's delta is negative */
        const __m256i dn = _mm256_setr_epi64x(r->dneg & 1 ? -1 : 0, r->dneg & 2 ? -1 : 0, r->dneg & 4 ? -1 : 0,
                                              r->dneg & 8 ? -1 : 0);
        const __m256i g2 = _mm256_add_epi8(g, g), g4 = _mm256_add_epi8(g2, g2);
        const __m256i g8 = _mm256_add_epi8(_mm256_add_epi8(g4, g4), _mm256_set1_epi8(1));
        *sv = _mm256_sub_epi8(g8, _mm256_and_si256(dn, _mm256_set1_epi8(2)));
        *a = _mm256_abs_epi8(*sv);
        return;
    }
    const __m256i sel = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                         2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    const __m256i s = _mm256_and_si256(_mm256_shuffle_epi8(_mm256_set1_epi32((int)r->neg), sel), bit);
    *sv = _mm256_or_si256(_mm256_cmpeq_epi8(s, bit), _mm256_set1_epi8(1));   /* -1 where negative, else 1 */
    *a = g;                                                                   /* grid values: 1 .. 62 */
}

/* 8 int32 lanes, each the exact sum of 4 products a x sign(sv): |a| <= 62, so maddubs never saturates. */
static inline __m256i dot32(__m256i a, __m256i sv, __m256i x)
{
    const __m256i b = _mm256_sign_epi8(x, sv);
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), a, b);
#elif defined(__AVXVNNI__)
    return _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), a, b);
#else
    return _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1));
#endif
}

/* A block's 32 codes from its decoded vectors (the levels from the magnitudes, bit 3 the sign), as
 * 16 bytes of nibble pairs. */
static inline __attribute__((always_inline)) void blk_codes(uint32_t t, const iq_raw *r, uint8_t out[16])
{
    __m256i a, sv;
    blk_vec(t, r, &a, &sv);
    const __m256i one = _mm256_set1_epi8(1), m7 = _mm256_set1_epi8(7);
    __m256i lv;
    if (is_iq1(t) || t == GGML_IQ2_XXS || t == GGML_IQ2_XS || t == GGML_IQ2_S) {   /* (a > lo) + (a > mid) */
        const int lo = is_iq1(t) ? 1 : 8, mid = is_iq1(t) ? 7 : 25;
        lv = _mm256_sub_epi8(_mm256_setzero_si256(), _mm256_add_epi8(_mm256_cmpgt_epi8(a, _mm256_set1_epi8((char)lo)),
                                                                    _mm256_cmpgt_epi8(a, _mm256_set1_epi8((char)mid))));
    } else if (t == GGML_IQ3_XXS) {
        lv = _mm256_and_si256(_mm256_srli_epi16(_mm256_sub_epi8(a, _mm256_set1_epi8(4)), 3), m7);
    } else {
        lv = _mm256_and_si256(_mm256_srli_epi16(_mm256_sub_epi8(a, one), 1), m7);
    }
    const __m256i neg = _mm256_and_si256(_mm256_cmpgt_epi8(_mm256_setzero_si256(), sv), _mm256_set1_epi8(8));
    const __m256i c = _mm256_or_si256(lv, neg);
    const __m128i nib = _mm_or_si128(_mm256_castsi256_si128(c), _mm_slli_epi16(_mm256_extracti128_si256(c, 1), 4));
    _mm_storeu_si128((__m128i *)out, nib);
}

static inline __attribute__((always_inline)) void dot_t(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb,
                                                        float *res)
{
    const size_t cols = (size_t)x->cols, sbb = sb_bytes(t);
    __m256 acc[IQL_NX];
    for (int k = 0; k < nx; k++) acc[k] = _mm256_setzero_ps();
    for (int s = 0; s < nb / 8; s++) {
        const uint8_t *p = w + (size_t)s * sbb;
        const float d = sb_d(t, p);
        __m256i qa[8], qs[8];
        int32_t ma[8], mb[8];
        float f = 0.0f;
        for (int j = 0; j < 8; j++) {
            iq_raw r;
            int32_t m[2];
            raw_block(t, p, j, &r);
            f = blk_factor(t, &r, d, m);
            ma[j] = m[0];
            mb[j] = m[1];
            blk_vec(t, &r, &qa[j], &qs[j]);
        }
        const __m256i mav = _mm256_loadu_si256((const __m256i *)ma), mbv = _mm256_loadu_si256((const __m256i *)mb);
        const __m256 fv = _mm256_set1_ps(f);
        for (int k = 0; k < nx; k++) {
            const size_t i = (size_t)(i0 + k);
            const int8_t *xq = x->q + i * cols + (size_t)s * 256;
            __m256i sq[8];
            for (int j = 0; j < 8; j++)   /* lanes 0-3: values 0-15, 4-7: 16-31 */
                sq[j] = dot32(qa[j], qs[j], _mm256_loadu_si256((const __m256i *)(xq + 32 * j)));
            const __m256i t0 = _mm256_hadd_epi32(_mm256_hadd_epi32(sq[0], sq[1]), _mm256_hadd_epi32(sq[2], sq[3]));
            const __m256i t1 = _mm256_hadd_epi32(_mm256_hadd_epi32(sq[4], sq[5]), _mm256_hadd_epi32(sq[6], sq[7]));
            /* t0: blocks 0-3's sums over values 0-15 | over 16-31; t1 blocks 4-7's (integer adds: exact) */
            const __m256i lo = _mm256_permute2x128_si256(t0, t1, 0x20), hi = _mm256_permute2x128_si256(t0, t1, 0x31);
            const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(lo, mav), _mm256_mullo_epi32(hi, mbv));
            const __m256 xd = _mm256_loadu_ps(x->qd + i * (size_t)nb + (size_t)s * 8);
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(fv, xd), acc[k]);
        }
    }
    for (int k = 0; k < nx; k++) {
        float P[8];
        _mm256_storeu_ps(P, acc[k]);
        res[k] = ((P[0] + P[4]) + (P[2] + P[6])) + ((P[1] + P[5]) + (P[3] + P[7]));
    }
}

/* one copy of the kernel per type (the layout's branches fold away) */
void qiql_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)
{
    switch (t) {
    case GGML_IQ1_S: dot_t(GGML_IQ1_S, w, x, i0, nx, nb, res); break;
    case GGML_IQ1_M: dot_t(GGML_IQ1_M, w, x, i0, nx, nb, res); break;
    case GGML_IQ2_XXS: dot_t(GGML_IQ2_XXS, w, x, i0, nx, nb, res); break;
    case GGML_IQ2_XS: dot_t(GGML_IQ2_XS, w, x, i0, nx, nb, res); break;
    case GGML_IQ2_S: dot_t(GGML_IQ2_S, w, x, i0, nx, nb, res); break;
    case GGML_IQ3_XXS: dot_t(GGML_IQ3_XXS, w, x, i0, nx, nb, res); break;
    default: dot_t(GGML_IQ3_S, w, x, i0, nx, nb, res); break;
    }
}
#else
static inline void blk_codes(uint32_t t, const iq_raw *r, uint8_t out[16])
{
    int c[32];
    for (int v = 0; v < 32; v++) {
        const int g = grid_val(t, r, v);
        c[v] = code_of(t, is_iq1(t) ? 8 * g + ((r->dneg >> (v / 8)) & 1 ? -1 : 1) : (r->neg >> v) & 1 ? -g : g);
    }
    for (int i = 0; i < 16; i++) out[i] = (uint8_t)(c[i] | c[16 + i] << 4);
}

void qiql_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res)
{
    const size_t cols = (size_t)x->cols;
    float acc[IQL_NX][8] = {{0}};
    for (int b = 0; b < nb; b++) {
        int8_t q[32];
        int32_t m[2];
        float f;
        qiql_block(t, w, b, q, m, &f);
        for (int k = 0; k < nx; k++) {
            const size_t i = (size_t)(i0 + k);
            const int8_t *xq = x->q + i * cols + (size_t)b * 32;
            int32_t sa = 0, sb = 0;
            for (int v = 0; v < 16; v++) {
                sa += q[v] * xq[v];
                sb += q[16 + v] * xq[16 + v];
            }
            acc[k][b % 8] = fmaf((float)(m[0] * sa + m[1] * sb), f * x->qd[i * (size_t)nb + b], acc[k][b % 8]);
        }
    }
    for (int k = 0; k < nx; k++) {
        const float *l = acc[k];
        res[k] = ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
    }
}
#endif

static inline __attribute__((always_inline)) uint16_t transcode_t(uint32_t t, const uint8_t *p, uint8_t codes[8][16],
                                                                  uint8_t m[8][2])
{
    uint16_t d = rd16(p);
    if (t == GGML_IQ1_M) {
        d = 0;
        for (int i = 0; i < 4; i++) d |= (uint16_t)((rd16(p + 48 + 2 * i) >> 12) << (4 * i));
    }
    for (int j = 0; j < 8; j++) {
        iq_raw r;
        raw_block(t, p, j, &r);
        m[j][0] = (uint8_t)(2 * r.ls[0] + 1);
        m[j][1] = (uint8_t)(2 * r.ls[1] + 1);
        blk_codes(t, &r, codes[j]);
    }
    return d;
}

uint16_t qiql_transcode(uint32_t t, const uint8_t *sb, uint8_t codes[8][16], uint8_t m[8][2])
{
    switch (t) {
    case GGML_IQ1_S: return transcode_t(GGML_IQ1_S, sb, codes, m);
    case GGML_IQ1_M: return transcode_t(GGML_IQ1_M, sb, codes, m);
    case GGML_IQ2_XXS: return transcode_t(GGML_IQ2_XXS, sb, codes, m);
    case GGML_IQ2_XS: return transcode_t(GGML_IQ2_XS, sb, codes, m);
    case GGML_IQ2_S: return transcode_t(GGML_IQ2_S, sb, codes, m);
    case GGML_IQ3_XXS: return transcode_t(GGML_IQ3_XXS, sb, codes, m);
    default: return transcode_t(GGML_IQ3_S, sb, codes, m);
    }
}
