/* quant_tile_zmm.c — the packed tiles in 512-bit registers (AVX-512 BW + VNNI): two groups (16
 * rows) per register and up to 8 input rows, the same per-lane operations and order as the 256-bit
 * tiles with NG = 2 (bit-identical; test_quant checks that a row's output does not depend on the
 * tile computing it).
 * Owns: pkz_q41k (Q4_1, Q4_K, Q5_K, Q5_0, Q5_1), pkz_k6f (Q6_K, Q3_K, Q2_K), pkz_q80, pkz_fp4 (MXFP4),
 * pkz_iql (IQ1_S … IQ3_S), pkz_bf16, pkz_tile. */
#include "quant_tile.h"
#include "quant_iqlow.h"

#ifdef PK_ZMM
#ifndef IQL_ZMM_NX
#define IQL_ZMM_NX 1    /* the IQ types take the 512-bit tile from this many input rows */
#endif
/* Two groups (16 rows) in one 512-bit register: the same per-lane operations and order as
 * pk_q41 / pk_q80 with NG = 2 (bit-identical), half the instructions, and registers for 8
 * input rows, so a batch of 8 unpacks each weight vector once. */
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

FORCE_INLINE __m512i z_bc4(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* kq as pk_q41k's: 0 Q4_1, 1 Q4_K, 2 Q5_K, 3 Q5_0, 4 Q5_1. */
FORCE_INLINE void pkz_q41k(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res, const int kq)
{
    const uint32_t T = kq == 4 ? GGML_Q5_1 : kq == 3 ? GGML_Q5_0 : kq == 2 ? GGML_Q5_K : kq ? GGML_Q4_K : GGML_Q4_1;
    const size_t NO = PK_NIB(T);
    const int8_t *xq[8];
    const float *xd[8], *xs[8];
    const int32_t *xi[8];
    act_rows(x, i0, NX, nb, xq, xd, xs, kq == 3 ? xi : NULL);
    const __m512i m15 = _mm512_set1_epi8(15), m16 = _mm512_set1_epi8(16);
    __m512 acc[8], D = _mm512_setzero_ps(), DM = _mm512_setzero_ps();
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
            if (kq >= 2) {   /* bit 4 of the codes from the H vector: bit t (lo), 4 + t (hi) */
                const __m512i H = z_load2(b0 + PK_HOFF(T), b1 + PK_HOFF(T));
                lo = _mm512_or_si512(lo, _mm512_and_si512(_mm512_slli_epi16(H, 4 - t), m16));
                hi = _mm512_or_si512(hi, _mm512_and_si512(t ? _mm512_srli_epi16(H, t) : H, m16));
            }
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                is[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(is[k], lo, z_bc4(xk)), hi, z_bc4(xk + 16));
            }
        }
        __m512 dw, mw;
        if (kq == 1 || kq == 2) {   /* k4_scales' products for both groups: d * sc and dmin * m (subtracted) */
            if (b % 8 == 0) {
                const uint8_t *h0 = gp[0] + (size_t)(b / 8) * PK_KSB(T), *h1 = gp[1] + (size_t)(b / 8) * PK_KSB(T);
                D = z_half2(h0, h1);
                DM = z_half2(h0 + 16, h1 + 16);
            }
            __m512i scw, mnw;   /* the 16 rows' 6-bit scales and mins as dwords */
#ifdef __AVX512VBMI__
            /* sc, m of both groups in one register (bytes 0-7 sc_0, 8-15 m_0, 16-23 sc_1, 24-31 m_1), each
             * widened by one zero-masked byte permute */
            const __m512i sm = _mm512_castsi256_si512(_mm256_inserti128_si256(
                _mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)b0)), _mm_loadu_si128((const __m128i *)b1), 1));
            const __m512i isc = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23);
            scw = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, isc, sm);
            mnw = _mm512_maskz_permutexvar_epi8(0x1111111111111111ull, _mm512_add_epi32(isc, _mm512_set1_epi32(8)), sm);
#else
            scw = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)b0), _mm_loadl_epi64((const __m128i *)b1)));
            mnw = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(b0 + 8)),
                                                          _mm_loadl_epi64((const __m128i *)(b1 + 8))));
