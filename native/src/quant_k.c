/* quant_k.c — K-quants and BF16 (see quant_k.h). Block layouts (llama.cpp's ggml-common.h),
 * values v = 0..255 of a super-block:
 *   Q2_K  84 B: scales[16] (lo 4 bits: scale, hi 4: min of sub-block v/16), qs[64], d, dmin.
 *               q(v) = (qs[32c + i] >> 2s) & 3 with v = 128c + 32s + i.  y = d sc q - dmin m
 *   Q3_K 110 B: hmask[32], qs[64], scales[12] (16 6-bit values, offset 32), d.
 *               q(v) = ((qs[32c + i] >> 2s) & 3) - 4 * !(hmask[i] >> (4c + s) & 1).  y = d sc q
 *   Q4_K 144 B: d, dmin, scales[12] (8 6-bit scales and mins), qs[128].
 *               q(v) = (qs[32c + i] >> 4h) & 15 with v = 64c + 32h + i.  y = d sc q - dmin m
 *   Q5_K 176 B: d, dmin, scales[12], qh[32], qs[128]: Q4_K's q | ((qh[i] >> (v / 32)) & 1) << 4
 *   Q6_K 210 B: ql[128], qh[64], scales[16] (int8), d.
 *               q(v) = ((ql[64c + t] >> 4h) & 15 | ((qh[32c + i] >> 2s) & 3) << 4) - 32
 *               with v = 128c + 64h + t = 128c + 32s + i.  y = d sc q
 * The float operations are numpy's (dl = d * sc, ml = dmin * m, y = dl * q - ml; no fma: this
 * file is compiled without contraction, -std=c11), so the values are gguf's bit for bit. */
#include "quant_k.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define Q2K_BYTES 84
#define Q3K_BYTES 110
#define Q4K_BYTES 144
#define Q5K_BYTES 176
#define Q6K_BYTES 210

static inline float h2f(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

int qk_is_k(uint32_t t) { return t >= 10 && t <= 14; }   /* GGML Q2_K .. Q6_K */

/* ---- unpacking one super-block: integer values q[256] and sub-block scales ---- */

/* Q4_K / Q5_K: 6-bit scale and min of sub-block j (of 8). */
static inline void scale_min_k4(const uint8_t *s, int j, int *sc, int *m) {
    if (j < 4) {
        *sc = s[j] & 63;
        *m = s[j + 4] & 63;
    } else {
        *sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
        *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
    }
}

/* Q3_K: signed scale of sub-block k (of 16). */
static inline int scale_k3(const uint8_t *s, int k) {
    int l = k < 8 ? s[k] & 15 : s[k - 8] >> 4;
    int h = (s[8 + (k & 3)] >> (2 * (k >> 2))) & 3;
    return (l | h << 4) - 32;
}

typedef struct {
    int8_t q[QK_K];
    int sc[16], m[16];      /* per sub-block: 8 of 32 values (Q4_K, Q5_K) or 16 of 16 */
    float d, dmin;
} kblock;

static void unpack_q2k(const uint8_t *b, kblock *k) {
    const uint8_t *qs = b + 16;
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 32; i++) k->q[128 * c + 32 * s + i] = (int8_t)((qs[32 * c + i] >> (2 * s)) & 3);
    for (int j = 0; j < 16; j++) {
        k->sc[j] = b[j] & 15;
        k->m[j] = b[j] >> 4;
    }
    k->d = h2f(b + 80);
    k->dmin = h2f(b + 82);
}

static void unpack_q3k(const uint8_t *b, kblock *k) {
    const uint8_t *hm = b, *qs = b + 32, *sc = b + 96;
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 32; i++) {
                int lo = (qs[32 * c + i] >> (2 * s)) & 3;
                int hb = (hm[i] >> (4 * c + s)) & 1;
                k->q[128 * c + 32 * s + i] = (int8_t)(lo - (hb ? 0 : 4));
            }
    for (int j = 0; j < 16; j++) k->sc[j] = scale_k3(sc, j);
    k->d = h2f(b + 108);
}

static void unpack_q45k(const uint8_t *b, kblock *k, int five) {
    const uint8_t *sc = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int c = 0; c < 4; c++)
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 32; i++) k->q[64 * c + 32 * h + i] = (int8_t)((qs[32 * c + i] >> (4 * h)) & 15);
    if (five)
        for (int j = 0; j < 8; j++)
            for (int i = 0; i < 32; i++) k->q[32 * j + i] |= (int8_t)(((qh[i] >> j) & 1) << 4);
    for (int j = 0; j < 8; j++) scale_min_k4(sc, j, &k->sc[j], &k->m[j]);
    k->d = h2f(b);
    k->dmin = h2f(b + 2);
}

