/* quant_base.h — the bottom of the quant layer: the weight-matrix and activation types, fp16
 * conversion and the float dot, which the per-format files (quant_k, quant_iq) and everything
 * above them share. Includes nothing of the quant layer. */
#ifndef COLI_QUANT_BASE_H
#define COLI_QUANT_BASE_H
#include <stddef.h>
#include <stdint.h>

float fp16_to_f32(uint16_t h);
uint16_t f32_to_fp16(float f);


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

/* Activations prepared for dot products with a given weight type (e.g. quantized to
 * int8 blocks for Q8_0/Q4_1 weights). Buffers are owned by the caller via qact_*. */
typedef struct {
    int n, cols;            /* n input rows of `cols` values */
    uint32_t wtype;         /* weight type it was prepared for */
    float *f;               /* float copy (F32/F16 weights) */
    int8_t *q;              /* int8 quantized values, n*cols */
    float *qd;              /* per-32-block scales, n*(cols/32) */
    float *qs;              /* per-32-block sums of q*d (for Q4_1's min term) */
    int32_t *qi;            /* per-32-block integer sums of q (Q8_0's offset correction) */
    int32_t *qh;            /* per-32-block integer sums of q[0..15] (the K-quant tiles' half sums) */
    size_t cap;
    const int *idx;         /* NULL, or a view: input row k is row idx[k] of the buffers
                             * (only for packable weights: Q4_1, Q8_0, F16; see qpack_ok) */
    int exact;              /* set by the owner, kept by qact_prepare, copied by qact_gather:
                             * float activations only (EXACT=1). No int8 blocks are made;
                             * qmat_mul dequantizes each weight row (dequant_row's values) and
                             * takes float32 dots, see qdot_exact. */
} qact;

/* The EXACT-mode dot product of n floats: 8 lanes, lane l = fma chain over k % 8 == l
 * (k ascending), then ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)). AVX2 and the
 * portable loop give the same bits. */
float qdot_exact(const float *w, const float *x, int n);
#endif
