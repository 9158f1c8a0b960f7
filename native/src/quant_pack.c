/* quant_pack.c — the packed (interleaved 8-row group) layouts: which types and shapes pack,
 * their sizes, packing a matrix (qpack) or one group on the fly (pk_group), and reading a row
 * back (qmat_row). The layouts themselves are described in quant_impl.h.
 * Owns: qpack_ok, qpack_bytes, qpack, qmat_row, pk_group_bytes, pk_group (one packer per type
 * family: F16, BF16, Q4_1, Q5_0 / Q5_1, Q8_0, MXFP4, Q4_K, Q5_K, the Q6_K / Q2_K / Q3_K family, the IQ1-IQ3
 * types transcoded). */
#include "quant_impl.h"
#include "quant_fp4.h"
#include "quant_iqlow.h"

static int pk_type(uint32_t t)
{
    return t == GGML_Q4_1 || t == GGML_Q8_0 || t == GGML_F16 || t == GGML_Q4_K || t == GGML_Q5_K ||
           t == GGML_Q6_K || t == GGML_Q3_K || t == GGML_Q2_K || t == GGML_BF16 || t == GGML_Q5_0 || t == GGML_Q5_1 || t == GGML_MXFP4 ||
           IQL(t);
}

int qpack_ok(uint32_t type, int rows, int cols)
{
    if (!pk_type(type) || rows <= 0 || cols <= 0) return 0;
    const int k = type == GGML_Q4_K || type == GGML_Q5_K || type == GGML_Q6_K || type == GGML_Q3_K || type == GGML_Q2_K ||
                  IQL(type);
    if (type == GGML_BF16) return cols % 2 == 0;
    return type == GGML_F16 || cols % (k ? 256 : QK) == 0;
}

size_t pk_group_bytes(uint32_t t, int cols)
{
    if (t == GGML_Q4_K || t == GGML_Q5_K) return (size_t)(cols / 256) * PK_KSB(t);
    if (t == GGML_Q6_K) return (size_t)(cols / 256) * PK_K6_SB;
    if (K23(t)) return (size_t)(cols / 256) * K23SB(t);
    if (IQL(t)) return (size_t)(cols / 256) * PK_IQL_SB(t);
    return t == GGML_F16 || t == GGML_BF16 ? (size_t)cols * 16 : (size_t)(cols / QK) * PK_BLK(t);
}

size_t qpack_bytes(uint32_t type, int rows, int cols)
{
    if (!qpack_ok(type, rows, cols)) return 0;
    return (size_t)((rows + PK_ROWS - 1) / PK_ROWS) * pk_group_bytes(type, cols);
}

/* ---- packing one group: src[j] is row j of the group, NULL for a padding row (zeros) ---- */

static void pk_group_f16(const uint8_t *const *src, int cols, uint8_t *dst)
{
    for (int k = 0; k < cols; k++)
        for (int j = 0; j < PK_ROWS; j++) {
            if (src[j]) memcpy(dst + 16 * (size_t)k + 2 * j, src[j] + 2 * (size_t)k, 2);
            else memset(dst + 16 * (size_t)k + 2 * j, 0, 2);
        }
}

#ifdef __SSE2__
/* Eight rows' 16-byte vectors q as the packed layout's four 32-byte vectors at o + 32 v: row j's
 * dword v at o + 32 v + 4 j (two 4 x 4 dword transposes). */
static void pk_store_8x4(const __m128i *q, uint8_t *o)
{
    for (int h = 0; h < 2; h++) {     /* rows 4h..4h+3 -> bytes 16h..16h+15 of each vector */
        const __m128i *a = q + 4 * h;
        __m128i t0 = _mm_unpacklo_epi32(a[0], a[1]), t1 = _mm_unpacklo_epi32(a[2], a[3]);
        __m128i t2 = _mm_unpackhi_epi32(a[0], a[1]), t3 = _mm_unpackhi_epi32(a[2], a[3]);
        _mm_storeu_si128((__m128i *)(o + 16 * h), _mm_unpacklo_epi64(t0, t1));
        _mm_storeu_si128((__m128i *)(o + 32 + 16 * h), _mm_unpackhi_epi64(t0, t1));
        _mm_storeu_si128((__m128i *)(o + 64 + 16 * h), _mm_unpacklo_epi64(t2, t3));
        _mm_storeu_si128((__m128i *)(o + 96 + 16 * h), _mm_unpackhi_epi64(t2, t3));
    }
}
#endif

/* BF16: per pair of columns the 8 rows' 4-byte words side by side (an 8 x 4-dword transpose per
 * 4 pairs where SSE2 has it and all 8 rows are present). */