static void unpack_q6k(const uint8_t *b, kblock *k) {
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    for (int c = 0; c < 2; c++)
        for (int h = 0; h < 2; h++)
            for (int t = 0; t < 64; t++) k->q[128 * c + 64 * h + t] = (int8_t)((ql[64 * c + t] >> (4 * h)) & 15);
    for (int c = 0; c < 2; c++)
        for (int s = 0; s < 4; s++)
            for (int i = 0; i < 32; i++)
                k->q[128 * c + 32 * s + i] = (int8_t)((k->q[128 * c + 32 * s + i] | (((qh[32 * c + i] >> (2 * s)) & 3) << 4)) - 32);
    for (int j = 0; j < 16; j++) k->sc[j] = sc[j];
    k->d = h2f(b + 208);
}

static size_t kbytes(uint32_t t) {
    switch (t) {
    case 10: return Q2K_BYTES;
    case 11: return Q3K_BYTES;
    case 12: return Q4K_BYTES;
    case 13: return Q5K_BYTES;
    case 14: return Q6K_BYTES;
    default: return 0;
    }
}

static void unpack(uint32_t t, const uint8_t *b, kblock *k) {
    switch (t) {
    case 10: unpack_q2k(b, k); break;
    case 11: unpack_q3k(b, k); break;
    case 12: unpack_q45k(b, k, 0); break;
    case 13: unpack_q45k(b, k, 1); break;
    default: unpack_q6k(b, k); break;
    }
}

void qk_unpack(uint32_t t, const uint8_t *blk, int8_t q[QK_K], int sc[16], int m[16], float *d, float *dmin) {
    kblock k;
    memset(&k, 0, sizeof k);
    unpack(t, blk, &k);
    memcpy(q, k.q, QK_K);
    memcpy(sc, k.sc, sizeof k.sc);
    memcpy(m, k.m, sizeof k.m);
    *d = k.d;
    *dmin = k.dmin;
}

void qk_q4k_raw(const uint8_t *sb, int sub, int *sc, int *m, uint8_t qs16[16]) {
    scale_min_k4(sb + 4, sub, sc, m);
    const uint8_t *qs = sb + 16 + 32 * (sub / 2);
    const int sh = 4 * (sub % 2);
    for (int t = 0; t < 16; t++) qs16[t] = (uint8_t)(((qs[t] >> sh) & 15) | (((qs[t + 16] >> sh) & 15) << 4));
}

void qk_k4_scales(const uint8_t *sb, uint8_t sc[8], uint8_t m[8]) {
    /* scale_min_k4 on four sub-blocks at once, a byte per lane */
    uint32_t a, b, c;
    memcpy(&a, sb + 4, 4);
    memcpy(&b, sb + 8, 4);
    memcpy(&c, sb + 12, 4);
    const uint32_t s03 = a & 0x3f3f3f3fu, m03 = b & 0x3f3f3f3fu;
    const uint32_t s47 = (c & 0x0f0f0f0fu) | ((a >> 6) & 0x03030303u) << 4;
    const uint32_t m47 = ((c >> 4) & 0x0f0f0f0fu) | ((b >> 6) & 0x03030303u) << 4;
    memcpy(sc, &s03, 4);
    memcpy(sc + 4, &s47, 4);
    memcpy(m, &m03, 4);
    memcpy(m + 4, &m47, 4);
}

void qk_q4k_block(const uint8_t *sb, int sub, float *dl, float *ml, uint8_t qs16[16]) {
    int sc, m;
    scale_min_k4(sb + 4, sub, &sc, &m);
    *dl = h2f(sb) * (float)sc;
    *ml = -(h2f(sb + 2) * (float)m);
    const uint8_t *qs = sb + 16 + 32 * (sub / 2);
    const int sh = 4 * (sub % 2);
    for (int t = 0; t < 16; t++) qs16[t] = (uint8_t)(((qs[t] >> sh) & 15) | (((qs[t + 16] >> sh) & 15) << 4));
}

/* ---- dequantization ---- */

