/* quant_tile.c — the packed tiles: 1-2 groups of 8 weight rows x 1-4 input rows in 256-bit
 * registers (AVX2, vpdpbusd where VNNI has it), and pk_tile, which picks a tile for a type.
 * Owns: pk_q41k (Q4_1, Q4_K, Q5_K, Q5_0, Q5_1), pk_q6k (Q6_K), pk_q23k (Q2_K, Q3_K), pk_q80, pk_fp4 (MXFP4),
 * pk_iql (IQ1_S … IQ3_S), pk_f16, pk_bf16, pk_tile. The 512-bit tiles are in quant_tile_zmm.c, the portable one in quant_tile_scalar.c;
 * all follow the canonical order of quant_impl.h / quant_k.h (bit-identical). */
#include "quant_tile.h"
#include "quant_iqlow.h"

/* Kernel: res[k * 8 * NG + g * 8 + j] = output (row j of group gp[g], input row i0 + k)
 * for g < NG, k < NX. */
#ifdef __AVX2__
/* kq: 0 Q4_1, 1 Q4_K, 2 Q5_K, 3 Q5_0, 4 Q5_1 (the Q4_1-like layouts: nibble vectors, Q5_x's H vector). */
#define KQ_TYPE(kq) ((kq) == 4 ? GGML_Q5_1 : (kq) == 3 ? GGML_Q5_0 : (kq) == 2 ? GGML_Q5_K : (kq) ? GGML_Q4_K : GGML_Q4_1)

/* The codes of values 4t..4t+3 (lo) and 16+4t.. (hi) of the 8 rows of packed block bp. */
FORCE_INLINE void q41_codes(uint32_t T, const uint8_t *bp, int t, __m256i *lo, __m256i *hi)
{
    const __m256i m15 = _mm256_set1_epi8(15), m16 = _mm256_set1_epi8(16);
    const __m256i v = _mm256_loadu_si256((const __m256i *)(bp + PK_NIB(T) + 32 * t));
    *lo = _mm256_and_si256(v, m15);
    *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
    if (T == GGML_Q5_K || T == GGML_Q5_0 || T == GGML_Q5_1) {   /* bit 4 of the codes from the H vector */
        const __m256i H = _mm256_loadu_si256((const __m256i *)(bp + PK_HOFF(T)));
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(_mm256_slli_epi16(H, 4 - t), m16));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(t ? _mm256_srli_epi16(H, t) : H, m16));
    }
}

/* The 8 rows' float scale dw and min term mw (zero for Q5_0) of block b of group g; the K types
 * from their super-block's d, dm (k4_super, converted once per 8 blocks). */
FORCE_INLINE void q41_scales(uint32_t T, const uint8_t *g, int b, __m256 d, __m256 dm, __m256 *dw, __m256 *mw)
{
    if (T == GGML_Q4_K || T == GGML_Q5_K) {
        k4_scales(T, g, b, d, dm, dw, mw);
        return;
    }
    const uint8_t *gb = pk_blk(T, g, b);
    *dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)gb));
    *mw = T == GGML_Q5_0 ? _mm256_setzero_ps() : _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gb + 16)));
}

