/* quant.h — weight formats and the matmul kernels over them.
 * Owns: fp16 conversion, F32/F16/Q8_0/Q4_1 row dot products, and the batched
 * matrix-times-rows kernel (each weight row read once for all input rows). */
#ifndef COLI_QUANT_H
#define COLI_QUANT_H
#include <stddef.h>
#include <stdint.h>

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);

/* Dequantize one row of n values of `type` into out. */
void dequant_row(uint32_t type, const void *row, float *out, int n);

/* A weight matrix: `rows` rows of `cols` values, row r at data + r*row_bytes.
 * packed != 0: data holds the interleaved layout of qpack() instead (same byte count when
 * rows % 8 == 0; see quant.c). Products are bit-identical either way. */
typedef struct {
    uint32_t type;
    int rows, cols;
    size_t row_bytes;
    const uint8_t *data;
    int packed;
} qmat;

/* Interleaved ("packed") layout: groups of 8 rows, values of the 8 rows side by side so
 * one vector instruction works on 8 output rows. Supported for Q4_1, Q8_0 (cols % 32 == 0)
 * and F16. qpack_ok: the type/shape can be packed. qpack_bytes: size of the packed matrix
 * (rows rounded up to 8). qpack: writes it to dst (padding rows are zero). */
int qpack_ok(uint32_t type, int rows, int cols);
size_t qpack_bytes(uint32_t type, int rows, int cols);
void qpack(const qmat *w, uint8_t *dst);
/* Packs `rows` (a multiple of 8) rows at data in place. 0 ok, -1 unsupported. */
int qpack_inplace(uint32_t type, int rows, int cols, uint8_t *data);

/* Activations prepared for dot products with a given weight type (e.g. quantized to
 * int8 blocks for Q8_0/Q4_1 weights). Buffers are owned by the caller via qact_*. */
typedef struct {
    int n, cols;            /* n input rows of `cols` values */
    uint32_t wtype;         /* weight type it was prepared for */
    float *f;               /* float copy (F32/F16 weights) */
    int8_t *q;              /* int8 quantized values, n*cols */
    float *qd;              /* per-32-block scales, n*(cols/32) */
    float *qs;              /* per-32-block sums of q*d (for Q4_1's min term) */
    size_t cap;
} qact;

void qact_prepare(qact *a, uint32_t wtype, const float *x, int n, int cols);
void qact_free(qact *a);
/* dst = rows[0..cnt) of src (floats and int8 blocks). 0 ok, -1 OOM. */
int qact_gather(qact *dst, const qact *src, const int *rows, int cnt);

/* out[i*out_stride + r] = dot(W row r, x row i) for r in [0,W.rows), i in [0,n).
 * Parallel over weight rows with OpenMP; every weight row is read once for all n rows. */
void qmat_mul(const qmat *w, const qact *x, float *out, int out_stride);
/* Several independent matmuls run as one parallel job (one synchronization).
 * w2 != NULL (same shape and type as w): out = silu(w x) * (w2 x) elementwise. */
typedef struct {
    const qmat *w, *w2;
    const qact *x;
    float *out;
    int out_stride;
} mm_job;
void qmat_mul_multi(const mm_job *jobs, int cnt);
/* Convenience: prepares activations internally (allocates scratch). */
void qmat_mul_f32(const qmat *w, const float *x, int n, float *out, int out_stride);
#endif