void qk_dequant(uint32_t t, const uint8_t *row, float *out, int n) {
    if (t == 30) {   /* BF16 */
        for (int j = 0; j < n; j++) {
            uint32_t u = (uint32_t)(row[2 * j] | row[2 * j + 1] << 8) << 16;
            memcpy(&out[j], &u, 4);
        }
        return;
    }
    const size_t bb = kbytes(t);
    kblock k;
    for (int s = 0; s < n / QK_K; s++, row += bb, out += QK_K) {
        unpack(t, row, &k);
        if (t == 12 || t == 13) {
            for (int j = 0; j < 8; j++) {
                const float dl = k.d * (float)k.sc[j], ml = k.dmin * (float)k.m[j];
                for (int i = 0; i < 32; i++) out[32 * j + i] = dl * (float)k.q[32 * j + i] - ml;
            }
        } else if (t == 10) {
            for (int j = 0; j < 16; j++) {
                const float dl = k.d * (float)k.sc[j], ml = k.dmin * (float)k.m[j];
                for (int i = 0; i < 16; i++) out[16 * j + i] = dl * (float)k.q[16 * j + i] - ml;
            }
        } else {
            for (int j = 0; j < 16; j++) {
                const float dl = k.d * (float)k.sc[j];
                for (int i = 0; i < 16; i++) out[16 * j + i] = dl * (float)k.q[16 * j + i];
            }
        }
    }
}

/* ---- dot kernels ----
 * A super-block as 8 blocks of 32 unsigned codes u (q = u - off) and int16 scales per 16-value
 * half (Q4_K/Q5_K: 1, their scale is applied in float); each block's exact integer sum
 * isum_b = sum over the block of scale_half (u - off) x_q, then the lane-b float fix-ups. */
typedef struct {
    uint8_t u[QK_K];
    int16_t hs[16];         /* integer scale of each 16-value half */
    int16_t hm[16];         /* Q2_K: min of each half */
    float lmul[8];          /* Q4_K/Q5_K: d sc_b; others: d */
    float lmin[8];          /* Q4_K/Q5_K: dmin m_b; Q2_K: dmin; others 0 */
    int off;                /* q = u - off */
} kcodes;

#ifdef __AVX2__
/* The codes of Q4_K (five = 0), Q5_K and Q6_K straight from the block, 32 at a time. */
static void codes_simd(uint32_t t, const uint8_t *blk, uint8_t *u) {
    const __m256i m4 = _mm256_set1_epi8(15), m2 = _mm256_set1_epi8(3);
    if (t == 12 || t == 13) {
        const uint8_t *qs = blk + (t == 13 ? 48 : 16);
        const __m256i qh = _mm256_loadu_si256((const __m256i *)(blk + 16));
        for (int c = 0; c < 4; c++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(qs + 32 * c));
            __m256i lo = _mm256_and_si256(v, m4), hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
            if (t == 13) {   /* bit j of qh[i] is bit 4 of value 32j + i */
                const __m256i b0 = _mm256_set1_epi8((char)(1 << (2 * c))), b1 = _mm256_set1_epi8((char)(1 << (2 * c + 1)));
                const __m256i h16 = _mm256_set1_epi8(16);
                lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b0), b0), h16));
                hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(qh, b1), b1), h16));
            }
            _mm256_storeu_si256((__m256i *)(u + 64 * c), lo);
            _mm256_storeu_si256((__m256i *)(u + 64 * c + 32), hi);
        }
        return;
    }
    /* Q6_K */
    for (int c = 0; c < 2; c++) {
        const __m256i l0 = _mm256_loadu_si256((const __m256i *)(blk + 64 * c));
        const __m256i l1 = _mm256_loadu_si256((const __m256i *)(blk + 64 * c + 32));
        const __m256i h = _mm256_loadu_si256((const __m256i *)(blk + 128 + 32 * c));
        const __m256i q0 = _mm256_and_si256(l0, m4), q1 = _mm256_and_si256(l1, m4);
        const __m256i q2 = _mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), q3 = _mm256_and_si256(_mm256_srli_epi16(l1, 4), m4);
        const __m256i h0 = _mm256_slli_epi16(_mm256_and_si256(h, m2), 4);
        const __m256i h1 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4);
        const __m256i h2 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4);
        const __m256i h3 = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4);
        _mm256_storeu_si256((__m256i *)(u + 128 * c), _mm256_or_si256(q0, h0));
        _mm256_storeu_si256((__m256i *)(u + 128 * c + 32), _mm256_or_si256(q1, h1));
        _mm256_storeu_si256((__m256i *)(u + 128 * c + 64), _mm256_or_si256(q2, h2));
        _mm256_storeu_si256((__m256i *)(u + 128 * c + 96), _mm256_or_si256(q3, h3));
    }
}