FORCE_INLINE void pk_q41k(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                          float *res, const int kq)
{
    const uint32_t T = KQ_TYPE(kq);
    const int five = kq >= 2;   /* 5-bit codes: plain AVX2 widens the int16 sums at every step */
    (void)five;
    const int8_t *xq[4];
    const float *xd[4], *xs[4];
    const int32_t *xi[4];
    act_rows(x, i0, NX, nb, xq, xd, xs, kq == 3 ? xi : NULL);
    __m256 acc[2][4], sd[2], sdm[2];
    for (int g = 0; g < NG; g++) {
        sd[g] = sdm[g] = _mm256_setzero_ps();
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    }
    for (int b = 0; b < nb; b++) {
        if ((kq == 1 || kq == 2) && b % 8 == 0)
            for (int g = 0; g < NG; g++) k4_super(T, gp[g], b, &sd[g], &sdm[g]);
        __m256i is[2][4];
        for (int g = 0; g < NG; g++)
            for (int k = 0; k < NX; k++) is[g][k] = _mm256_setzero_si256();
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            if (t < 3)
                for (int g = 0; g < NG; g++) _mm_prefetch((const char *)pk_blk(T, gp[g], b) + 64 * t + PK_PFD, PK_HINT);
            for (int g = 0; g < NG; g++) q41_codes(T, pk_blk(T, gp[g], b), t, &lo[g], &hi[g]);
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                __m256i xl = bc4(xk), xh = bc4(xk + 16);
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
                for (int g = 0; g < NG; g++) is[g][k] = pk_dot4(pk_dot4(is[g][k], lo[g], xl), hi[g], xh);
#else
                /* int16 partial sums over the whole block, widened once after it: a pair
                 * of products is at most 2 * 15 * 127 = 3810, eight pairs 30480 < 2^15 (5-bit
                 * codes would not fit: widened at every step) */
                for (int g = 0; g < NG; g++)
                    is[g][k] = five ? pk_dot4(pk_dot4(is[g][k], lo[g], xl), hi[g], xh)
                                    : _mm256_add_epi16(is[g][k], _mm256_add_epi16(_mm256_maddubs_epi16(lo[g], xl),
                                                                                  _mm256_maddubs_epi16(hi[g], xh)));
#endif
            }
        }
#if !((defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__))
        if (!five)
            for (int g = 0; g < NG; g++)
                for (int k = 0; k < NX; k++) is[g][k] = _mm256_madd_epi16(is[g][k], _mm256_set1_epi16(1));
#endif
        for (int g = 0; g < NG; g++) {
            __m256 dw, mw;
            q41_scales(T, gp[g], b, sd[g], sdm[g], &dw, &mw);
            for (int k = 0; k < NX; k++) {
                __m256 s = _mm256_mul_ps(dw, _mm256_set1_ps(xd[k][b]));
                __m256i isk = is[g][k];
                if (kq == 3) isk = _mm256_sub_epi32(isk, _mm256_set1_epi32(16 * xi[k][b]));   /* Q5_0: codes - 16 */
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isk), s, acc[g][k]);
                if (kq != 3) acc[g][k] = _mm256_fmadd_ps(mw, _mm256_set1_ps(xs[k][b]), acc[g][k]);
            }
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

/* Q6_K: codes (0..63) of values 4t..4t+3 (lo) and 16+4t.. (hi) of the 8 rows of packed block bp
 * (quant_impl.h: C_2t, C_2t+1; t = 3 gathers C_6, C_7 from the six vectors' bits 6-7). */
FORCE_INLINE __m256i k6_ld(const uint8_t *bp, int i) { return _mm256_loadu_si256((const __m256i *)(bp + 16 + 32 * i)); }
FORCE_INLINE __m256i k6_top(const uint8_t *bp, int i0)
{
    const __m256i m3 = _mm256_set1_epi8(3), m12 = _mm256_set1_epi8(12), m48 = _mm256_set1_epi8(48);
    return _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(k6_ld(bp, i0), 6), m3),
                                           _mm256_and_si256(_mm256_srli_epi16(k6_ld(bp, i0 + 1), 4), m12)),
                           _mm256_and_si256(_mm256_srli_epi16(k6_ld(bp, i0 + 2), 2), m48));
}
FORCE_INLINE void k6_codes(const uint8_t *bp, int t, __m256i *lo, __m256i *hi)
{
    if (t == 3) {
        *lo = k6_top(bp, 0);
        *hi = k6_top(bp, 3);
        return;
    }
    const __m256i m63 = _mm256_set1_epi8(63);
    *lo = _mm256_and_si256(k6_ld(bp, 2 * t), m63);
    *hi = _mm256_and_si256(k6_ld(bp, 2 * t + 1), m63);
}

/* Step t (values 4t..4t+3) of block b's two 16-value halves, shared by the Q6_K and Q2_K/Q3_K
 * tiles: every input row's broadcast activations against each group's low / high code vectors. */
FORCE_INLINE void k_halves_step(__m256i ia[2][4], __m256i ib[2][4], const __m256i lo[2], const __m256i hi[2],
                                const int8_t *const *xq, int b, int t, const int NG, const int NX)
{
    for (int k = 0; k < NX; k++) {
        const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
        const __m256i xl = bc4(xk), xh = bc4(xk + 16);
        for (int g = 0; g < NG; g++) {
            ia[g][k] = pk_dot4(ia[g][k], lo[g], xl);
            ib[g][k] = pk_dot4(ib[g][k], hi[g], xh);
        }
    }
}

