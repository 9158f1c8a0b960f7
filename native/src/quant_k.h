/* quant_k.h — llama.cpp's K-quants (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K: 256-value super-blocks
 * with 6- or 8-bit sub-block scales) and BF16: dequantization (the values of gguf's numpy
 * dequantizers, bit for bit) and their dot kernels against prepared activations. quant.c
 * dispatches to these; nothing else calls them. */
#ifndef COLI_QUANT_K_H
#define COLI_QUANT_K_H
#include <stdint.h>

#include "quant_base.h"

#define QK_K 256

int qk_is_k(uint32_t type);             /* Q2_K .. Q6_K */
/* The integer values and sub-block scales of one super-block (for the kernel tests):
 * sc/m per sub-block (8 of 32 values for Q4_K/Q5_K, else 16 of 16; m unused by Q3_K/Q6_K). */
void qk_unpack(uint32_t type, const uint8_t *blk, int8_t q[QK_K], int sc[16], int m[16], float *d, float *dmin);
/* Q4_K sub-block sub (0..7) of super-block sb as a Q4_1-like block (quant_pack.c's layout):
 * dl = d * sc, ml = -(dmin * m), qs16[t] = q[t] | q[t + 16] << 4. */
void qk_q4k_block(const uint8_t *sb, int sub, float *dl, float *ml, uint8_t qs16[16]);
/* The same with the raw 6-bit scale and min. */
void qk_q4k_raw(const uint8_t *sb, int sub, int *sc, int *m, uint8_t qs16[16]);
/* The raw 6-bit scales and mins of all eight sub-blocks of a Q4_K / Q5_K super-block. */
void qk_k4_scales(const uint8_t *sb, uint8_t sc[8], uint8_t m[8]);
/* One row of n values (n % 256 == 0 for K-quants) into out. BF16 too. */
void qk_dequant(uint32_t type, const uint8_t *row, float *out, int n);

/* res[k] = dot(weight row w, activation row i0 + k of x), k < nx; nb = cols / 32.
 * Canonical order, every path (AVX2 or portable) the same bits: 8 float lanes; lane l takes
 * block l (values 32l..32l+31) of every super-block in order. With the weight's integer values
 * q, the block's int8 activations x_q, scale d_x and float sum s_x (qact):
 *   Q4_K, Q5_K: packed like Q4_1 (quant_pack.c), ONE accumulator over the blocks in order:
 *              acc = fma(isum, (d sc) d_x, acc); acc = fma(-(dmin m), s_x, acc)
 *   Q3_K, Q6_K (two sub-blocks of 16, a and b): isum = sc_a sum_a q x_q + sc_b sum_b q x_q;
 *              packed by quant_pack.c: ONE accumulator, acc = fma(isum, d d_x, acc)
 *   Q2_K:      the same isum; msum = m_a sum_a x_q + m_b sum_b x_q; packed by quant_pack.c, ONE
 *              accumulator: acc = fma(isum, d d_x, acc); acc = fma(-msum, dmin d_x, acc)
 * result ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)).
 * BF16: the row converted to floats, then qdot_exact with each float activation row. */
void qk_dot(uint32_t type, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res);
#endif