#endif
            dw = _mm512_mul_ps(D, _mm512_cvtepi32_ps(scw));
            mw = _mm512_mul_ps(DM, _mm512_cvtepi32_ps(mnw));   /* dmin * m: the min term is subtracted below */
        } else {
            dw = z_half2(b0, b1);
            mw = kq == 3 ? _mm512_setzero_ps() : z_half2(b0 + 16, b1 + 16);
        }
        for (int k = 0; k < NX; k++) {
            const __m512 sc = _mm512_mul_ps(dw, _mm512_set1_ps(xd[k][b]));
            const __m512i isk = kq == 3 ? _mm512_sub_epi32(is[k], _mm512_set1_epi32(16 * xi[k][b])) : is[k];
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isk), sc, acc[k]);
            /* Q4_K / Q5_K: acc - (dmin m) s_x, the same bits as fma(-(dmin m), s_x, acc) */
            if (kq == 1 || kq == 2) acc[k] = _mm512_fnmadd_ps(mw, _mm512_set1_ps(xs[k][b]), acc[k]);
            else if (kq != 3) acc[k] = _mm512_fmadd_ps(mw, _mm512_set1_ps(xs[k][b]), acc[k]);
        }
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}

#define pkz_q41(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 0)
#define pkz_q4k(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 1)
#define pkz_q5k(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 2)
#define pkz_q50(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 3)
#define pkz_q51(gp, x, i0, NX, nb, res) pkz_q41k(gp, x, i0, NX, nb, res, 4)

/* The Q6_K / Q2_K / Q3_K codes of step t of blocks b0, b1 (H0: Q3_K's bit-2 vectors). */
FORCE_INLINE void z_k6f_codes(uint32_t T, const uint8_t *b0, const uint8_t *b1, __m512i H0, int t,
                              __m512i *lo, __m512i *hi)
{
    const __m512i m3 = _mm512_set1_epi8(3);
    if (T == GGML_Q6_K) {   /* quant_impl.h: C_2t = S_2t & 63, C_2t+1; t = 3 from the bits 6-7 */
        if (t == 3) {
            const __m512i m3_ = _mm512_set1_epi8(3), m12 = _mm512_set1_epi8(12), m48 = _mm512_set1_epi8(48);
            __m512i r[2];
            for (int h = 0; h < 2; h++) {
                const int o = 16 + 96 * h;
                r[h] = _mm512_or_si512(_mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(z_load2(b0 + o, b1 + o), 6), m3_),
                                                       _mm512_and_si512(_mm512_srli_epi16(z_load2(b0 + o + 32, b1 + o + 32), 4), m12)),
                                       _mm512_and_si512(_mm512_srli_epi16(z_load2(b0 + o + 64, b1 + o + 64), 2), m48));
            }
            *lo = r[0];
            *hi = r[1];
            return;
        }
        const __m512i m63 = _mm512_set1_epi8(63);
        *lo = _mm512_and_si512(z_load2(b0 + 16 + 64 * t, b1 + 16 + 64 * t), m63);
        *hi = _mm512_and_si512(z_load2(b0 + 48 + 64 * t, b1 + 48 + 64 * t), m63);
        return;
    }
    const int c = K23SC(T);
    *lo = _mm512_and_si512(_mm512_srli_epi16(z_load2(b0 + c, b1 + c), 2 * t), m3);
    *hi = _mm512_and_si512(_mm512_srli_epi16(z_load2(b0 + c + 32, b1 + c + 32), 2 * t), m3);
    if (T == GGML_Q3_K) {    /* bit t (lo) and 4 + t (hi) of H to bit 2 */
        const __m512i m4 = _mm512_set1_epi8(4);
        const __m512i hl = t < 3 ? _mm512_slli_epi16(H0, 2 - t) : _mm512_srli_epi16(H0, 1);
        *lo = _mm512_or_si512(*lo, _mm512_and_si512(hl, m4));
        *hi = _mm512_or_si512(*hi, _mm512_and_si512(_mm512_srli_epi16(H0, 2 + t), m4));
    }
}

FORCE_INLINE __m512i z_joini(__m256i a, __m256i b) { return _mm512_inserti64x4(_mm512_castsi256_si512(a), b, 1); }