/* Q6_K tile (layout at PK_K6_SB): per block the two halves' exact sums (vpdpbusd of the codes),
 * the offset 32 and the int8 scales applied in int32, then Q4_1's float step. */
FORCE_INLINE void pk_q6k(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                         float *res)
{
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xi[8], *xh[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    act_hrows(x, i0, NX, nb, xh);
    __m256 acc[2][4], dv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (b % 8 == 0)
            for (int g = 0; g < NG; g++)
                dv[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + (size_t)(b / 8) * PK_K6_SB)));
        __m256i ia[2][4], ib[2][4];
        const uint8_t *bp[2];
        for (int g = 0; g < NG; g++) {
            for (int k = 0; k < NX; k++) {   /* start at -32 * (the halves' activation sums) */
                ia[g][k] = _mm256_set1_epi32(-K6OFF * xh[k][b]);
                ib[g][k] = _mm256_set1_epi32(-K6OFF * (xi[k][b] - xh[k][b]));
            }
            bp[g] = pk_blk(GGML_Q6_K, gp[g], b);
            for (int l = 0; l < 4; l++) _mm_prefetch((const char *)bp[g] + 64 * l + PK_PFD, PK_HINT);   /* 208 bytes */
        }
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            for (int g = 0; g < NG; g++) k6_codes(bp[g], t, &lo[g], &hi[g]);
            k_halves_step(ia, ib, lo, hi, xq, b, t, NG, NX);
        }
        for (int k = 0; k < NX; k++) {
            const __m256 xs = _mm256_set1_ps(xd[k][b]);
            for (int g = 0; g < NG; g++) {
                const __m256i sca = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)bp[g]));
                const __m256i scb = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(bp[g] + 8)));
                const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(ia[g][k], sca), _mm256_mullo_epi32(ib[g][k], scb));
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv[g], xs), acc[g][k]);
            }
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

/* Q2_K / Q3_K: codes of values 4t..4t+3 (lo) and 16+4t.. (hi) of the 8 rows of packed block bp. */
FORCE_INLINE void k23_codes(uint32_t T, const uint8_t *bp, int t, __m256i *lo, __m256i *hi)
{
    const __m256i m3 = _mm256_set1_epi8(3);
    const uint8_t *c = bp + K23SC(T);
    *lo = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)c), 2 * t), m3);
    *hi = _mm256_and_si256(_mm256_srli_epi16(_mm256_loadu_si256((const __m256i *)(c + 32)), 2 * t), m3);
    if (T == GGML_Q3_K) {    /* bit t (lo) and 4 + t (hi) of H to bit 2: one shift and a mask each */
        const __m256i H = _mm256_loadu_si256((const __m256i *)(c + 64)), m4 = _mm256_set1_epi8(4);
        const __m256i hl = t < 3 ? _mm256_slli_epi16(H, 2 - t) : _mm256_srli_epi16(H, 1);
        *lo = _mm256_or_si256(*lo, _mm256_and_si256(hl, m4));
        *hi = _mm256_or_si256(*hi, _mm256_and_si256(_mm256_srli_epi16(H, 2 + t), m4));
    }
}

/* One block's float step of a Q2_K / Q3_K output lane set (quant_impl.h's order). */
FORCE_INLINE __m256 k23_step(uint32_t T, __m256 acc, __m256i ia, __m256i ib, int32_t sa, int32_t sb, __m256i sca,
                             __m256i scb, __m256i ma, __m256i mb, __m256 dv, __m256 mv, __m256 xs)
{
    const int off = K23OFF(T);
    const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(_mm256_sub_epi32(ia, _mm256_set1_epi32(off * sa)), sca),
                                        _mm256_mullo_epi32(_mm256_sub_epi32(ib, _mm256_set1_epi32(off * sb)), scb));
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv, xs), acc);
    if (T != GGML_Q2_K) return acc;
    const __m256i ms = _mm256_add_epi32(_mm256_mullo_epi32(ma, _mm256_set1_epi32(sa)), _mm256_mullo_epi32(mb, _mm256_set1_epi32(sb)));
    return _mm256_fmadd_ps(_mm256_xor_ps(_mm256_cvtepi32_ps(ms), _mm256_set1_ps(-0.0f)), _mm256_mul_ps(mv, xs), acc);
}

