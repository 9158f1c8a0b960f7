/* quant_impl.h — what the quant_*.c files share; not an API (quant.h is).
 * Owns: the 32-block sizes, the f16 load and Q5 code helpers, the packed 8-row-group layout
 * (its byte offsets and accessors), the transposed F16 layout's shape, and the internal entry
 * points the files give each other (each named with the file that defines it). */
#ifndef COLI_QUANT_IMPL_H
#define COLI_QUANT_IMPL_H
#include "quant.h"
#include "gguf.h"
#include "quant_k.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) || defined(__F16C__)
#include <immintrin.h>
#endif
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#define QK 32
#define Q8_0_BYTES 34
#define Q4_0_BYTES 18
#define Q4_1_BYTES 20
#define Q5_0_BYTES 22
#define Q5_1_BYTES 24

#ifdef __AVX2__
#define FORCE_INLINE static inline __attribute__((always_inline))
#endif
#if defined(__AVX2__) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#define PK_ZMM 1    /* the 512-bit two-group tiles (quant_tile_zmm.c) */
#endif
#ifdef PK_ZMM
#define PK_NX 8     /* input rows of a 16-row tile (zmm kernels); a single group takes 4 */
#else
#define PK_NX 4
#endif

static inline float ld_f16(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return fp16_to_f32(h);
}

/* The 32 five-bit codes (0..31) of a Q5 block from its qh word (at p) and 16 nibble bytes
 * (at p + 4), minus off. */
static inline void q5_codes(const uint8_t *p, int off, int8_t *q)
{
    uint32_t qh;
    memcpy(&qh, p, 4);
    const uint8_t *qs = p + 4;
    for (int j = 0; j < 16; j++) {
        q[j] = (int8_t)(((qs[j] & 15) | ((qh >> j) & 1) << 4) - off);
        q[j + 16] = (int8_t)(((qs[j] >> 4) | ((qh >> (j + 16)) & 1) << 4) - off);
    }
}

/* ---- packed (interleaved) layout ------------------------------------------------------
 *
 * A group is 8 consecutive weight rows r0..r0+7 (j = r - r0); groups follow each other,
 * each 8 * row_bytes long. Within a group, per 32-block b (quantized types) or per value k
 * (F16):
 *   Q4_1: 160 bytes per block: f16 d[8], f16 m[8], then 4 vectors of 32 bytes; vector t,
 *         bytes 4j..4j+3 = qs_j[4t..4t+3] (low nibbles: values 4t..4t+3 of row j, high
 *         nibbles: values 16+4t..16+4t+3).
 *   Q8_0: 272 bytes per block: f16 d[8], then 8 vectors of 32 bytes; vector g, bytes
 *         4j..4j+3 = q_j[4g..4g+3] ^ 0x80 (q + 128 as unsigned: with VNNI, vpdpbusd takes
 *         them as the unsigned operand and the activations as the signed one; the sum is
 *         corrected by -128 * sum(x_q), the block's integer activation sum qact.qi).
 *   F16:  16 bytes per value k: the 8 rows' f16 values of column k.
 *   BF16: 32 bytes per pair of values k, k+1 (k even; cols must be even): bytes 4j..4j+3 = row j's
 *         4 file bytes of the pair, so one vector gives both columns' floats (<< 16 and & 0xffff0000).
 *         The tile keeps qdot_exact's order per output: 8 accumulators, value k into number k % 8,
 *         ((a0 + a4) + (a2 + a6)) + ((a1 + a5) + (a3 + a7)) at the end (lanes = the 8 rows).
 * One vpdpbusd (or maddubs+madd) of a weight vector with 4 activation bytes broadcast to
 * all lanes advances 8 dot products by 4 values: no horizontal reductions at all, the
 * unpacked weight vector is reused for every input row of the tile, the activation
 * broadcast for every weight group of the tile.
 *
 * Canonical operation order of one output (row r, input i), shared by every kernel here
 * (vector tiles of any size, the scalar fallback), so results never depend on n, the tile
 * or the thread count:
 *   quantized: acc = 0; for each block b in order:
 *                  isum = exact int32 sum of w_q * x_q over the block;
 *                  acc = fma((float)isum, d_w[b] * d_x[b], acc);
 *                  Q4_1 only: acc = fma(m_w[b], s_x[b], acc);       result acc
 *   F16:       e = o = 0; for k in order: (k even ? e : o) = fma(w_k, x_k, .); result e + o
 * Unpacked matrices are packed on the fly, 8 rows at a time, into a per-thread buffer (MXFP4 up
 * to 4 input rows: its tile on the file's layout, quant_tile_fp4.c, the same bits). */