/* The 16 rows' scales of the halves a, b of blocks b0, b1 (signed) and Q2_K's mins. */
FORCE_INLINE void z_k6f_scales(uint32_t T, const uint8_t *b0, const uint8_t *b1, __m512i *sca, __m512i *scb,
                               __m512i *ma, __m512i *mb)
{
    if (T == GGML_Q6_K) {
        *sca = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)b0), _mm_loadl_epi64((const __m128i *)b1)));
        *scb = _mm512_cvtepi8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)(b0 + 8)),
                                                       _mm_loadl_epi64((const __m128i *)(b1 + 8))));
        *ma = *mb = _mm512_setzero_si512();
        return;
    }
    __m256i a0, c0, m0, n0, a1, c1, m1, n1;
    k23_scales(T, b0, &a0, &c0, &m0, &n0);
    k23_scales(T, b1, &a1, &c1, &m1, &n1);
    *sca = z_joini(a0, a1);
    *scb = z_joini(c0, c1);
    *ma = z_joini(m0, m1);
    *mb = z_joini(n0, n1);
}

/* pk_q6k / pk_q23k with NG = 2 in 512-bit registers (bit-identical), up to 8 input rows. */
FORCE_INLINE void pkz_k6f(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res,
                          const uint32_t T)
{
    const int off = T == GGML_Q6_K ? K6OFF : K23OFF(T), k2 = T == GGML_Q2_K;
    const size_t sbb = T == GGML_Q6_K ? PK_K6_SB : K23SB(T);
    const int8_t *xq[8];
    const float *xd[8];
    const int32_t *xi[8], *xh[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    act_hrows(x, i0, NX, nb, xh);
    __m512 acc[8];
    for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_ps();
    __m512 dv = _mm512_setzero_ps(), mv = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (b % 8 == 0) {
            const uint8_t *h0 = gp[0] + (size_t)(b / 8) * sbb, *h1 = gp[1] + (size_t)(b / 8) * sbb;
            dv = z_half2(h0, h1);
            if (k2) mv = z_half2(h0 + 16, h1 + 16);
        }
        const uint8_t *b0 = pk_blk(T, gp[0], b), *b1 = pk_blk(T, gp[1], b);
        const int pf2 = T == GGML_Q6_K ? 128 : 64;
        _mm_prefetch((const char *)b0 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)b1 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)b0 + pf2 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)b1 + pf2 + PK_PFD, PK_HINT);
        if (T == GGML_Q6_K) {   /* 208-byte blocks: at most 64 bytes apart, so no line is skipped (with only 0
                                 * and 128 the 512-bit tile decoded the bench shape's q6_k mix at 3.8 ms instead of 3.3) */
            _mm_prefetch((const char *)b0 + 64 + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)b1 + 64 + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)b0 + 192 + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)b1 + 192 + PK_PFD, PK_HINT);
        }
        const int ho = K23SC(T) + 64;
        const __m512i H0 = T == GGML_Q3_K ? z_load2(b0 + ho, b1 + ho) : _mm512_setzero_si512();
        __m512i ia[8], ib[8];   /* start at -off * (the halves' activation sums): the offset applied by the sums */
        for (int k = 0; k < NX; k++) {
            ia[k] = _mm512_set1_epi32(-off * xh[k][b]);
            ib[k] = _mm512_set1_epi32(-off * (xi[k][b] - xh[k][b]));
        }
        for (int t = 0; t < 4; t++) {
            __m512i lo, hi;
            z_k6f_codes(T, b0, b1, H0, t, &lo, &hi);
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                ia[k] = _mm512_dpbusd_epi32(ia[k], lo, z_bc4(xk));
                ib[k] = _mm512_dpbusd_epi32(ib[k], hi, z_bc4(xk + 16));
            }
        }
        __m512i sca, scb, ma, mb;
        z_k6f_scales(T, b0, b1, &sca, &scb, &ma, &mb);
        for (int k = 0; k < NX; k++) {
            const int32_t sa = xh[k][b], sb = xi[k][b] - sa;
            const __m512 xs = _mm512_set1_ps(xd[k][b]);
            const __m512i is = _mm512_add_epi32(_mm512_mullo_epi32(ia[k], sca), _mm512_mullo_epi32(ib[k], scb));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, xs), acc[k]);
            if (!k2) continue;
            const __m512i ms = _mm512_add_epi32(_mm512_mullo_epi32(ma, _mm512_set1_epi32(sa)),
                                                _mm512_mullo_epi32(mb, _mm512_set1_epi32(sb)));
            acc[k] = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(_mm512_cvtepi32_ps(ms)),
                                                                          _mm512_set1_epi32((int)0x80000000u))),
                                     _mm512_mul_ps(mv, xs), acc[k]);
        }
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}
#define pkz_q6k(gp, x, i0, NX, nb, res) pkz_k6f(gp, x, i0, NX, nb, res, GGML_Q6_K)
#define pkz_q3k(gp, x, i0, NX, nb, res) pkz_k6f(gp, x, i0, NX, nb, res, GGML_Q3_K)
#define pkz_q2k(gp, x, i0, NX, nb, res) pkz_k6f(gp, x, i0, NX, nb, res, GGML_Q2_K)