static void pk_group_bf16(const uint8_t *const *src, int cols, uint8_t *dst)
{
    const int np = cols / 2;
    int p = 0;
#ifdef __SSE2__
    int full = 1;
    for (int j = 0; j < PK_ROWS; j++) full &= src[j] != NULL;
    for (; full && p + 4 <= np; p += 4) {
        __m128i q[8];
        for (int j = 0; j < PK_ROWS; j++) q[j] = _mm_loadu_si128((const __m128i *)(src[j] + 4 * (size_t)p));
        pk_store_8x4(q, dst + 32 * (size_t)p);     /* one 32-byte vector per column pair */
    }
#endif
    for (; p < np; p++)
        for (int j = 0; j < PK_ROWS; j++) {
            if (src[j]) memcpy(dst + 32 * (size_t)p + 4 * j, src[j] + 4 * (size_t)p, 4);
            else memset(dst + 32 * (size_t)p + 4 * j, 0, 4);
        }
}

#ifdef __SSE2__
/* Q4_1 with all 8 rows present: the quants' 8 x 4 dword transpose in registers. */
static void pk_group_q41_full(const uint8_t *const *src, int nb, uint8_t *dst)
{
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * 160;
        __m128i q[8];
        for (int j = 0; j < PK_ROWS; j++) {
            const uint8_t *s = src[j] + (size_t)b * Q4_1_BYTES;
            memcpy(o + 2 * j, s, 2);
            memcpy(o + 16 + 2 * j, s + 2, 2);
            q[j] = _mm_loadu_si128((const __m128i *)(s + 4));
        }
        pk_store_8x4(q, o + 32);
    }
}

/* Q4_K, all eight rows present: each 32-byte run of a row's codes holds two sub-blocks (low and
 * high nibbles); both become qs16 vectors (pk_group_q4k) from the same two loads. Streamed
 * experts are packed after every read, so this runs in the I/O lanes' critical path. */
static void pk_group_q4k_full(const uint8_t *const *src, int nb, uint8_t *dst)
{
    const __m128i lo = _mm_set1_epi8(0x0f), hi = _mm_set1_epi8((char)0xf0);
    for (int s = 0; s < nb / 8; s++) {
        uint8_t *h = dst + (size_t)s * PK_K4_SB, sc[PK_ROWS][8], m[PK_ROWS][8];
        for (int j = 0; j < PK_ROWS; j++) {
            const uint8_t *sb = src[j] + (size_t)s * 144;
            memcpy(h + 2 * j, sb, 2);
            memcpy(h + 16 + 2 * j, sb + 2, 2);
            qk_k4_scales(sb, sc[j], m[j]);
        }
        for (int p = 0; p < 4; p++) {
            uint8_t *oe = h + 32 + (size_t)(2 * p) * 144, *oo = oe + 144;
            __m128i qe[8], qo[8];
            for (int j = 0; j < PK_ROWS; j++) {
                const uint8_t *qs = src[j] + (size_t)s * 144 + 16 + 32 * p;
                const __m128i a = _mm_loadu_si128((const __m128i *)qs), b = _mm_loadu_si128((const __m128i *)(qs + 16));
                qe[j] = _mm_or_si128(_mm_and_si128(a, lo), _mm_slli_epi16(_mm_and_si128(b, lo), 4));
                qo[j] = _mm_or_si128(_mm_and_si128(_mm_srli_epi16(a, 4), lo), _mm_and_si128(b, hi));
                oe[j] = sc[j][2 * p];
                oe[8 + j] = m[j][2 * p];
                oo[j] = sc[j][2 * p + 1];
                oo[8 + j] = m[j][2 * p + 1];
            }
            pk_store_8x4(qe, oe + 16);
            pk_store_8x4(qo, oo + 16);
        }
    }
}
#endif

static void pk_group_q41(const uint8_t *const *src, int nb, uint8_t *dst)
{
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * 160;
        for (int j = 0; j < PK_ROWS; j++) {
            const uint8_t *s = src[j] ? src[j] + (size_t)b * Q4_1_BYTES : NULL;
            if (!s) {
                memset(o + 2 * j, 0, 2);
                memset(o + 16 + 2 * j, 0, 2);
                for (int v = 0; v < 4; v++) memset(o + 32 + 32 * v + 4 * j, 0, 4);
                continue;
            }
            memcpy(o + 2 * j, s, 2);
            memcpy(o + 16 + 2 * j, s + 2, 2);
            for (int v = 0; v < 4; v++) memcpy(o + 32 + 32 * v + 4 * j, s + 4 + 4 * v, 4);
        }
    }
}

static void pk_group_q80(const uint8_t *const *src, int nb, uint8_t *dst)
{
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * 272;
        for (int j = 0; j < PK_ROWS; j++) {
            const uint8_t *s = src[j] ? src[j] + (size_t)b * Q8_0_BYTES : NULL;
            if (!s) {
                memset(o + 2 * j, 0, 2);
                for (int v = 0; v < 8; v++) memset(o + 16 + 32 * v + 4 * j, 0x80, 4);
                continue;
            }
            memcpy(o + 2 * j, s, 2);
            for (int v = 0; v < 8; v++) {
                uint32_t q4;
                memcpy(&q4, s + 2 + 4 * v, 4);
                q4 ^= 0x80808080u;
                memcpy(o + 16 + 32 * v + 4 * j, &q4, 4);
            }
        }
    }
}