/* Q2_K / Q3_K tile (their own layouts, quant_impl.h): the two halves' exact sums of the 2- or
 * 3-bit codes, Q3_K's offset 4, the scales (and Q2_K's mins) in int32, then the float steps. */
FORCE_INLINE void pk_q23k(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                          float *res, const uint32_t T)
{
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xi[8], *xh[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    act_hrows(x, i0, NX, nb, xh);
    __m256 acc[2][4], dv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, mv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *bp[2];
        __m256i ia[2][4], ib[2][4];
        for (int g = 0; g < NG; g++) {
            const uint8_t *hd = gp[g] + (size_t)(b / 8) * K23SB(T);
            if (b % 8 == 0) dv[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)hd));
            if (b % 8 == 0 && T == GGML_Q2_K) mv[g] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(hd + 16)));
            bp[g] = pk_blk(T, gp[g], b);
            _mm_prefetch((const char *)bp[g] + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 64 + PK_PFD, PK_HINT);
            for (int k = 0; k < NX; k++) ia[g][k] = ib[g][k] = _mm256_setzero_si256();
        }
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            for (int g = 0; g < NG; g++) k23_codes(T, bp[g], t, &lo[g], &hi[g]);
            k_halves_step(ia, ib, lo, hi, xq, b, t, NG, NX);
        }
        __m256i sca[2], scb[2], ma[2], mb[2];
        for (int g = 0; g < NG; g++) k23_scales(T, bp[g], &sca[g], &scb[g], &ma[g], &mb[g]);
        for (int k = 0; k < NX; k++) {
            const int32_t sa = xh[k][b], sb = xi[k][b] - sa;
            const __m256 xs = _mm256_set1_ps(xd[k][b]);
            for (int g = 0; g < NG; g++)
                acc[g][k] = k23_step(T, acc[g][k], ia[g][k], ib[g][k], sa, sb, sca[g], scb[g], ma[g], mb[g], dv[g], mv[g], xs);
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

#define pk_q3k(gp, NG, x, i0, NX, nb, res) pk_q23k(gp, NG, x, i0, NX, nb, res, GGML_Q3_K)
#define pk_q2k(gp, NG, x, i0, NX, nb, res) pk_q23k(gp, NG, x, i0, NX, nb, res, GGML_Q2_K)
#define pk_q41(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 0)
#define pk_q4k(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 1)
#define pk_q5k(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 2)
#define pk_q50(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 3)
#define pk_q51(gp, NG, x, i0, NX, nb, res) pk_q41k(gp, NG, x, i0, NX, nb, res, 4)

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

/* MXFP4 (layout in quant_impl.h): the codes through the table kv + 12 (one byte shuffle per nibble
 * vector), sums started at -12 * sum(x_q), then Q8_0's float step with the rows' scale(e). */
FORCE_INLINE void pk_fp4(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                         float *res)
{
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xi[4];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    const __m256i tbl = fp4_table(), m15 = _mm256_set1_epi8(15);
    __m256 acc[2][4];
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *bp[2];
        __m256i is[2][4];
        for (int g = 0; g < NG; g++) {
            bp[g] = pk_blk(GGML_MXFP4, gp[g], b);
            _mm_prefetch((const char *)bp[g] + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 64 + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 128 + PK_PFD, PK_HINT);
        }
        for (int k = 0; k < NX; k++) {
            const __m256i c = _mm256_set1_epi32(-FP4_OFF * xi[k][b]);
            for (int g = 0; g < NG; g++) is[g][k] = c;
        }
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            for (int g = 0; g < NG; g++) {
                const __m256i v = _mm256_loadu_si256((const __m256i *)(bp[g] + PK_NIB(GGML_MXFP4) + 32 * t));
                lo[g] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v, m15));
                hi[g] = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v, 4), m15));
            }
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                const __m256i xl = bc4(xk), xh = bc4(xk + 16);
                /* without VNNI: a pair of products is at most 2 * 24 * 127, maddubs never saturates */
                for (int g = 0; g < NG; g++) is[g][k] = pk_dot4(pk_dot4(is[g][k], lo[g], xl), hi[g], xh);
            }
        }
        for (int g = 0; g < NG; g++) {
            const __m256 dw = fp4_scales(bp[g]);
            for (int k = 0; k < NX; k++)
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[g][k]), _mm256_mul_ps(dw, _mm256_set1_ps(xd[k][b])), acc[g][k]);
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}