/* IQ1_S … IQ3_S: iql_codes's indices for blocks b0, b1 (step 3 of the 3-bit codes: two bit selects). */
FORCE_INLINE void z_iql_codes(uint32_t T, const uint8_t *b0, const uint8_t *b1, int t, __m512i *lo, __m512i *hi)
{
    const __m512i m15 = _mm512_set1_epi8(15);
    if (!IQL3(T) || t < 3) {
        const __m512i v = z_load2(b0 + PK_IQL_C + 32 * t, b1 + PK_IQL_C + 32 * t);
        *lo = _mm512_and_si512(v, m15);
        *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), m15);
        return;
    }
    const uint8_t *c0 = b0 + PK_IQL_C, *c1 = b1 + PK_IQL_C;
    const __m512i s0 = _mm512_srli_epi16(z_load2(c0, c1), 3), s1 = _mm512_srli_epi16(z_load2(c0 + 32, c1 + 32), 2);
    const __m512i s2 = _mm512_and_si512(_mm512_srli_epi16(z_load2(c0 + 64, c1 + 64), 1), _mm512_set1_epi8(0x44));
    /* 0xE4: c ? a : b (a bit select by the constant c) */
    const __m512i d12 = _mm512_ternarylogic_epi32(s1, s2, _mm512_set1_epi8(0x22), 0xE4);
    const __m512i d = _mm512_ternarylogic_epi32(s0, d12, _mm512_set1_epi8(0x11), 0xE4);
    *lo = d;
    *hi = _mm512_srli_epi16(d, 4);
}

/* IQ1_S … IQ3_S: pk_iql's operations for both groups in one register. */
FORCE_INLINE void pkz_iql(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res, const uint32_t T)
{
    const int8_t *xq[8];
    const float *xd[8];
    const int32_t *xi[8], *xh[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    act_hrows(x, i0, NX, nb, xh);
    int8_t tab[16];
    int off;
    iql_tile_table(T, tab, &off);
    const __m512i tbl = _mm512_broadcast_i32x4(_mm_loadu_si128((const __m128i *)tab));
    const __m512 fs = _mm512_set1_ps(qiql_fscale(T));
    __m512 acc[8], dv = _mm512_setzero_ps();
    for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        if (b % 8 == 0)
            dv = _mm512_mul_ps(z_half2(gp[0] + (size_t)(b / 8) * PK_IQL_SB(T), gp[1] + (size_t)(b / 8) * PK_IQL_SB(T)), fs);
        const uint8_t *b0 = pk_blk(T, gp[0], b), *b1 = pk_blk(T, gp[1], b);
        for (int l = 0; l < 3; l++) {
            _mm_prefetch((const char *)b0 + 64 * l + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)b1 + 64 * l + PK_PFD, PK_HINT);
        }
        __m512i ia[8], ib[8];
        for (int k = 0; k < NX; k++) {
            ia[k] = _mm512_set1_epi32(-off * xh[k][b]);
            ib[k] = _mm512_set1_epi32(-off * (xi[k][b] - xh[k][b]));
        }
        for (int t = 0; t < 4; t++) {
            __m512i lo, hi;
            z_iql_codes(T, b0, b1, t, &lo, &hi);
            lo = _mm512_shuffle_epi8(tbl, lo);
            hi = _mm512_shuffle_epi8(tbl, hi);
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                ia[k] = _mm512_dpbusd_epi32(ia[k], lo, z_bc4(xk));
                ib[k] = _mm512_dpbusd_epi32(ib[k], hi, z_bc4(xk + 16));
            }
        }
        /* the multipliers 2 ls + 1 from the ls bytes (quant_tile.c iql_mults) */
        const __m512i ls = _mm512_cvtepu8_epi32(_mm_unpacklo_epi64(_mm_loadl_epi64((const __m128i *)b0), _mm_loadl_epi64((const __m128i *)b1)));
        const __m512i one = _mm512_set1_epi32(1);
        const __m512i ma = _mm512_or_si512(_mm512_slli_epi32(_mm512_and_si512(ls, _mm512_set1_epi32(15)), 1), one);
        const __m512i mb = _mm512_or_si512(_mm512_srli_epi32(ls, 3), one);
        for (int k = 0; k < NX; k++) {
            const __m512i is = _mm512_add_epi32(_mm512_mullo_epi32(ia[k], ma), _mm512_mullo_epi32(ib[k], mb));
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is), _mm512_mul_ps(dv, _mm512_set1_ps(xd[k][b])), acc[k]);
        }
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}