#ifdef __SSE2__
/* MXFP4 with all 8 rows present: the codes' 8 x 4 dword transpose in registers, as Q4_1's. A
 * streamed expert is kept in the file's layout and, past 4 input rows a tile, packed group by
 * group as the tiles run (quant_mm.c pk_get), so this runs on every such use of it: the scalar
 * packer below cost as much as the tile. */
static void pk_group_fp4_full(const uint8_t *const *src, int nb, uint8_t *dst)
{
    /* the rows of a group are 8 x 1.5 KB side by side: too short a stream each for the hardware
     * prefetcher, so the next group's rows are fetched in software, into L2 */
    const ptrdiff_t next = PK_ROWS * (src[1] - src[0]);
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * PK_BLK(GGML_MXFP4);
        __m128i q[8];
        if (b % 4 == 0)
            for (int j = 0; j < PK_ROWS; j++) _mm_prefetch((const char *)src[j] + (size_t)b * MXFP4_BYTES + next, _MM_HINT_T1);
        for (int j = 0; j < PK_ROWS; j++) {
            const uint8_t *s = src[j] + (size_t)b * MXFP4_BYTES;
            o[j] = s[0];
            q[j] = _mm_loadu_si128((const __m128i *)(s + 1));
        }
        for (int h = 0; h < 2; h++) {     /* rows 4h..4h+3 -> bytes 16h..16h+15 of each vector */
            const __m128i *a = q + 4 * h;
            __m128i t0 = _mm_unpacklo_epi32(a[0], a[1]), t1 = _mm_unpacklo_epi32(a[2], a[3]);
            __m128i t2 = _mm_unpackhi_epi32(a[0], a[1]), t3 = _mm_unpackhi_epi32(a[2], a[3]);
            uint8_t *v = o + PK_NIB(GGML_MXFP4) + 16 * h;
            _mm_storeu_si128((__m128i *)v, _mm_unpacklo_epi64(t0, t1));
            _mm_storeu_si128((__m128i *)(v + 32), _mm_unpackhi_epi64(t0, t1));
            _mm_storeu_si128((__m128i *)(v + 64), _mm_unpacklo_epi64(t2, t3));
            _mm_storeu_si128((__m128i *)(v + 96), _mm_unpackhi_epi64(t2, t3));
        }
    }
}
#endif

/* MXFP4: per block the rows' exponent bytes, their 16 code bytes as Q4_1's vectors (in registers
 * where SSE2 has it and all 8 rows are present, as BF16's). */
static void pk_group_fp4(const uint8_t *const *src, int nb, uint8_t *dst)
{
#ifdef __SSE2__
    if (src[PK_ROWS - 1]) {                 /* padding rows are the last ones */
        pk_group_fp4_full(src, nb, dst);
        return;
    }
#endif
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * PK_BLK(GGML_MXFP4);
        for (int j = 0; j < PK_ROWS; j++) {
            static const uint8_t zero[MXFP4_BYTES];
            const uint8_t *s = src[j] ? src[j] + (size_t)b * MXFP4_BYTES : zero;
            o[j] = s[0];
            for (int v = 0; v < 4; v++) memcpy(o + PK_NIB(GGML_MXFP4) + 32 * v + 4 * j, s + 1 + 4 * v, 4);
        }
    }
}

/* Row j's 32 codes c (qiql_transcode's byte i: value i's code | value 16 + i's << 4) into packed
 * block o: the IQ1 / IQ2 types' 3-bit vectors (quant_impl.h), four lanes k of a step at once in a
 * 32-bit word. */
static inline __attribute__((always_inline)) void pk_iql3_codes(const uint8_t c[16], int j, uint8_t *o)
{
    uint32_t w[4];
    for (int tt = 0; tt < 4; tt++) {
        memcpy(&w[tt], c + 4 * tt, 4);
        w[tt] = (w[tt] & 0x33333333u) | ((w[tt] >> 1) & 0x44444444u);     /* sign bit 3 -> 2 per nibble */
    }
    for (int i = 0; i < 3; i++) {
        const uint32_t v = w[i] | ((w[3] >> i) & 0x11111111u) << 3;
        memcpy(o + PK_IQL_C + 32 * i + 4 * j, &v, 4);
    }
}

/* IQ1_S … IQ3_S: each row's super-blocks transcoded (qiql_transcode) into the group's code vectors
 * (IQ3's nibble vectors, the others' 3-bit ones) and half scales (m = 2 ls + 1 -> ls, a nibble
 * each: every type's ls is 0..15), their d into the headers. */
