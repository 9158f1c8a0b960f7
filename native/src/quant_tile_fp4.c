/* quant_tile_fp4.c — MXFP4's tile on the file's layout: 8 rows of a matrix as the file (or an
 * O_DIRECT read of it) holds them, against up to 4 input rows, with the packed tile's operations
 * and order (quant_impl.h): per block isum = the exact sum of kv[c] x_q, then
 * acc = fma(isum, scale(e) * d_x, acc), blocks in order. So a row's output has the same bits
 * whether its expert was packed at load or streamed from disk in the file's layout.
 * Why: an expert read under a memory budget stays in the file's layout (read straight into place,
 * no packing on the I/O lanes); packing its groups on the fly before the tile cost about twice the
 * tile itself at decode, where each group meets one or a few input rows.
 * Owns: pk_fp4_file. */
#include "quant_impl.h"
#include "quant_fp4.h"
#include "quant_tile.h"

#ifdef __AVX2__
/* The packed layout's 4 code vectors of block b, from the 8 rows' 16 code bytes: vector t holds
 * row j's bytes 4t..4t+3 at 4j (rows 0-3 in the low lane, 4-7 in the high one), an 8 x 4 dword
 * transpose in registers as quant_pack.c's packer makes it. */
FORCE_INLINE void fp4_codes(const uint8_t *const *rows, size_t at, __m256i *v)
{
    __m256i r[4];
    for (int j = 0; j < 4; j++)
        r[j] = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(rows[j] + at + 1))),
                                       _mm_loadu_si128((const __m128i *)(rows[j + 4] + at + 1)), 1);
    const __m256i t0 = _mm256_unpacklo_epi32(r[0], r[1]), t1 = _mm256_unpacklo_epi32(r[2], r[3]);
    const __m256i t2 = _mm256_unpackhi_epi32(r[0], r[1]), t3 = _mm256_unpackhi_epi32(r[2], r[3]);
    v[0] = _mm256_unpacklo_epi64(t0, t1);
    v[1] = _mm256_unpackhi_epi64(t0, t1);
    v[2] = _mm256_unpacklo_epi64(t2, t3);
    v[3] = _mm256_unpackhi_epi64(t2, t3);
}

FORCE_INLINE void fp4_file(const uint8_t *const *rows, const qact *x, int i0, const int NX, int nb, float *res,
                           int res_stride)
{
    const int8_t *xq[4];
    const float *xd[4];
    const int32_t *xi[4];
    act_rows(x, i0, NX, nb, xq, xd, NULL, xi);
    const __m256i tbl = fp4_table(), m15 = _mm256_set1_epi8(15);
    /* a group's rows are 8 streams of 1.5 KB: too short for the hardware prefetcher, so the
     * next group's rows (the caller's next call) are fetched ahead into L2, each line once (one
     * every 4 blocks missed some: 13-17 against 18-20 GMAC/s from DRAM on a Zen 3, bench_mm) */
    const ptrdiff_t next = PK_ROWS * (rows[1] - rows[0]);
    __m256 acc[4];
    for (int k = 0; k < NX; k++) acc[k] = _mm256_setzero_ps();
    for (int b = 0; b < nb; b++) {
        const size_t at = (size_t)b * MXFP4_BYTES;
        if ((at & 63) < MXFP4_BYTES)      /* a block starts in this line: the first such */
            for (int j = 0; j < PK_ROWS; j++) _mm_prefetch((const char *)rows[j] + at + next, _MM_HINT_T1);
        __m256i v[4], is[4];
        fp4_codes(rows, at, v);
        for (int k = 0; k < NX; k++) is[k] = _mm256_set1_epi32(-FP4_OFF * xi[k][b]);
        for (int t = 0; t < 4; t++) {
            const __m256i lo = _mm256_shuffle_epi8(tbl, _mm256_and_si256(v[t], m15));
            const __m256i hi = _mm256_shuffle_epi8(tbl, _mm256_and_si256(_mm256_srli_epi16(v[t], 4), m15));
            for (int k = 0; k < NX; k++) {
                const int8_t *xk = xq[k] + (size_t)b * QK + 4 * t;
                is[k] = pk_dot4(pk_dot4(is[k], lo, bc4(xk)), hi, bc4(xk + 16));
            }
        }
        const __m256 dw = fp4_scales_of(_mm256_setr_epi32(rows[0][at], rows[1][at], rows[2][at], rows[3][at], rows[4][at],
                                                          rows[5][at], rows[6][at], rows[7][at]));
        for (int k = 0; k < NX; k++)
            acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[k]), _mm256_mul_ps(dw, _mm256_set1_ps(xd[k][b])), acc[k]);
    }
    for (int k = 0; k < NX; k++) _mm256_storeu_ps(res + (size_t)k * res_stride, acc[k]);
}

void pk_fp4_file(const uint8_t *const *rows, const qact *x, int i0, int NX, float *res, int res_stride)
{
    const int nb = x->cols / QK;
    for (; NX > 4; NX -= 4, i0 += 4, res += 4 * (size_t)res_stride) fp4_file(rows, x, i0, 4, nb, res, res_stride);
    switch (NX) {
    case 1: fp4_file(rows, x, i0, 1, nb, res, res_stride); break;
    case 2: fp4_file(rows, x, i0, 2, nb, res, res_stride); break;
    case 3: fp4_file(rows, x, i0, 3, nb, res, res_stride); break;
    default: fp4_file(rows, x, i0, 4, nb, res, res_stride); break;
    }
}
#endif