/* Scales only (the codes come from codes_simd). */
static void scales_only(uint32_t t, const uint8_t *b, kblock *k) {
    if (t == 14) {
        for (int j = 0; j < 16; j++) k->sc[j] = ((const int8_t *)(b + 192))[j];
        k->d = h2f(b + 208);
        k->dmin = 0.0f;
        return;
    }
    for (int j = 0; j < 8; j++) scale_min_k4(b + 4, j, &k->sc[j], &k->m[j]);
    k->d = h2f(b);
    k->dmin = h2f(b + 2);
}
#endif

static void codes(uint32_t t, const uint8_t *blk, kcodes *c) {
    kblock k;
    c->off = t == 14 ? 32 : t == 11 ? 4 : 0;
#ifdef __AVX2__
    if (t >= 12) {
        scales_only(t, blk, &k);
        codes_simd(t, blk, c->u);
    } else
#endif
    {
        unpack(t, blk, &k);
        for (int v = 0; v < QK_K; v++) c->u[v] = (uint8_t)(k.q[v] + c->off);
    }
    const int k45 = t == 12 || t == 13;
    for (int h = 0; h < 16; h++) {
        c->hs[h] = (int16_t)(k45 ? 1 : k.sc[h]);
        c->hm[h] = (int16_t)(t == 10 ? k.m[h] : 0);
    }
    for (int b = 0; b < 8; b++) {
        if (t == 12 || t == 13) {
            c->lmul[b] = k.d * (float)k.sc[b];
            c->lmin[b] = k.dmin * (float)k.m[b];
        } else {
            c->lmul[b] = k.d;
            c->lmin[b] = t == 10 ? k.dmin : 0.0f;
        }
    }
}

/* isum[b], msum[b] (Q2_K) of the 8 blocks against one activation row's 256 int8 values. */
static inline void block_sums(const kcodes *c, const int8_t *x, int32_t *isum, int32_t *msum) {
    for (int b = 0; b < 8; b++) {
        int32_t h[2] = {0, 0}, xm[2] = {0, 0};
        for (int i = 0; i < 32; i++) {
            h[i >> 4] += ((int32_t)c->u[32 * b + i] - c->off) * x[32 * b + i];
            xm[i >> 4] += x[32 * b + i];
        }
        isum[b] = c->hs[2 * b] * h[0] + c->hs[2 * b + 1] * h[1];
        msum[b] = c->hm[2 * b] * xm[0] + c->hm[2 * b + 1] * xm[1];
    }
}

/* BF16: the row converted to floats, then qdot_exact with each float activation row (any cols). */
static _Thread_local float *bf_buf;
static _Thread_local size_t bf_cap;

static void qk_dot_bf16(const uint8_t *w, const qact *x, int i0, int nx, float *res) {
    const int cols = x->cols;
    if ((size_t)cols > bf_cap) {
        free(bf_buf);
        bf_buf = aligned_alloc(64, ((size_t)cols * sizeof(float) + 63) & ~(size_t)63);
        bf_cap = bf_buf ? (size_t)cols : 0;
        if (!bf_buf) {
            fprintf(stderr, "qmat_mul: out of memory\n");
            abort();
        }
    }
    qk_dequant(30, w, bf_buf, cols);
    for (int k = 0; k < nx; k++) res[k] = qdot_exact(bf_buf, x->f + (size_t)(i0 + k) * cols, cols);
}

/* Q2_K .. Q6_K: one accumulator per output, blocks in order (quant_k.h's canonical order, the packed
 * tiles'). The engine runs these types packed (every K-quant shape packs); this row kernel is their
 * reference in the same order. */
void qk_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) {
    if (t == 30) {
        qk_dot_bf16(w, x, i0, nx, res);
        return;
    }
    const int cols = nb * 32;
    const size_t bb = kbytes(t);
    float acc[4] = {0, 0, 0, 0};
    kcodes kc;
    int32_t isum[8], msum[8];
    for (int s = 0; s < nb / 8; s++, w += bb) {
        codes(t, w, &kc);
        for (int k = 0; k < nx; k++) {
            const size_t r = (size_t)(i0 + k);
            const float *xd = x->qd + r * nb + (size_t)s * 8, *xs = x->qs + r * nb + (size_t)s * 8;
            block_sums(&kc, x->q + r * cols + (size_t)s * QK_K, isum, msum);
            for (int b = 0; b < 8; b++) {
                acc[k] = fmaf((float)isum[b], kc.lmul[b] * xd[b], acc[k]);
                if (t == 12 || t == 13) acc[k] = fmaf(-kc.lmin[b], xs[b], acc[k]);
                else if (t == 10) acc[k] = fmaf(-(float)msum[b], kc.lmin[b] * xd[b], acc[k]);
            }
        }
    }
    for (int k = 0; k < nx; k++) res[k] = acc[k];
}
