/* quant_tp.c — short-row F16 matrices (the routed experts' down projections) in the transposed
 * layout of 32-row blocks (quant_impl.h: tp_shape): the transpose and its tiles.
 * Owns: tp_transpose (SSE2 8 x 8 16-bit tiles), tp_tile (32 outputs x 1..TP_NX input rows, one fma
 * chain per output over the columns in order) and mm_rows_tp (a job's rows, transposed on the fly
 * when the matrix is not packed). */
#include "quant_impl.h"

#ifdef __SSE2__
/* 8 rows x 8 values (16-bit) at src (rows sst bytes apart) -> 8 columns at dst (dst_step bytes apart). */
static inline void tr8x8_16(const uint8_t *src, size_t sst, uint8_t *dst, size_t dst_step)
{
    __m128i a[8], t[8], u[8];
    for (int i = 0; i < 8; i++) a[i] = _mm_loadu_si128((const __m128i *)(src + (size_t)i * sst));
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm_unpacklo_epi16(a[2 * i], a[2 * i + 1]);
        t[2 * i + 1] = _mm_unpackhi_epi16(a[2 * i], a[2 * i + 1]);
    }
    /* u[0..3]: columns {0,1} {2,3} {4,5} {6,7} of rows 0-3; u[4..7]: the same of rows 4-7 */
    for (int h = 0; h < 2; h++) {
        u[4 * h + 0] = _mm_unpacklo_epi32(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 1] = _mm_unpackhi_epi32(t[4 * h + 0], t[4 * h + 2]);
        u[4 * h + 2] = _mm_unpacklo_epi32(t[4 * h + 1], t[4 * h + 3]);
        u[4 * h + 3] = _mm_unpackhi_epi32(t[4 * h + 1], t[4 * h + 3]);
    }
    for (int c = 0; c < 4; c++) {
        _mm_storeu_si128((__m128i *)(dst + (size_t)(2 * c) * dst_step), _mm_unpacklo_epi64(u[c], u[4 + c]));
        _mm_storeu_si128((__m128i *)(dst + (size_t)(2 * c + 1) * dst_step), _mm_unpackhi_epi64(u[c], u[4 + c]));
    }
}
#endif

void tp_transpose(const uint8_t *src, size_t row_bytes, int rows, int cols, uint8_t *dst)
{
    /* block by block: rows read front to back, a block's 32 x cols values written in L1;
     * 8 x 8 tiles of 16-bit values where SSE2 has them (an expert read from disk is packed
     * on every use; a scalar scatter cost as much as the read) */
    for (int b = 0; b < rows / TP_ROWS; b++) {
        uint8_t *blk = dst + 2 * (size_t)b * TP_ROWS * cols;
        int k0 = 0;
#ifdef __SSE2__
        for (; k0 + 8 <= cols; k0 += 8)
            for (int o = 0; o < TP_ROWS; o += 8)
                tr8x8_16(src + (size_t)(b * TP_ROWS + o) * row_bytes + 2 * (size_t)k0, row_bytes,
                         blk + 2 * ((size_t)k0 * TP_ROWS + o), 2 * TP_ROWS);
#endif
        for (int o = 0; o < TP_ROWS; o++) {
            const uint8_t *row = src + (size_t)(b * TP_ROWS + o) * row_bytes;
            for (int k = k0; k < cols; k++) {
                uint16_t v;
                memcpy(&v, row + 2 * k, 2);
                memcpy(blk + 2 * ((size_t)k * TP_ROWS + o), &v, 2);
            }
        }
    }
}

/* out[i * ost + o] for o < 32, i < NX (1 .. TP_NX): the 32 outputs of one transposed block wt
 * (cols x 32 values) against float input rows xs[i]. With AVX-512 one block's 32 weights of a
 * column are two registers, converted once for up to 8 input rows (same fma per lane). */
#ifdef __AVX512F__
#define TP_NX 8
#else
#define TP_NX 2
#endif
static inline __attribute__((always_inline)) void tp_tile(const uint8_t *wt, int cols, const float *const *xs,
                                                          const int NX, float *out, size_t ost)
{
#if defined(__AVX512F__)
    __m512 acc[TP_NX][2];
    for (int i = 0; i < NX; i++) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int k = 0; k < cols; k++) {
        const uint8_t *wk = wt + 2 * (size_t)k * TP_ROWS;
        const __m512 w0 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)wk));
        const __m512 w1 = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(wk + 32)));
        for (int i = 0; i < NX; i++) {
            const __m512 xb = _mm512_set1_ps(xs[i][k]);
            acc[i][0] = _mm512_fmadd_ps(w0, xb, acc[i][0]);
            acc[i][1] = _mm512_fmadd_ps(w1, xb, acc[i][1]);
        }
    }
    for (int i = 0; i < NX; i++) {
        _mm512_storeu_ps(out + (size_t)i * ost, acc[i][0]);
        _mm512_storeu_ps(out + (size_t)i * ost + 16, acc[i][1]);
    }