/* MXFP4: pk_fp4's operations for both groups in one register. */
FORCE_INLINE void pkz_fp4(const uint8_t *const *gp, const qact *x, int i0, const int NX, int nb, float *res)
{
    const int8_t *xq[8];
    const float *xd[8];
    const int32_t *xi[8];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    const __m512i tbl = _mm512_broadcast_i32x4(_mm256_castsi256_si128(fp4_table())), m15 = _mm512_set1_epi8(15);
    const size_t NO = PK_NIB(GGML_MXFP4);
    __m512 acc[8];
    for (int k = 0; k < NX; k++) acc[k] = _mm512_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const uint8_t *b0 = pk_blk(GGML_MXFP4, gp[0], b), *b1 = pk_blk(GGML_MXFP4, gp[1], b);
        for (int l = 0; l < 3; l++) {
            _mm_prefetch((const char *)b0 + 64 * l + PK_PFD, PK_HINT);
            _mm_prefetch((const char *)b1 + 64 * l + PK_PFD, PK_HINT);
        }
        __m512i is[8];
        for (int k = 0; k < NX; k++) is[k] = _mm512_set1_epi32(-FP4_OFF * xi[k][b]);
        for (int t = 0; t < 4; t++) {
            const __m512i v = z_load2(b0 + NO + 32 * t, b1 + NO + 32 * t);
            const __m512i lo = _mm512_shuffle_epi8(tbl, _mm512_and_si512(v, m15));
            const __m512i hi = _mm512_shuffle_epi8(tbl, _mm512_and_si512(_mm512_srli_epi16(v, 4), m15));
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                is[k] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(is[k], lo, z_bc4(xk)), hi, z_bc4(xk + 16));
            }
        }
        const __m512 dw = _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(fp4_scales(b0))),
                                                               _mm256_castps_pd(fp4_scales(b1)), 1));
        for (int k = 0; k < NX; k++)
            acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[k]), _mm512_mul_ps(dw, _mm512_set1_ps(xd[k][b])), acc[k]);
    }
    for (int k = 0; k < NX; k++) _mm512_storeu_ps(res + 16 * k, acc[k]);
}

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

/* pk_bf16 with NG = 2 in 512-bit registers (bit-identical), up to 3 input rows (24 accumulators). */
FORCE_INLINE void pkz_bf16(const uint8_t *const *gp, const qact *x, int i0, const int NX, int cols, float *res)
{
    const float *xf[3];
    for (int k = 0; k < NX; k++) xf[k] = x->f + (size_t)(x->idx ? x->idx[i0 + k] : i0 + k) * cols;
    const __m512i hm = _mm512_set1_epi32((int)0xffff0000u);
    __m512 A[3][8];
    for (int k = 0; k < NX; k++)
        for (int l = 0; l < 8; l++) A[k][l] = _mm512_setzero_ps();
    for (int c = 0; c < cols; c += 8) {
        const int np = cols - c < 8 ? (cols - c) / 2 : 4;
        _mm_prefetch((const char *)gp[0] + 16 * (size_t)c + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)gp[0] + 16 * (size_t)c + 64 + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)gp[1] + 16 * (size_t)c + PK_PFD, PK_HINT);
        _mm_prefetch((const char *)gp[1] + 16 * (size_t)c + 64 + PK_PFD, PK_HINT);
        for (int p = 0; p < 4; p++) {
            if (p >= np) break;
            const size_t o = 16 * (size_t)(c + 2 * p);
            const __m512i v = z_load2(gp[0] + o, gp[1] + o);
            const __m512 w0 = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16)), w1 = _mm512_castsi512_ps(_mm512_and_si512(v, hm));
            for (int k = 0; k < NX; k++) {
                A[k][2 * p] = _mm512_fmadd_ps(w0, _mm512_set1_ps(xf[k][c + 2 * p]), A[k][2 * p]);
                A[k][2 * p + 1] = _mm512_fmadd_ps(w1, _mm512_set1_ps(xf[k][c + 2 * p + 1]), A[k][2 * p + 1]);
            }
        }
    }
    for (int k = 0; k < NX; k++) {
        const __m512 r = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(A[k][0], A[k][4]), _mm512_add_ps(A[k][2], A[k][6])),
                                       _mm512_add_ps(_mm512_add_ps(A[k][1], A[k][5]), _mm512_add_ps(A[k][3], A[k][7])));
        _mm512_storeu_ps(res + 16 * k, r);
    }
}