static void pk_group_iql(uint32_t t, const uint8_t *const *src, int nb, uint8_t *dst)
{
    const size_t sbb = ggml_row_bytes(t, 256), gsb = PK_IQL_SB(t), blk = PK_IQL_BLK(t);
    const int c3 = IQL3(t);
    for (int s = 0; s < nb / 8; s++) {
        uint8_t *h = dst + (size_t)s * gsb;
        for (int j = 0; j < PK_ROWS; j++) {
            uint8_t codes[8][16], m[8][2];
            uint16_t d = 0;
            if (src[j]) d = qiql_transcode(t, src[j] + (size_t)s * sbb, codes, m);
            else {
                memset(codes, 0, sizeof codes);
                memset(m, 0, sizeof m);
            }
            memcpy(h + 2 * j, &d, 2);
            for (int bb = 0; bb < 8; bb++) {
                uint8_t *o = h + 16 + (size_t)bb * blk;
                o[j] = (uint8_t)(m[bb][0] >> 1 | (m[bb][1] >> 1) << 4);     /* m odd: ls = m >> 1 */
                if (c3) pk_iql3_codes(codes[bb], j, o);
                else
                    for (int v = 0; v < 4; v++) memcpy(o + PK_IQL_C + 32 * v + 4 * j, codes[bb] + 4 * v, 4);
            }
        }
    }
}

/* Q5_0 / Q5_1: per block the rows' d [and m], their 16 nibble bytes as Q4_1's vectors, bit 4 of the
 * codes (the file's qh word) as the H vector. */
static void pk_group_q5(uint32_t t, const uint8_t *const *src, int nb, uint8_t *dst)
{
    const size_t bsz = t == GGML_Q5_1 ? Q5_1_BYTES : Q5_0_BYTES, hq = t == GGML_Q5_1 ? 4 : 2;
    for (int b = 0; b < nb; b++) {
        uint8_t *o = dst + (size_t)b * PK_BLK(t);
        for (int j = 0; j < PK_ROWS; j++) {
            static const uint8_t zero[Q5_1_BYTES];
            const uint8_t *s = src[j] ? src[j] + (size_t)b * bsz : zero;
            uint32_t qh;
            memcpy(&qh, s + hq, 4);
            memcpy(o + 2 * j, s, 2);
            if (t == GGML_Q5_1) memcpy(o + 16 + 2 * j, s + 2, 2);
            for (int v = 0; v < 4; v++) memcpy(o + PK_NIB(t) + 32 * v + 4 * j, s + hq + 4 + 4 * v, 4);
            for (int k = 0; k < 4; k++) {
                uint8_t byte = 0;
                for (int tt = 0; tt < 4; tt++)
                    byte |= (uint8_t)(((qh >> (4 * tt + k)) & 1) << tt | ((qh >> (16 + 4 * tt + k)) & 1) << (4 + tt));
                o[PK_HOFF(t) + 4 * j + k] = byte;
            }
        }
    }
}

static void pk_group_q4k(const uint8_t *const *src, int nb, uint8_t *dst)
{
    const uint32_t t = GGML_Q4_K;
    for (int b = 0; b < nb; b++) {
        uint8_t *h = dst + (size_t)(b / 8) * PK_K4_SB, *o = (uint8_t *)pk_blk(t, dst, b);
        for (int j = 0; j < PK_ROWS; j++) {
            uint8_t qs[16] = {0}, d4[4] = {0};
            int sc = 0, m = 0;
            if (src[j]) {
                const uint8_t *sb = src[j] + (size_t)(b / 8) * 144;
                qk_q4k_raw(sb, b % 8, &sc, &m, qs);
                memcpy(d4, sb, 4);
            }
            if (b % 8 == 0) {
                memcpy(h + 2 * j, d4, 2);
                memcpy(h + 16 + 2 * j, d4 + 2, 2);
            }
            o[j] = (uint8_t)sc;
            o[8 + j] = (uint8_t)m;
            for (int v = 0; v < 4; v++) memcpy(o + 16 + 32 * v + 4 * j, qs + 4 * v, 4);
        }
    }
}

/* Q5_K: row j's 32 codes u of one block into the nibble vectors and the bit-4 vector H. */
static void pk_q5k_codes(const int8_t *u, int j, uint8_t *o)
{
    for (int tt = 0; tt < 4; tt++)
        for (int k = 0; k < 4; k++) {
            const int a = u[4 * tt + k], c = u[16 + 4 * tt + k];
            o[16 + 32 * tt + 4 * j + k] = (uint8_t)((a & 15) | (c & 15) << 4);
        }
    for (int k = 0; k < 4; k++) {
        uint8_t byte = 0;
        for (int tt = 0; tt < 4; tt++)
            byte |= (uint8_t)(((u[4 * tt + k] >> 4) & 1) << tt | ((u[16 + 4 * tt + k] >> 4) & 1) << (4 + tt));
        o[144 + 4 * j + k] = byte;
    }
}

static void pk_group_q5k(const uint8_t *const *src, int nb, uint8_t *dst)
{
    const uint32_t t = GGML_Q5_K;
    for (int b = 0; b < nb; b++) {
        uint8_t *h = dst + (size_t)(b / 8) * PK_K5_SB, *o = (uint8_t *)pk_blk(t, dst, b);
        for (int j = 0; j < PK_ROWS; j++) {
            int8_t q[256] = {0};
            int sc[16] = {0}, m[16] = {0};
            float d, dmin;
            uint8_t d4[4] = {0};
            if (src[j]) {
                qk_unpack(t, src[j] + (size_t)(b / 8) * 176, q, sc, m, &d, &dmin);
                memcpy(d4, src[j] + (size_t)(b / 8) * 176, 4);
            }
            if (b % 8 == 0) {
                memcpy(h + 2 * j, d4, 2);
                memcpy(h + 16 + 2 * j, d4 + 2, 2);
            }
            o[j] = (uint8_t)sc[b % 8];
            o[8 + j] = (uint8_t)m[b % 8];
            pk_q5k_codes(q + 32 * (b % 8), j, o);
        }
    }
}