#define PK_ROWS 8
/* input rows of a BF16 tile (8 accumulators per group and input row): 3 for the 512-bit tile, 1 otherwise */
#ifdef PK_ZMM
#define PK_BF16_NX 3
#else
#define PK_BF16_NX 1
#endif

/* Bytes of one 32-value block of a packed group (Q4_1, Q8_0). Q4_K is packed like Q4_1 with
 * its own scales, 1184 bytes per super-block of a group (148 per row and 256 values, the file:
 * 144): f16 d[8], f16 dmin[8] of the 8 rows, then 8 blocks of 144 bytes: u8 sc[8], u8 m[8] (the
 * rows' 6-bit scale and min of that sub-block) and Q4_1's 4 nibble vectors. The kernels form
 * dl = d * sc and ml = -(dmin * m) (dequant_row's products) and run Q4_1's tiles and order:
 * acc = fma(isum, dl * d_x, acc); acc = fma(ml, s_x, acc). */
#define PK_BLK(t) ((t) == GGML_Q4_1 ? 160 : (t) == GGML_Q5_0 ? 176 : (t) == GGML_Q5_1 ? 192 : (t) == GGML_MXFP4 ? 136 : 272)
/* MXFP4: 136 bytes per block (the file's 8 x 17): u8 e[8] (the rows' E8M0 exponents), then Q4_1's 4
 * nibble vectors. The tiles look the codes up in kv + 12 (0..24, unsigned: vpdpbusd's operand, one
 * byte shuffle per vector) and start each block's sum at -12 * sum(x_q) (qact.qi), so
 * isum = exact sum of kv[c] x_q; then Q8_0's step acc = fma(isum, scale(e) * d_x, acc). */
#define FP4_OFF 12
/* Q5_0 / Q5_1 (176 / 192 bytes per block, the file's 8 x 22 / 8 x 24): f16 d[8] [, f16 m[8]], Q4_1's 4
 * nibble vectors, then Q5_K's H vector of the codes' bit 4 (byte 4j+k: values 4t+k at bit t, 16+4t+k at
 * bit 4+t). Q4_1's tile and order: isum = exact sum of (code - 16 for Q5_0) x_q (Q5_0: the codes' sum
 * minus 16 qact.qi), acc = fma(isum, d * d_x, acc); Q5_1 also acc = fma(m, s_x, acc). */
#define PK_K4_SB 1184
/* Q6_K: 1680 bytes per super-block of a group (the file's 8 x 210): f16 d[8], then 8 blocks of
 * 208 bytes: int8 sc_a[8], sc_b[8] (the scales of values 0-15 and 16-31), then 6 vectors S_i of 32
 * bytes. Byte 4j+k of code vector C_c holds row j's code u = q + 32 of value 4(c/2)+k (c even) or
 * 16+4(c/2)+k (c odd), c < 8; bits 0-5 of byte 4j+k of S_i are C_i's (i < 6), its bits 6-7 bits
 * 2(i%3), 2(i%3)+1 of C_6's code (i < 3: value 12+k) or of C_7's (i >= 3: value 28+k). So
 * C_i = S_i & 63 and C_6 = (S_0 >> 6 & 3) | (S_1 >> 4 & 12) | (S_2 >> 2 & 48) (16-bit shifts).
 * (Until 2026-12-01: 4 nibble vectors + 2 vectors of top bits, ~2x the unpack instructions.)
 * Per block the tile keeps the two halves' exact sums apart: isum = sc_a (sum_a u x - 32 sum_a x) +
 * sc_b (sum_b u x - 32 sum_b x) (= sum sc q x, the row kernel's), then acc = fma(isum, d * d_x,
 * acc), blocks in order. */