/* The 512-bit tile of two groups, when it takes type t and NX input rows: 1, else 0. */
int pkz_tile(uint32_t t, const uint8_t *const *gp, const qact *x, int i0, int NX, float *res)
{
    const int nb = x->cols / QK;
    if (t == GGML_BF16) {
        if (NX == 1) pkz_bf16(gp, x, i0, 1, x->cols, res);
        else if (NX == 2) pkz_bf16(gp, x, i0, 2, x->cols, res);
        else if (NX == 3) pkz_bf16(gp, x, i0, 3, x->cols, res);
        else return 0;
        return 1;
    }
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
    if (t == GGML_Q4_1) { PKZ_CASE(pkz_q41) return 1; }
    if (t == GGML_Q4_K) { PKZ_CASE(pkz_q4k) return 1; }
    if (t == GGML_Q5_K) { PKZ_CASE(pkz_q5k) return 1; }
    if (t == GGML_Q5_0) { PKZ_CASE(pkz_q50) return 1; }
    if (t == GGML_Q5_1) { PKZ_CASE(pkz_q51) return 1; }
    /* Q6_K: the 512-bit tile for every n since its 6-vector layout and precomputed half sums
     * (2026-12-01; bench_kq 512x1024 in cache, n=1: 37.7 -> 41.1 GB/s, n=4: 15.2 -> 21.5). Q3_K / Q2_K
     * take it only for more than 4 input rows: with fewer it measured slower than two 256-bit groups
     * (the Q6_K-layout days: decode of the bench shape 3.4 vs 2.3 ms per token). */
    if (t == GGML_Q6_K) { PKZ_CASE(pkz_q6k) return 1; }
    if (NX > 4 && t == GGML_Q3_K) { PKZ_CASE(pkz_q3k) return 1; }
    if (NX > 4 && t == GGML_Q2_K) { PKZ_CASE(pkz_q2k) return 1; }
    if (t == GGML_Q8_0) { PKZ_CASE(pkz_q80) return 1; }
    if (t == GGML_MXFP4) { PKZ_CASE(pkz_fp4) return 1; }
#define PKZ_IQL(T)                                                                          \
    switch (NX) {                                                                           \
    case 1: pkz_iql(gp, x, i0, 1, nb, res, T); break;                                       \
    case 2: pkz_iql(gp, x, i0, 2, nb, res, T); break;                                       \
    case 3: pkz_iql(gp, x, i0, 3, nb, res, T); break;                                       \
    case 4: pkz_iql(gp, x, i0, 4, nb, res, T); break;                                       \
    case 5: pkz_iql(gp, x, i0, 5, nb, res, T); break;                                       \
    case 6: pkz_iql(gp, x, i0, 6, nb, res, T); break;                                       \
    case 7: pkz_iql(gp, x, i0, 7, nb, res, T); break;                                       \
    default: pkz_iql(gp, x, i0, 8, nb, res, T); break;                                      \
    }
    if (NX >= IQL_ZMM_NX) {
        switch (t) {
        case GGML_IQ1_S: PKZ_IQL(GGML_IQ1_S) return 1;
        case GGML_IQ1_M: PKZ_IQL(GGML_IQ1_M) return 1;
        case GGML_IQ2_XXS: PKZ_IQL(GGML_IQ2_XXS) return 1;
        case GGML_IQ2_XS: PKZ_IQL(GGML_IQ2_XS) return 1;
        case GGML_IQ2_S: PKZ_IQL(GGML_IQ2_S) return 1;
        case GGML_IQ3_XXS: PKZ_IQL(GGML_IQ3_XXS) return 1;
        case GGML_IQ3_S: PKZ_IQL(GGML_IQ3_S) return 1;
        default: break;
        }
    }
#undef PKZ_IQL
#undef PKZ_CASE
    return 0;
}
#endif