#elif defined(__AVX2__)
    __m256 acc[2][4];
    for (int i = 0; i < NX; i++)
        for (int c = 0; c < 4; c++) acc[i][c] = _mm256_setzero_ps();
    for (int k = 0; k < cols; k++) {
        const uint8_t *wk = wt + 2 * (size_t)k * TP_ROWS;
        __m256 w[4];
        for (int c = 0; c < 4; c++) w[c] = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(wk + 16 * c)));
        for (int i = 0; i < NX; i++) {
            const __m256 xb = _mm256_broadcast_ss(xs[i] + k);
            for (int c = 0; c < 4; c++) acc[i][c] = _mm256_fmadd_ps(w[c], xb, acc[i][c]);
        }
    }
    for (int i = 0; i < NX; i++)
        for (int c = 0; c < 4; c++) _mm256_storeu_ps(out + (size_t)i * ost + 8 * c, acc[i][c]);
#else
    for (int i = 0; i < NX; i++)
        for (int o = 0; o < TP_ROWS; o++) {
            float a = 0.0f;
            for (int k = 0; k < cols; k++) a = fmaf(ld_f16(wt + 2 * ((size_t)k * TP_ROWS + o)), xs[i][k], a);
            out[(size_t)i * ost + o] = a;
        }
#endif
}

/* tp_tile for nx (1 .. TP_NX) input rows, each NX a compile-time constant. */
static void tp_tiles(const uint8_t *wt, int cols, const float *const *xs, int nx, float *out, size_t ost)
{
    switch (nx) {
    case 1: tp_tile(wt, cols, xs, 1, out, ost); break;
#if TP_NX > 2
    case 2: tp_tile(wt, cols, xs, 2, out, ost); break;
    case 3: tp_tile(wt, cols, xs, 3, out, ost); break;
    case 4: tp_tile(wt, cols, xs, 4, out, ost); break;
    case 5: tp_tile(wt, cols, xs, 5, out, ost); break;
    case 6: tp_tile(wt, cols, xs, 6, out, ost); break;
    case 7: tp_tile(wt, cols, xs, 7, out, ost); break;
#endif
    default: tp_tile(wt, cols, xs, TP_NX, out, ost); break;
    }
}

/* Rows [r0, r1) (multiples of TP_ROWS) of a job whose matrix has tp_shape. Unpacked matrices
 * are transposed chunk by chunk into a per-thread buffer: the same products either way. */
int mm_rows_tp(const mm_job *j, int r0, int r1)
{
    const int n = j->x->n, cols = j->x->cols, nr = r1 - r0;
    const size_t st = (size_t)j->out_stride, bb = 2 * (size_t)TP_ROWS * cols;   /* bytes per block */
    const qmat *ws[2] = {j->w, j->w2};
    const uint8_t *wt[2] = {NULL, NULL};
    uint8_t *buf = NULL;
    for (int m = 0; m < (j->w2 ? 2 : 1); m++) {
        if (ws[m]->packed) {
            wt[m] = ws[m]->data + (size_t)(r0 / TP_ROWS) * bb;
        } else {
            if (!buf) buf = pk_scratch(2 * (size_t)nr * cols * 2);
            if (!buf) return -1;
            uint8_t *t = buf + (size_t)m * nr * cols * 2;
            tp_transpose(ws[m]->data + (size_t)r0 * ws[m]->row_bytes, ws[m]->row_bytes, nr, cols, t);
            wt[m] = t;
        }
    }
    float a[TP_NX * TP_ROWS], b[TP_NX * TP_ROWS];
    for (int r = 0; r < nr; r += TP_ROWS) {
        const size_t off = (size_t)(r / TP_ROWS) * bb;
        for (int i0 = 0; i0 < n; i0 += TP_NX) {
            const int nx = n - i0 < TP_NX ? n - i0 : TP_NX;
            const float *xs[TP_NX];
            for (int k = 0; k < nx; k++) {
                const int i = i0 + k;
                xs[k] = j->x->f + (size_t)(j->x->idx ? j->x->idx[i] : i) * cols;
            }
            if (!j->w2) {
                tp_tiles(wt[0] + off, cols, xs, nx, j->out + (size_t)i0 * st + r0 + r, st);
                continue;
            }
            tp_tiles(wt[0] + off, cols, xs, nx, a, TP_ROWS);
            tp_tiles(wt[1] + off, cols, xs, nx, b, TP_ROWS);
            for (int k = 0; k < nx; k++)
                for (int q = 0; q < TP_ROWS; q++)
                    j->out[(size_t)(i0 + k) * st + r0 + r + q] = qsilu_mul(a[k * TP_ROWS + q], b[k * TP_ROWS + q]);
        }
    }
    return 0;
}