#define PK_K6_SB 1680
#define K6OFF 32
/* Q2_K and Q3_K: layouts of the file's size (8 x 84 = 672 and 8 x 110 = 880 bytes per super-block
 * of a group). A super-block: a header (Q2_K: f16 d[8], f16 dmin[8], 32 bytes; Q3_K: f16 d[8], 16
 * bytes), then 8 blocks of 32 values:
 *   Q2_K, 80 bytes: u8 sm[16] (byte j: row j's sc | m << 4 of values 0-15, byte 8 + j: of values
 *         16-31, the file's bytes), then code vectors C0, C1 of 32 bytes: byte 4j+k of C0 holds row
 *         j's codes of values k, 4+k, 8+k, 12+k at bits 0, 2, 4, 6, C1 those of values 16+k, 20+k, ..
 *   Q3_K, 108 bytes: 12 scale bytes (row j's 6-bit scales u = sc + 32 of its halves a and b: byte j
 *         = (u_a & 15) | (u_b & 15) << 4; bytes 8-11, a little-endian word, bits 2j, 2j+1 = u_a >> 4
 *         and bits 16+2j, 17+2j = u_b >> 4), C0, C1 with the low 2 bits of the codes u = q + 4, and a
 *         vector H: byte 4j+k holds bit 2 of the codes of values 4t+k at bit t and of values 16+4t+k
 *         at bit 4+t (t < 4, Q5_K's H).
 * The tiles keep each half's exact sum apart, isum = sc_a (sum_a u x - off sum_a x) +
 * sc_b (sum_b u x - off sum_b x) (off: Q3_K 4, Q2_K 0), then acc = fma(isum, d * d_x, acc); Q2_K then
 * acc = fma(-(m_a sum_a x + m_b sum_b x), dmin * d_x, acc): quant_k.h's canonical order. */
#define K23(t) ((t) == GGML_Q2_K || (t) == GGML_Q3_K)
#define K23SB(t) ((t) == GGML_Q2_K ? 672 : 880)     /* bytes per super-block of a group */
#define K23HDR(t) ((t) == GGML_Q2_K ? 32 : 16)
#define K23BLK(t) ((t) == GGML_Q2_K ? 80 : 108)     /* bytes per block */
#define K23SC(t) ((t) == GGML_Q2_K ? 16 : 12)       /* offset of C0 in a block */
#define K23OFF(t) ((t) == GGML_Q3_K ? 4 : 0)
/* Q5_K: as Q4_K (1440 bytes per super-block of a group: 180 per row, the file 176) with a fifth
 * vector per block after the nibbles, H: byte 4j+k holds the codes' bit 4 of values 4t+k at bit t
 * and of values 16+4t+k at bit 4+t (t < 4). */
#define PK_K5_SB 1440
#define PK_KSB(t) ((t) == GGML_Q5_K ? PK_K5_SB : PK_K4_SB)
#define PK_NIB(t) ((t) == GGML_Q4_K || (t) == GGML_Q5_K || (t) == GGML_Q5_0 ? 16 : (t) == GGML_MXFP4 ? 8 : 32)   /* the nibbles' offset */
#define PK_HOFF(t) ((t) == GGML_Q5_1 ? 160 : 144)   /* the H vector's offset (Q5_K, Q5_0, Q5_1) */

/* IQ1_S … IQ3_S (quant_iqlow.h), transcoded at pack time into 4-bit codes of the type's 16-value
 * table (qiql_table: IQ2 +-8, 25, 43; IQ3 +-levels; IQ1 8 g +- 1): a code is the value's level
 * (bits 0-2) + 8 when negative. A super-block of a group: f16 d[8] (the rows' super-block d), then 8
 * blocks of u8 ls[8] (byte j: row j's half scales ls_a | ls_b << 4, each 0..15; the multipliers are
 * m = 2 ls + 1) and, from PK_IQL_C, the codes:
 *   IQ3_XXS, IQ3_S (8 levels: 4 bits a value), 1104 bytes (138 per row and 256 values; the files'
 *       98, 110): blocks of 136 bytes, the codes as Q4_1's 4 nibble vectors;
 *   IQ1_S … IQ2_S (3 levels: 3 bits a value), 848 bytes (106 per row; the files' 50-82): blocks of
 *       104 bytes, the codes in 3 bits, c3 = level | 4 when negative, in 3 vectors V0, V1, V2 of 32
 *       bytes: byte 4j+k of V_t holds row j's c3 of value 4t+k at bits 0-2 and of 16+4t+k at bits
 *       4-6, and bit i of the c3 of value 12+k at bit 3 (of 28+k at bit 7) of V_i. The tile's table
 *       has index bit 3 as don't-care, so steps 0-2 are a mask and a shuffle as the nibbles are.
 *       (Until 2026-12-06 the nibble layout too, and byte multipliers: 146 bytes a row, 1.3-2.9x
 *       the file's bytes in the expert cache.)
 * The tile looks the codes up in table + off (unsigned, one vpshufb per vector), sums the two
 * halves apart starting at -off * (their activation sums: qact.qh, qi - qh), and takes
 * isum = m_a sum_a + m_b sum_b, acc = fma(isum, (d * fscale) * d_x, acc), blocks in order. */
