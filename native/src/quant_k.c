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

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* ---- dot kernels ---- */

/* The exact integer sums of q[i] * x[i] over values 0..15 (*lo) and 16..31 (*hi) of a block. */
static inline void isum2(const int8_t *q, const int8_t *x, int32_t *lo, int32_t *hi) {
#ifdef __AVX2__
    const __m256i w = _mm256_loadu_si256((const __m256i *)q), a = _mm256_loadu_si256((const __m256i *)x);
    /* |w| * (x with w's sign): |q| <= 32, |x| <= 127, so a pair fits int16 */
    __m256i p = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(a, w)),
                                  _mm256_set1_epi16(1));
    __m128i l = _mm256_castsi256_si128(p), h = _mm256_extracti128_si256(p, 1);
    __m128i t = _mm_hadd_epi32(l, h);            /* l0+l1 l2+l3 h0+h1 h2+h3 */
    t = _mm_hadd_epi32(t, t);
    *lo = _mm_cvtsi128_si32(t);
    *hi = _mm_extract_epi32(t, 1);
#else
    int32_t s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) s0 += (int32_t)q[i] * x[i];
    for (int i = 16; i < 32; i++) s1 += (int32_t)q[i] * x[i];
    *lo = s0;
    *hi = s1;
#endif
}

static inline void xsum2(const int8_t *x, int32_t *lo, int32_t *hi) {
    int32_t s0 = 0, s1 = 0;
    for (int i = 0; i < 16; i++) s0 += x[i];
    for (int i = 16; i < 32; i++) s1 += x[i];
    *lo = s0;
    *hi = s1;
}

#define QK_NX 4     /* activation rows per call, at most (quant.c's QDOT_MAX) */

static _Thread_local float *bf_buf;
static _Thread_local size_t bf_cap;

void qk_dot(uint32_t t, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res) {
    const int cols = nb * 32;
    if (t == 30) {
        if ((size_t)cols > bf_cap) {
            free(bf_buf);
            bf_buf = aligned_alloc(64, ((size_t)cols * sizeof(float) + 63) & ~(size_t)63);
            bf_cap = bf_buf ? (size_t)cols : 0;
            if (!bf_buf) {
                fprintf(stderr, "qmat_mul: out of memory\n");
                abort();
            }
        }
        qk_dequant(t, w, bf_buf, cols);
        for (int k = 0; k < nx; k++) res[k] = qdot_exact(bf_buf, x->f + (size_t)(i0 + k) * cols, cols);
        return;
    }
    const size_t bb = kbytes(t);
    float acc[QK_NX] = {0, 0, 0, 0};
    kblock kb;
    for (int s = 0; s < nb / 8; s++, w += bb) {
        unpack(t, w, &kb);
        for (int k = 0; k < nx; k++) {
            const size_t r = (size_t)(i0 + k);
            const int8_t *xq = x->q + r * cols + (size_t)s * QK_K;
            const float *xd = x->qd + r * nb + (size_t)s * 8, *xs = x->qs + r * nb + (size_t)s * 8;
            float a = acc[k];
            for (int b = 0; b < 8; b++) {
                int32_t lo, hi;
                isum2(kb.q + 32 * b, xq + 32 * b, &lo, &hi);
                if (t == 12 || t == 13) {
                    const float dl = kb.d * (float)kb.sc[b], ml = kb.dmin * (float)kb.m[b];
                    a = fmaf((float)(lo + hi), dl * xd[b], a);
                    a = fmaf(-ml, xs[b], a);
                } else {
                    const int32_t is = kb.sc[2 * b] * lo + kb.sc[2 * b + 1] * hi;
                    a = fmaf((float)is, kb.d * xd[b], a);
                    if (t == 10) {
                        int32_t xl, xh;
                        xsum2(xq + 32 * b, &xl, &xh);
                        a = fmaf(-(float)(kb.m[2 * b] * xl + kb.m[2 * b + 1] * xh), kb.dmin * xd[b], a);
                    }
                }
            }
            acc[k] = a;
        }
    }
    for (int k = 0; k < nx; k++) res[k] = acc[k];
}