/* Q6_K: row j's block (codes q of 32 values, the int8 scales of its halves) into packed block o
 * (quant_impl.h: six code vectors S_i, bits 0-5 code vector C_i, bits 6-7 two bits of C_6 / C_7). */
static void pk_k6_block(const int8_t *q, const int *sc, int j, uint8_t *o)
{
    uint8_t u[32];
    for (int v = 0; v < 32; v++) u[v] = (uint8_t)(q[v] + K6OFF);
    o[j] = (uint8_t)(int8_t)sc[0];
    o[8 + j] = (uint8_t)(int8_t)sc[1];
    for (int i = 0; i < 6; i++)
        for (int k = 0; k < 4; k++) {
            const int top = u[16 * (i / 3) + 12 + k];   /* C_6 (values 12+k) in S_0..S_2, C_7 (28+k) in S_3..S_5 */
            o[16 + 32 * i + 4 * j + k] = (uint8_t)(u[16 * (i % 2) + 4 * (i / 2) + k] | ((top >> (2 * (i % 3))) & 3) << 6);
        }
}

/* Q2_K / Q3_K: row j's block (codes q of 32 values, the scales and mins of its halves) into packed
 * block o (quant_impl.h). */
static void pk_k23_block(uint32_t t, const int8_t *q, const int *sc, const int *m, int j, uint8_t *o)
{
    uint8_t *c = o + K23SC(t);
    if (t == GGML_Q2_K) {
        o[j] = (uint8_t)(sc[0] | m[0] << 4);
        o[8 + j] = (uint8_t)(sc[1] | m[1] << 4);
    } else {
        const int ua = sc[0] + 32, ub = sc[1] + 32;
        uint32_t hw;
        memcpy(&hw, o + 8, 4);
        hw = (hw & ~(3u << (2 * j)) & ~(3u << (16 + 2 * j))) | (uint32_t)(ua >> 4) << (2 * j) | (uint32_t)(ub >> 4) << (16 + 2 * j);
        memcpy(o + 8, &hw, 4);
        o[j] = (uint8_t)((ua & 15) | (ub & 15) << 4);
    }
    for (int half = 0; half < 2; half++)
        for (int k = 0; k < 4; k++) {
            uint8_t byte = 0, hb = 0;
            for (int s = 0; s < 4; s++) {
                const int u = q[16 * half + 4 * s + k] + K23OFF(t);
                byte |= (uint8_t)((u & 3) << (2 * s));
                hb |= (uint8_t)(((u >> 2) & 1) << s);
            }
            c[32 * half + 4 * j + k] = byte;
            if (t == GGML_Q3_K) c[64 + 4 * j + k] = (uint8_t)((c[64 + 4 * j + k] & ~(15 << (4 * half))) | hb << (4 * half));
        }
}

/* Q6_K, Q3_K, Q2_K: super-block s of row j (file block fs, NULL: a padding row) into the group. */
static void pk_k6_row(uint32_t t, const uint8_t *fs, int s, int j, uint8_t *dst)
{
    const size_t doff = t == GGML_Q6_K ? 208 : t == GGML_Q3_K ? 108 : 80;
    uint8_t *h = dst + (size_t)s * pk_group_bytes(t, 256);
    int8_t q[256];
    int sc[16], m[16];
    float d = 0.0f, dmin;
    if (fs) qk_unpack(t, fs, q, sc, m, &d, &dmin);
    else {
        memset(q, 0, sizeof q);
        memset(sc, 0, sizeof sc);
        memset(m, 0, sizeof m);
    }
    if (fs) memcpy(h + 2 * j, fs + doff, 2);
    else memset(h + 2 * j, 0, 2);
    if (t == GGML_Q2_K) {
        if (fs) memcpy(h + 16 + 2 * j, fs + doff + 2, 2);
        else memset(h + 16 + 2 * j, 0, 2);
    }
    for (int bb = 0; bb < 8; bb++) {
        uint8_t *o = (uint8_t *)pk_blk(t, dst, 8 * s + bb);
        if (t == GGML_Q6_K) pk_k6_block(q + 32 * bb, sc + 2 * bb, j, o);
        else pk_k23_block(t, q + 32 * bb, sc + 2 * bb, m + 2 * bb, j, o);
    }
}

static void pk_group_k6(uint32_t t, const uint8_t *const *src, int nb, uint8_t *dst)
{
    const size_t fb = t == GGML_Q6_K ? 210 : t == GGML_Q3_K ? 110 : 84;
    for (int s = 0; s < nb / 8; s++)
        for (int j = 0; j < PK_ROWS; j++) pk_k6_row(t, src[j] ? src[j] + (size_t)s * fb : NULL, s, j, dst);
}