/* IQ1_S … IQ3_S: the table indices of values 4t..4t+3 (lo) and 16+4t.. (hi) of the 8 rows of packed
 * block bp: IQ3's nibbles; the IQ1 / IQ2 types' 3-bit codes (bit 3 is don't-care in their table),
 * step 3's gathered from bits 3 and 7 of the three vectors. */
FORCE_INLINE void iql_codes(uint32_t T, const uint8_t *bp, int t, __m256i *lo, __m256i *hi)
{
    const __m256i m15 = _mm256_set1_epi8(15);
    if (!IQL3(T) || t < 3) {
        const __m256i v = _mm256_loadu_si256((const __m256i *)(bp + PK_IQL_C + 32 * t));
        *lo = _mm256_and_si256(v, m15);
        *hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m15);
        return;
    }
    const __m256i v0 = _mm256_loadu_si256((const __m256i *)(bp + PK_IQL_C)),
                  v1 = _mm256_loadu_si256((const __m256i *)(bp + PK_IQL_C + 32)),
                  v2 = _mm256_loadu_si256((const __m256i *)(bp + PK_IQL_C + 64));
    const __m256i d = _mm256_or_si256(_mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(v0, 3), _mm256_set1_epi8(0x11)),
                                                      _mm256_and_si256(_mm256_srli_epi16(v1, 2), _mm256_set1_epi8(0x22))),
                                      _mm256_and_si256(_mm256_srli_epi16(v2, 1), _mm256_set1_epi8(0x44)));
    *lo = d;                            /* bits 3 and 7 are 0: the shuffle reads bits 0-2 */
    *hi = _mm256_srli_epi16(d, 4);      /* the next byte's bit 3 (0) lands in bit 7 */
}

/* IQ1_S … IQ3_S: the half multipliers 2 ls + 1 of 8 rows from their ls bytes (one a lane). */
FORCE_INLINE void iql_mults(__m256i ls, __m256i *ma, __m256i *mb)
{
    const __m256i one = _mm256_set1_epi32(1);
    *ma = _mm256_or_si256(_mm256_slli_epi32(_mm256_and_si256(ls, _mm256_set1_epi32(15)), 1), one);
    *mb = _mm256_or_si256(_mm256_srli_epi32(ls, 3), one);   /* bits 4-7 to 1-4; bit 0 is then ls_a's bit 3 */
}

/* IQ1_S … IQ3_S transcoded (layout in quant_impl.h): the codes through the type's table + off
 * (one shuffle per vector), the halves' sums started at -off * their activation sums, the half
 * multipliers applied in int32, then acc = fma(isum, (d * fscale) * d_x, acc). */
