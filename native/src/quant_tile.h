/* quant_tile.h — the AVX2 helpers the packed tiles share (quant_tile.c, quant_tile_zmm.c).
 * Owns: pk_dot4 (vpdpbusd or maddubs+madd), act_rows (an activation row's int8 blocks, scales and
 * sums, through qact.idx), act_hrows (its half sums), bc4, fp4_table / fp4_scales / fp4_scales_of (MXFP4), the prefetch distance PK_PFD, k4_super / k4_scales (Q4_K/Q5_K's
 * d * sc and -(dmin * m) of 8 rows), k23_scales (Q2_K/Q3_K's scales and mins of 8 rows),
 * iql_tile_table (IQ1_S … IQ3_S's shuffle table). */
#ifndef COLI_QUANT_TILE_H
#define COLI_QUANT_TILE_H
#include "quant_impl.h"
#include "quant_iqlow.h"

/* The tiles' table of an IQ type: qiql_table's values + off (0 .. 2 off <= 124: unsigned), indexed
 * by the packed code; the IQ1 / IQ2 types' 3-bit codes (level | 4 when negative) with bit 3
 * don't-care (quant_impl.h). */
static inline void iql_tile_table(uint32_t T, int8_t tab[16], int *off)
{
    int8_t t4[16];
    qiql_table(T, t4, off);
    for (int c = 0; c < 16; c++) tab[c] = (int8_t)(t4[IQL3(T) ? (c & 3) | (c & 4) << 1 : c] + *off);
}

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

/* The integer sums of q[0..15] (xh) of the same rows: with xi the offset terms of the K-quant
 * tiles (the halves' sums sa = xh, sb = xi - xh), made once per activation block by qact_prepare. */
FORCE_INLINE void act_hrows(const qact *x, int i0, const int NX, int nb, const int32_t **xh)
{
    for (int k = 0; k < NX; k++) xh[k] = x->qh + (size_t)(x->idx ? x->idx[i0 + k] : i0 + k) * nb;
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
/* Q4_K / Q5_K: the 8 rows' d and dmin of the super-block (8 blocks) holding block b of packed group g. */
FORCE_INLINE void k4_super(uint32_t t, const uint8_t *g, int b, __m256 *d, __m256 *dm)
{
    const uint8_t *h = g + (size_t)(b / 8) * PK_KSB(t);
    *d = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)h));
    *dm = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(h + 16)));
}
/* ... and from them dl = d * sc and ml = -(dmin * m) of the 8 rows of block b. */
FORCE_INLINE void k4_scales(uint32_t t, const uint8_t *g, int b, __m256 d, __m256 dm, __m256 *dl, __m256 *ml)
{
    const uint8_t *blk = pk_blk(t, g, b);
    const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)blk)));
    const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(blk + 8))));
    *dl = _mm256_mul_ps(d, sc);
    *ml = _mm256_xor_ps(_mm256_mul_ps(dm, m), _mm256_set1_ps(-0.0f));
}
/* Q2_K / Q3_K: the 8 rows' scales of the halves a, b of packed block bp (Q3_K signed) and, for
 * Q2_K, their mins. */
FORCE_INLINE void k23_scales(uint32_t T, const uint8_t *bp, __m256i *sca, __m256i *scb, __m256i *ma, __m256i *mb)
{
    const __m256i m15 = _mm256_set1_epi32(15), m3 = _mm256_set1_epi32(3);
    if (T == GGML_Q2_K) {
        const __m256i ra = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bp));
        const __m256i rb = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(bp + 8)));
        *sca = _mm256_and_si256(ra, m15);
        *scb = _mm256_and_si256(rb, m15);
        *ma = _mm256_srli_epi32(ra, 4);
        *mb = _mm256_srli_epi32(rb, 4);
        return;
    }
    const __m256i L = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bp));
    int32_t hw;
    memcpy(&hw, bp + 8, 4);
    const __m256i hv = _mm256_set1_epi32(hw), sh = _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14);
    const __m256i ha = _mm256_and_si256(_mm256_srlv_epi32(hv, sh), m3);
    const __m256i hb = _mm256_and_si256(_mm256_srlv_epi32(hv, _mm256_add_epi32(sh, _mm256_set1_epi32(16))), m3);
    *sca = _mm256_sub_epi32(_mm256_or_si256(_mm256_and_si256(L, m15), _mm256_slli_epi32(ha, 4)), _mm256_set1_epi32(32));
    *scb = _mm256_sub_epi32(_mm256_or_si256(_mm256_srli_epi32(L, 4), _mm256_slli_epi32(hb, 4)), _mm256_set1_epi32(32));
    *ma = *mb = _mm256_setzero_si256();
}

/* MXFP4: the table kv + FP4_OFF (unsigned, 0..24) in both 128-bit lanes, for vpshufb. */
FORCE_INLINE __m256i fp4_table(void)
{
    return _mm256_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0,
                            12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0);
}
/* MXFP4: scale(e) of 8 exponents, one a lane (quant_fp4.h's bits: 0x00200000 << e for e < 2,
 * else (e - 1) << 23). */
FORCE_INLINE __m256 fp4_scales_of(__m256i e)
{
    const __m256i one = _mm256_set1_epi32(1);
    const __m256i norm = _mm256_slli_epi32(_mm256_sub_epi32(e, one), 23);
    const __m256i sub = _mm256_sllv_epi32(_mm256_set1_epi32(0x00200000), e);
    return _mm256_castsi256_ps(_mm256_blendv_epi8(sub, norm, _mm256_cmpgt_epi32(e, one)));
}
/* MXFP4: the 8 rows' scale(e) of packed block bp. */
FORCE_INLINE __m256 fp4_scales(const uint8_t *bp)
{
    return fp4_scales_of(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)bp)));
}
#endif

#ifdef PK_ZMM
/* quant_tile_zmm.c: the 512-bit tile for two groups and NX (1..8) input rows when it takes the
 * type (and NX); 0: not taken, the caller runs the 256-bit tile. */
int pkz_tile(uint32_t t, const uint8_t *const *gp, const qact *x, int i0, int NX, float *res);
#endif
#ifndef __AVX2__
/* quant_tile_scalar.c: the portable tile, the canonical order with scalar fmaf. */
void pk_scalar(uint32_t t, const uint8_t *const *gp, int NG, const qact *x, int i0, int NX, int cols, float *res);
#endif
#endif