#ifdef __AVX2__
/* The 8 x 8 dword transpose of eight 32-byte rows: dword g of r[j] becomes dword j of r[g]. */
static void pk_tr8x8(__m256i r[8])
{
    __m256i a[8], b[8];
    for (int k = 0; k < 4; k++) {
        a[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);
        a[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 2; k++) {     /* rows 4k..4k+3: dwords 0 / 4, 1 / 5, 2 / 6, 3 / 7 of each lane */
        b[4 * k] = _mm256_unpacklo_epi64(a[4 * k], a[4 * k + 2]);
        b[4 * k + 1] = _mm256_unpackhi_epi64(a[4 * k], a[4 * k + 2]);
        b[4 * k + 2] = _mm256_unpacklo_epi64(a[4 * k + 1], a[4 * k + 3]);
        b[4 * k + 3] = _mm256_unpackhi_epi64(a[4 * k + 1], a[4 * k + 3]);
    }
    for (int g = 0; g < 4; g++) {
        r[g] = _mm256_permute2x128_si256(b[g], b[4 + g], 0x20);
        r[4 + g] = _mm256_permute2x128_si256(b[g], b[4 + g], 0x31);
    }
}

/* bits 6-7 of each byte: bits sh..sh+1 of w's bytes */
static inline __m256i pk_top2(__m256i w, int sh)
{
    const __m256i two = _mm256_and_si256(_mm256_srl_epi16(w, _mm_cvtsi32_si128(sh)), _mm256_set1_epi8(3));
    return _mm256_slli_epi16(two, 6);
}

/* Q6_K, all eight rows present: per block each row's 32 six-bit codes (low nibbles from ql, two
 * bits from qh) in one vector, the eight vectors transposed to dword g of every row, and the six
 * code vectors of pk_k6_block built from them: S_0..S_5 take dwords 0, 4, 1, 5, 2, 6 (values
 * 0-11 and 16-27) with C_6 (dword 3) and C_7 (dword 7) spread over their top two bits. */
static void pk_group_q6k_full(const uint8_t *const *src, int nb, uint8_t *dst)
{
    const __m256i m4 = _mm256_set1_epi8(0x0f), m2 = _mm256_set1_epi8(3);
    for (int s = 0; s < nb / 8; s++) {
        uint8_t *h = dst + (size_t)s * PK_K6_SB;
        for (int j = 0; j < PK_ROWS; j++) memcpy(h + 2 * j, src[j] + (size_t)s * 210 + 208, 2);
        for (int bb = 0; bb < 8; bb++) {   /* values 128c + 32q .. +31 */
            const int c = bb / 4, q = bb % 4;
            const __m128i lsh = _mm_cvtsi32_si128(4 * (q / 2)), hsh = _mm_cvtsi32_si128(2 * q);
            uint8_t *o = h + 16 + (size_t)bb * 208;
            __m256i w[8];
            for (int j = 0; j < PK_ROWS; j++) {
                const uint8_t *fs = src[j] + (size_t)s * 210;
                const __m256i l = _mm256_loadu_si256((const __m256i *)(fs + 64 * c + 32 * (q % 2)));
                const __m256i hb = _mm256_loadu_si256((const __m256i *)(fs + 128 + 32 * c));
                w[j] = _mm256_or_si256(_mm256_and_si256(_mm256_srl_epi16(l, lsh), m4),
                                       _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(hb, hsh), m2), 4));
                o[j] = fs[192 + 2 * bb];
                o[8 + j] = fs[193 + 2 * bb];
            }
            pk_tr8x8(w);
            const __m256i S[6] = {
                _mm256_or_si256(w[0], pk_top2(w[3], 0)), _mm256_or_si256(w[4], pk_top2(w[3], 2)),
                _mm256_or_si256(w[1], pk_top2(w[3], 4)), _mm256_or_si256(w[5], pk_top2(w[7], 0)),
                _mm256_or_si256(w[2], pk_top2(w[7], 2)), _mm256_or_si256(w[6], pk_top2(w[7], 4)),
            };
            for (int i = 0; i < 6; i++) _mm256_storeu_si256((__m256i *)(o + 16 + 32 * i), S[i]);
        }
    }
}
#endif

/* The vector packers, for a group whose eight rows are all present; 0 when type t has none (a
 * padded group always goes the scalar way). */
static int pk_group_full(uint32_t t, const uint8_t *const *src, int nb, uint8_t *dst)
{
#ifdef __SSE2__
    if (t == GGML_Q4_1) return pk_group_q41_full(src, nb, dst), 1;
    if (t == GGML_Q4_K) return pk_group_q4k_full(src, nb, dst), 1;
#endif
#ifdef __AVX2__
    if (t == GGML_Q6_K) return pk_group_q6k_full(src, nb, dst), 1;
#endif
    (void)t, (void)src, (void)nb, (void)dst;
    return 0;
}