FORCE_INLINE void pk_iql(uint32_t T, const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int nb,
                         float *res)
{
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xi[4], *xh[4];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    act_hrows(x, i0, NX, nb, xh);
    int8_t tab[16];
    int off;
    iql_tile_table(T, tab, &off);
    const __m256i tbl = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)tab));
    const __m256 fs = _mm256_set1_ps(qiql_fscale(T));
    __m256 acc[2][4], dv[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
    for (int g = 0; g < NG; g++)
        for (int k = 0; k < NX; k++) acc[g][k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *bp[2];
        __m256i ia[2][4], ib[2][4];
        for (int g = 0; g < NG; g++) {
            if (b % 8 == 0)
                dv[g] = _mm256_mul_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(gp[g] + (size_t)(b / 8) * PK_IQL_SB(T)))), fs);
            bp[g] = pk_blk(T, gp[g], b);
            _mm_prefetch((const char *)bp[g] + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 64 + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)bp[g] + 128 + PK_PFD, PK_HINT);
            for (int k = 0; k < NX; k++) {
                ia[g][k] = _mm256_set1_epi32(-off * xh[k][b]);
                ib[g][k] = _mm256_set1_epi32(-off * (xi[k][b] - xh[k][b]));
            }
        }
        for (int t = 0; t < 4; t++) {
            __m256i lo[2], hi[2];
            for (int g = 0; g < NG; g++) {
                iql_codes(T, bp[g], t, &lo[g], &hi[g]);
                lo[g] = _mm256_shuffle_epi8(tbl, lo[g]);
                hi[g] = _mm256_shuffle_epi8(tbl, hi[g]);
            }
            k_halves_step(ia, ib, lo, hi, xq, b, t, NG, NX);
        }
        for (int g = 0; g < NG; g++) {
            __m256i ma, mb;
            iql_mults(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bp[g])), &ma, &mb);
            for (int k = 0; k < NX; k++) {
                const __m256i is = _mm256_add_epi32(_mm256_mullo_epi32(ia[g][k], ma), _mm256_mullo_epi32(ib[g][k], mb));
                acc[g][k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_mul_ps(dv[g], _mm256_set1_ps(xd[k][b])), acc[g][k]);
            }
        }
    }
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++) _mm256_storeu_ps(res + k * 8 * NG + g * 8, acc[g][k]);
}
#define pk_iq1s(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ1_S, gp, NG, x, i0, NX, nb, res)
#define pk_iq1m(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ1_M, gp, NG, x, i0, NX, nb, res)
#define pk_iq2xxs(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ2_XXS, gp, NG, x, i0, NX, nb, res)
#define pk_iq2xs(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ2_XS, gp, NG, x, i0, NX, nb, res)
#define pk_iq2s(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ2_S, gp, NG, x, i0, NX, nb, res)
#define pk_iq3xxs(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ3_XXS, gp, NG, x, i0, NX, nb, res)
#define pk_iq3s(gp, NG, x, i0, NX, nb, res) pk_iql(GGML_IQ3_S, gp, NG, x, i0, NX, nb, res)

/* BF16 (layout in quant_impl.h): per group and input row 8 accumulators, value k into number k % 8
 * (qdot_exact's order with the 8 rows as lanes); a group at a time, so at most 8 NX registers. */
FORCE_INLINE void pk_bf16(const uint8_t *const *gp, const int NG, const qact *x, int i0, const int NX, int cols,
                          float *res)
{
    const float *xf[4];
    for (int k = 0; k < NX; k++) xf[k] = x->f + (size_t)(x->idx ? x->idx[i0 + k] : i0 + k) * cols;
    const __m256i hm = _mm256_set1_epi32((int)0xffff0000u);
    for (int g = 0; g < NG; g++) {
        __m256 A[4][8];
        for (int k = 0; k < NX; k++)
            for (int l = 0; l < 8; l++) A[k][l] = _mm256_setzero_ps();
        for (int c = 0; c < cols; c += 8) {
            const int np = cols - c < 8 ? (cols - c) / 2 : 4;
            _mm_prefetch((const char *)gp[g] + 16 * (size_t)c + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)gp[g] + 16 * (size_t)c + 64 + PK_PFD, PK_HINT);
            for (int p = 0; p < 4; p++) {
                if (p >= np) break;
                const __m256i v = _mm256_loadu_si256((const __m256i *)(gp[g] + 16 * (size_t)(c + 2 * p)));
                const __m256 w0 = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16)), w1 = _mm256_castsi256_ps(_mm256_and_si256(v, hm));
                for (int k = 0; k < NX; k++) {
                    A[k][2 * p] = _mm256_fmadd_ps(w0, _mm256_broadcast_ss(xf[k] + c + 2 * p), A[k][2 * p]);
                    A[k][2 * p + 1] = _mm256_fmadd_ps(w1, _mm256_broadcast_ss(xf[k] + c + 2 * p + 1), A[k][2 * p + 1]);
                }
            }
        }
        for (int k = 0; k < NX; k++) {
            const __m256 r = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(A[k][0], A[k][4]), _mm256_add_ps(A[k][2], A[k][6])),
                                           _mm256_add_ps(_mm256_add_ps(A[k][1], A[k][5]), _mm256_add_ps(A[k][3], A[k][7])));
            _mm256_storeu_ps(res + k * 8 * NG + g * 8, r);
        }
    }
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

