/* quant_iq.h — llama.cpp's non-linear 4-bit types: IQ4_NL (GGML 20, blocks of 32: f16 d, 16
 * nibble bytes; 18 bytes) and IQ4_XS (GGML 23, super-blocks of 256: f16 d, u16 scales_h,
 * u8 scales_l[4], 128 nibble bytes; 136 bytes). A 4-bit code c indexes the fixed int8 table
 * kvalues_iq4nl; value = scale * kv[c] with the 32-block's scale d (IQ4_NL) or d * (ls - 32)
 * (IQ4_XS, ls the block's 6-bit scale: low 4 bits in scales_l, high 2 in scales_h).
 * Dequantization gives the values of gguf's numpy dequantizers bit for bit; the dot kernels run
 * against int8 activations per 32-block (qact). quant.c dispatches to these. */
#ifndef COLI_QUANT_IQ_H
#define COLI_QUANT_IQ_H
#include <stdint.h>

#include "quant_base.h"

extern const int8_t qiq_kvalues[16];

int qiq_is_iq(uint32_t type);           /* IQ4_NL, IQ4_XS */
/* 32-block b of a row: its 32 int8 values kv[c] (in value order) and its float scale (the
 * factor dequantization multiplies them by). */
void qiq_block(uint32_t type, const uint8_t *row, int b, int8_t q[32], float *scale);
/* One row of n values (n % 32 == 0 for IQ4_NL, n % 256 == 0 for IQ4_XS) into out. */
void qiq_dequant(uint32_t type, const uint8_t *row, float *out, int n);

/* res[k] = dot(weight row w, activation row i0 + k of x), k < nx (<= 4); nb = cols / 32.
 * Canonical order, every path (AVX2, AVX-VNNI or portable) the same bits (quant_k.h's row-kernel
 * order): 8 float lanes, lane l takes the blocks b with b % 8 == l in order (IQ4_XS: block l of
 * every super-block): isum = exact int32 sum of kv[c] * x_q over the block,
 * acc_l = fma((float)isum, scale * d_x, acc_l); result
 * ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)). */
void qiq_dot(uint32_t type, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res);
#endif