void pk_group(uint32_t t, int cols, size_t row_bytes, const uint8_t *data, int r0, int nrows, uint8_t *dst)
{
    const uint8_t *src[PK_ROWS];
    for (int j = 0; j < PK_ROWS; j++) src[j] = r0 + j < nrows ? data + (size_t)(r0 + j) * row_bytes : NULL;
    const int nb = cols / QK;
    if (r0 + PK_ROWS <= nrows && pk_group_full(t, src, nb, dst)) return;
    switch (t) {
    case GGML_F16: pk_group_f16(src, cols, dst); break;
    case GGML_BF16: pk_group_bf16(src, cols, dst); break;
    case GGML_Q4_1: pk_group_q41(src, nb, dst); break;
    case GGML_Q4_K: pk_group_q4k(src, nb, dst); break;
    case GGML_Q5_0:
    case GGML_Q5_1: pk_group_q5(t, src, nb, dst); break;
    case GGML_Q5_K: pk_group_q5k(src, nb, dst); break;
    case GGML_MXFP4: pk_group_fp4(src, nb, dst); break;
    case GGML_IQ1_S:
    case GGML_IQ1_M:
    case GGML_IQ2_XXS:
    case GGML_IQ2_XS:
    case GGML_IQ2_S:
    case GGML_IQ3_XXS:
    case GGML_IQ3_S: pk_group_iql(t, src, nb, dst); break;
    case GGML_Q6_K:
    case GGML_Q3_K:
    case GGML_Q2_K: pk_group_k6(t, src, nb, dst); break;
    default: pk_group_q80(src, nb, dst); break;      /* Q8_0 */
    }
}

void qpack(const qmat *w, uint8_t *dst)
{
    if (tp_shape(w->type, w->rows, w->cols)) {
        tp_transpose(w->data, w->row_bytes, w->rows, w->cols, dst);
        return;
    }
    qpack_rows(w, 0, w->rows, dst);
}

int qpack_rows(const qmat *w, int r0, int n, uint8_t *dst)
{
    if (tp_shape(w->type, w->rows, w->cols) || r0 < 0 || r0 % PK_ROWS) return -1;
    const size_t gb = pk_group_bytes(w->type, w->cols);
    const int end = n > w->rows - r0 ? w->rows : r0 + n;
    for (int r = r0; r < end; r += PK_ROWS)
        pk_group(w->type, w->cols, w->row_bytes, w->data, r, w->rows, dst + (size_t)(r / PK_ROWS) * gb);
    return 0;
}

/* ---- one row back from a packed group (the inverse of pk_group, dequant_row's arithmetic) ---- */

static void row_q80(const uint8_t *g, int b, int j, float *o)
{
    const uint8_t *blk = g + (size_t)b * 272;
    const float d = ld_f16(blk + 2 * j);
    for (int v = 0; v < QK; v++) o[v] = d * (float)(int8_t)(blk[16 + 32 * (v / 4) + 4 * j + v % 4] ^ 0x80);
}

static void row_k23(uint32_t t, const uint8_t *g, int b, int j, float *o)   /* dequant_row's (d * sc) * q [- dmin * m] */
{
    const uint8_t *blk = pk_blk(t, g, b), *hd = g + (size_t)(b / 8) * K23SB(t);
    const float d = ld_f16(hd + 2 * j);
    int ma, mb;
    const int sa = pk_k23_scale(t, blk, j, 0, &ma), sb = pk_k23_scale(t, blk, j, 1, &mb);
    if (t == GGML_Q2_K) {
        const float dm = ld_f16(hd + 16 + 2 * j);
        for (int v = 0; v < QK; v++)
            o[v] = d * (float)(v < 16 ? sa : sb) * (float)pk_k23_code(t, blk, j, v) - dm * (float)(v < 16 ? ma : mb);
        return;
    }
    const float da = d * (float)sa, db = d * (float)sb;
    for (int v = 0; v < QK; v++) o[v] = (v < 16 ? da : db) * (float)(pk_k23_code(t, blk, j, v) - 4);
}

static void row_q6k(const uint8_t *g, int b, int j, float *o)   /* (d * sc) * q, dequant_row's */
{
    const uint8_t *blk = pk_blk(GGML_Q6_K, g, b);
    const float d = ld_f16(g + (size_t)(b / 8) * PK_K6_SB + 2 * j);
    const float da = d * (float)(int8_t)blk[j], db = d * (float)(int8_t)blk[8 + j];
    for (int v = 0; v < QK; v++) o[v] = (v < 16 ? da : db) * (float)(pk_k6_code(blk, j, v) - K6OFF);
}

static void row_k45(uint32_t t, const uint8_t *g, int b, int j, float *o)   /* dl * q + (-ml): dequant_row's dl * q - ml */
{
    const uint8_t *blk = pk_blk(t, g, b);
    float d, m;
    pk_k4_scales(t, g, b, j, &d, &m);
    for (int k = 0; k < 16; k++) {
        const uint8_t byte = blk[16 + 32 * (k / 4) + 4 * j + k % 4];
        int a = byte & 15, c = byte >> 4;
        if (t == GGML_Q5_K) {
            const uint8_t hb = blk[144 + 4 * j + k % 4];
            a |= ((hb >> (k / 4)) & 1) << 4;
            c |= ((hb >> (4 + k / 4)) & 1) << 4;
        }
        o[k] = d * (float)a + m;
        o[k + 16] = d * (float)c + m;
    }
}