#else /* portable: quant_tile_scalar.c */
#define pk_q41(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q4_1, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q4k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q4_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q5k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q5_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q50(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q5_0, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q51(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q5_1, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q6k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q6_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q3k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q3_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q2k(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q2_K, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_q80(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_Q8_0, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_fp4(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_MXFP4, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq1s(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ1_S, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq1m(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ1_M, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq2xxs(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ2_XXS, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq2xs(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ2_XS, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq2s(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ2_S, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq3xxs(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ3_XXS, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_iq3s(gp, NG, x, i0, NX, nb, res) pk_scalar(GGML_IQ3_S, gp, NG, x, i0, NX, (nb) * QK, res)
#define pk_f16(gp, NG, x, i0, NX, cols, res) pk_scalar(GGML_F16, gp, NG, x, i0, NX, cols, res)
#define pk_bf16(gp, NG, x, i0, NX, cols, res) pk_scalar(GGML_BF16, gp, NG, x, i0, NX, cols, res)
#endif

/* One tile: NG (1, 2) groups x NX (1..PK_NX; at most 4 unless the zmm kernels take it) input rows. */
void pk_tile(uint32_t t, const uint8_t *const *gp, int NG, const qact *x, int i0, int NX, float *res)
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
    if (NG == 2 && pkz_tile(t, gp, x, i0, NX, res)) return;
#endif
    if (t == GGML_BF16) {    /* the caller keeps NX <= PK_BF16_NX (8 accumulators per group and row) */
        switch (NG * 8 + (NX < 3 ? NX : 3)) {
        case 9: pk_bf16(gp, 1, x, i0, 1, cols, res); break;
        case 10: pk_bf16(gp, 1, x, i0, 2, cols, res); break;
        case 11: pk_bf16(gp, 1, x, i0, 3, cols, res); break;
        case 17: pk_bf16(gp, 2, x, i0, 1, cols, res); break;
        case 18: pk_bf16(gp, 2, x, i0, 2, cols, res); break;
        default: pk_bf16(gp, 2, x, i0, 3, cols, res); break;
        }
        return;
    }
    if (NX > 4) {   /* the 256-bit tiles take at most 4 input rows: res is input-row major */
        pk_tile(t, gp, NG, x, i0, 4, res);
        pk_tile(t, gp, NG, x, i0 + 4, NX - 4, res + 4 * 8 * NG);
        return;
    }
    if (t == GGML_Q4_1) { PK_CASE(pk_q41, nb) }
    else if (t == GGML_Q4_K) { PK_CASE(pk_q4k, nb) }
    else if (t == GGML_Q5_K) { PK_CASE(pk_q5k, nb) }
    else if (t == GGML_Q5_0) { PK_CASE(pk_q50, nb) }
    else if (t == GGML_Q5_1) { PK_CASE(pk_q51, nb) }
    else if (t == GGML_Q6_K) { PK_CASE(pk_q6k, nb) }
    else if (t == GGML_Q3_K) { PK_CASE(pk_q3k, nb) }
    else if (t == GGML_Q2_K) { PK_CASE(pk_q2k, nb) }
    else if (t == GGML_Q8_0) { PK_CASE(pk_q80, nb) }
    else if (t == GGML_MXFP4) { PK_CASE(pk_fp4, nb) }
    else if (t == GGML_IQ1_S) { PK_CASE(pk_iq1s, nb) }
    else if (t == GGML_IQ1_M) { PK_CASE(pk_iq1m, nb) }
    else if (t == GGML_IQ2_XXS) { PK_CASE(pk_iq2xxs, nb) }
    else if (t == GGML_IQ2_XS) { PK_CASE(pk_iq2xs, nb) }
    else if (t == GGML_IQ2_S) { PK_CASE(pk_iq2s, nb) }
    else if (t == GGML_IQ3_XXS) { PK_CASE(pk_iq3xxs, nb) }
    else if (t == GGML_IQ3_S) { PK_CASE(pk_iq3s, nb) }
    else { PK_CASE(pk_f16, cols) }
#undef PK_CASE
}