#define IQL(t) ((t) == GGML_IQ1_S || (t) == GGML_IQ1_M || (t) == GGML_IQ2_XXS || (t) == GGML_IQ2_XS || \
                (t) == GGML_IQ2_S || (t) == GGML_IQ3_XXS || (t) == GGML_IQ3_S)
#define IQL3(t) ((t) == GGML_IQ1_S || (t) == GGML_IQ1_M || (t) == GGML_IQ2_XXS || (t) == GGML_IQ2_XS || \
                 (t) == GGML_IQ2_S)
#define PK_IQL_C 8                                     /* the codes' offset in a block */
#define PK_IQL_BLK(t) (PK_IQL_C + (IQL3(t) ? 96 : 128))  /* bytes per block of a group */
#define PK_IQL_SB(t) (16 + 8 * PK_IQL_BLK(t))          /* bytes per super-block of a group */

/* Block b of a packed group g (Q4_1, Q5_0, Q5_1, Q8_0, MXFP4: fixed stride; K-quants: within its super-block). */
static inline const uint8_t *pk_blk(uint32_t t, const uint8_t *g, int b)
{
    if (t == GGML_Q4_K) return g + (size_t)(b / 8) * PK_K4_SB + 32 + (size_t)(b % 8) * 144;
    if (t == GGML_Q5_K) return g + (size_t)(b / 8) * PK_K5_SB + 32 + (size_t)(b % 8) * 176;
    if (t == GGML_Q6_K) return g + (size_t)(b / 8) * PK_K6_SB + 16 + (size_t)(b % 8) * 208;
    if (K23(t)) return g + (size_t)(b / 8) * K23SB(t) + K23HDR(t) + (size_t)(b % 8) * K23BLK(t);
    if (IQL(t)) return g + (size_t)(b / 8) * PK_IQL_SB(t) + 16 + (size_t)(b % 8) * PK_IQL_BLK(t);
    return g + (size_t)b * PK_BLK(t);
}

/* IQ1_S … IQ3_S: row j's code (the level + 8 when negative) of value v (0..31) of packed block blk. */
static inline int pk_iql_code(uint32_t t, const uint8_t *blk, int j, int v)
{
    const int h = v / 16, tt = (v % 16) / 4, k = v % 4;
    if (!IQL3(t)) {
        const uint8_t byte = blk[PK_IQL_C + 32 * tt + 4 * j + k];
        return h ? byte >> 4 : byte & 15;
    }
    int c3 = 0;
    if (tt < 3) c3 = (blk[PK_IQL_C + 32 * tt + 4 * j + k] >> (4 * h)) & 7;
    else
        for (int i = 0; i < 3; i++) c3 |= ((blk[PK_IQL_C + 32 * i + 4 * j + k] >> (3 + 4 * h)) & 1) << i;
    return (c3 & 3) | (c3 & 4) << 1;
}

/* IQ1_S … IQ3_S: row j's multiplier 2 ls + 1 of half h (0, 1) of packed block blk. */
static inline int pk_iql_m(const uint8_t *blk, int j, int h) { return 2 * ((blk[j] >> (4 * h)) & 15) + 1; }

/* Q4_K: row j's dl and ml of block b of packed group g (scalar, the kernels' values). */
static inline void pk_k4_scales(uint32_t t, const uint8_t *g, int b, int j, float *dl, float *ml)
{
    const uint8_t *h = g + (size_t)(b / 8) * PK_KSB(t), *blk = pk_blk(t, g, b);
    *dl = ld_f16(h + 2 * j) * (float)blk[j];
    *ml = -(ld_f16(h + 16 + 2 * j) * (float)blk[8 + j]);
}

/* Q6_K: row j's code u (0..63) of value v (0..31) of packed block blk. */
static inline int pk_k6_code(const uint8_t *blk, int j, int v)
{
    const int half = v / 16, t = (v % 16) / 4, k = v % 4, c = 2 * t + half;
    if (c < 6) return blk[16 + 32 * c + 4 * j + k] & 63;
    int u = 0;
    for (int e = 0; e < 3; e++) u |= (blk[16 + 32 * (3 * half + e) + 4 * j + k] >> 6) << (2 * e);
    return u;
}