static void row_q5(uint32_t t, const uint8_t *g, int b, int j, float *o)   /* dequant_row's d * q [+ m] */
{
    const uint8_t *blk = g + (size_t)b * PK_BLK(t);
    const float d = ld_f16(blk + 2 * j), m = t == GGML_Q5_1 ? ld_f16(blk + 16 + 2 * j) : 0.0f;
    for (int v = 0; v < QK; v++) {
        const uint8_t byte = blk[PK_NIB(t) + 32 * ((v % 16) / 4) + 4 * j + v % 4];
        const int c = (v < 16 ? byte & 15 : byte >> 4) | ((blk[PK_HOFF(t) + 4 * j + v % 4] >> ((v % 16) / 4 + (v < 16 ? 0 : 4))) & 1) << 4;
        o[v] = t == GGML_Q5_1 ? d * (float)c + m : d * (float)(c - 16);
    }
}

static void row_fp4(const uint8_t *g, int b, int j, float *o)   /* dequant_row's scale(e) * kv[c] */
{
    const uint8_t *blk = g + (size_t)b * PK_BLK(GGML_MXFP4);
    const float d = qfp4_scale(blk[j]);
    for (int k = 0; k < 16; k++) {
        const uint8_t byte = blk[PK_NIB(GGML_MXFP4) + 32 * (k / 4) + 4 * j + k % 4];
        o[k] = d * (float)qfp4_kvalues[byte & 15];
        o[k + 16] = d * (float)qfp4_kvalues[byte >> 4];
    }
}

static void row_iql(uint32_t t, const uint8_t *g, int b, int j, float *o)   /* dequant_row's values (qiql_value) */
{
    const uint8_t *blk = pk_blk(t, g, b);
    const float d = ld_f16(g + (size_t)(b / 8) * PK_IQL_SB(t) + 2 * j);
    int8_t tab[16];
    int off;
    qiql_table(t, tab, &off);
    for (int k = 0; k < 16; k++) {
        o[k] = qiql_value(t, d, pk_iql_m(blk, j, 0), tab[pk_iql_code(t, blk, j, k)]);
        o[k + 16] = qiql_value(t, d, pk_iql_m(blk, j, 1), tab[pk_iql_code(t, blk, j, 16 + k)]);
    }
}

static void row_q41(const uint8_t *g, int b, int j, float *o)
{
    const uint8_t *blk = g + (size_t)b * 160;
    const float d = ld_f16(blk + 2 * j), m = ld_f16(blk + 16 + 2 * j);
    for (int k = 0; k < 16; k++) {
        const uint8_t byte = blk[32 + 32 * (k / 4) + 4 * j + k % 4];
        o[k] = d * (float)(byte & 15) + m;
        o[k + 16] = d * (float)(byte >> 4) + m;
    }
}

void qmat_row(const qmat *w, int r, float *out)
{
    if (!w->packed) {
        dequant_row(w->type, w->data + (size_t)r * w->row_bytes, out, w->cols);
        return;
    }
    if (tp_shape(w->type, w->rows, w->cols)) {
        for (int k = 0; k < w->cols; k++) out[k] = ld_f16(w->data + 2 * tp_index(r, k, w->cols));
        return;
    }
    const uint8_t *g = w->data + (size_t)(r / PK_ROWS) * pk_group_bytes(w->type, w->cols);
    const int j = r % PK_ROWS, cols = w->cols;
    if (w->type == GGML_F16) {
        for (int k = 0; k < cols; k++) out[k] = ld_f16(g + 16 * (size_t)k + 2 * j);
        return;
    }
    if (w->type == GGML_BF16) {    /* dequant_row's: the bf16 bits as a float's upper half */
        for (int k = 0; k < cols; k++) {
            uint16_t h;
            memcpy(&h, g + 32 * (size_t)(k / 2) + 4 * j + 2 * (k % 2), 2);
            const uint32_t u = (uint32_t)h << 16;
            memcpy(&out[k], &u, 4);
        }
        return;
    }
    for (int b = 0; b < cols / QK; b++) {
        float *o = out + b * QK;
        if (w->type == GGML_Q8_0) row_q80(g, b, j, o);
        else if (w->type == GGML_Q5_0 || w->type == GGML_Q5_1) row_q5(w->type, g, b, j, o);
        else if (K23(w->type)) row_k23(w->type, g, b, j, o);
        else if (w->type == GGML_Q6_K) row_q6k(g, b, j, o);
        else if (w->type == GGML_Q4_K || w->type == GGML_Q5_K) row_k45(w->type, g, b, j, o);
        else if (w->type == GGML_MXFP4) row_fp4(g, b, j, o);
        else if (IQL(w->type)) row_iql(w->type, g, b, j, o);
        else row_q41(g, b, j, o);
    }
}