/* Q2_K, Q3_K: row j's code u (Q2_K 0..3, Q3_K 0..7 = q + 4) of value v (0..31) of packed block blk. */
static inline int pk_k23_code(uint32_t t, const uint8_t *blk, int j, int v)
{
    const int half = v / 16, s = (v % 16) / 4, k = v % 4;
    int u = (blk[K23SC(t) + 32 * half + 4 * j + k] >> (2 * s)) & 3;
    if (t == GGML_Q3_K) u |= ((blk[K23SC(t) + 64 + 4 * j + k] >> (s + 4 * half)) & 1) << 2;
    return u;
}

/* Q2_K, Q3_K: row j's scale of half h (0: values 0-15, 1: 16-31) of packed block blk; *m its min
 * (Q2_K; 0 for Q3_K, whose scale is signed, -32..31). */
static inline int pk_k23_scale(uint32_t t, const uint8_t *blk, int j, int h, int *m)
{
    if (t == GGML_Q2_K) {
        *m = blk[8 * h + j] >> 4;
        return blk[8 * h + j] & 15;
    }
    uint32_t hw;
    memcpy(&hw, blk + 8, 4);
    *m = 0;
    return (int)(((blk[j] >> (4 * h)) & 15) | ((hw >> (16 * h + 2 * j)) & 3) << 4) - 32;
}

/* Short-row F16 matrices (the routed experts' down projections: 48 values per row) are
 * packed TRANSPOSED instead, in blocks of 32 rows: block b holds, for each column k, the 32
 * values W[32b .. 32b+31][k] side by side (data[((b * cols + k) * 32 + r % 32]), so one
 * block is read front to back. Their products run "row-major over outputs" (quant_tp.c): 32 outputs of one
 * input row are 4 vector accumulators, each a single fma chain over k, so a row of 48
 * values costs 48 fmas per 8 outputs without per-tile reductions. Canonical order for every
 * product with such a matrix, packed or not, any n: acc = 0; for k ascending:
 * acc = fma(w_k, x_k, acc). */
#define TP_MAXCOLS 64
#define TP_ROWS 32
static inline int tp_shape(uint32_t type, int rows, int cols)
{
    return type == GGML_F16 && cols <= TP_MAXCOLS && rows % TP_ROWS == 0 && rows > 0;
}

static inline size_t tp_index(int r, int k, int cols)
{
    return ((size_t)(r / TP_ROWS) * cols + k) * TP_ROWS + r % TP_ROWS;
}

/* ---- internal entry points ------------------------------------------------------------ */

/* quant_act.c: 64-byte aligned allocation (size rounded up to 64). */
void *alloc64(size_t bytes);

/* quant_rows.c: the row kernels (unpacked rows, up to QDOT_MAX input rows per call). */
#define QDOT_MAX 4
typedef void (*qkern)(const uint8_t *, const qact *, int, int, int, float *);
qkern kern_for(uint32_t t);    /* NULL: a float type (F32, F16) */
/* One weight row r against all x rows: res[i] for i < n (n values written). */
void row_all(const qmat *w, const qact *x, qkern kern, int r, float *res);
float dot_f32(const float *w, const float *x, int n);
float dot_f16(const uint8_t *w8, const float *x, int n);

/* quant_pack.c */
size_t pk_group_bytes(uint32_t t, int cols);
/* Packs group rows r0..r0+7 (rows >= nrows are zero) of row-major data into dst. */
void pk_group(uint32_t t, int cols, size_t row_bytes, const uint8_t *data, int r0, int nrows, uint8_t *dst);

/* quant_tp.c: the transposed F16 layout */
void tp_transpose(const uint8_t *src, size_t row_bytes, int rows, int cols, uint8_t *dst);
int mm_rows_tp(const mm_job *j, int r0, int r1);

/* quant_tile.c: one tile of NG (1, 2) groups x NX (1..PK_NX) input rows:
 * res[k * 8 * NG + g * 8 + j] = output (row j of group gp[g], input row i0 + k). */
void pk_tile(uint32_t t, const uint8_t *const *gp, int NG, const qact *x, int i0, int NX, float *res);
#ifdef __AVX2__
/* quant_tile_fp4.c: MXFP4's tile on 8 rows in the file's layout (rows[j]; a missing row may repeat
 * another), pk_tile's bits: res[k * res_stride + j] = output (row j, input row i0 + k). */
void pk_fp4_file(const uint8_t *const *rows, const qact *x, int i0, int NX, float *res, int res_stride);
#endif

/* quant_mm.c: the per-thread scratch buffer for packing unpacked matrices on the fly. */
uint8_t *pk_scratch(size_t bytes);

/* quant_exact.c: rows [r0, r1) of a job with float activations only (EXACT=1). */
void mm_rows_exact(const mm_job *j, int r0, int r1);
#endif
