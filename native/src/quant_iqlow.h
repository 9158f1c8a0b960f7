/* quant_iqlow.h — llama.cpp's low-bit IQ types: IQ1_S (GGML 19), IQ1_M (29), IQ2_XXS (16), IQ2_XS
 * (17), IQ2_S (22), IQ3_XXS (18), IQ3_S (21). Super-blocks of 256 values, each 8 blocks of 32; a
 * value is a codebook ("grid") entry of a group of 8 (IQ3: 4) values picked by an index, times a
 * sign, times a block or half-block scale (quant_iqlow.c has the layouts; the grids are data,
 * quant_iq_grids.c). Dequantization gives the values of gguf-py's numpy dequantizers bit for bit.
 * The row kernel runs against int8 activations per 32-block (qact). quant.c dispatches to these. */
#ifndef COLI_QUANT_IQLOW_H
#define COLI_QUANT_IQLOW_H
#include <stdint.h>

#include "quant_base.h"

int qiql_is(uint32_t type);

/* One row of n values (n % 256 == 0) into out. */
void qiql_dequant(uint32_t type, const uint8_t *row, float *out, int n);

/* 32-block b of a row as integers: its 32 signed codes q (IQ1: 8 g + 1 or 8 g - 1, the grid value g
 * and the sign of its delta; IQ2 / IQ3: the signed grid value), the integer multipliers m[0] of
 * values 0-15 and m[1] of 16-31 and the float factor f (per super-block): the block's value j is
 * f * m[j / 16] * q[j] up to rounding (dequant_row rounds as gguf-py does; the kernel sums exactly
 * in integers and applies f once). */
void qiql_block(uint32_t type, const uint8_t *row, int b, int8_t q[32], int32_t m[2], float *f);

/* The packed layout's view of a type (quant_impl.h): the 16 signed values its 4-bit codes stand for
 * (*off: the largest magnitude, the tiles' unsigned offset), the factor f / d (1/8, 1/4 or 1), a
 * super-block's d as f16 bits, and block b's codes (byte i: value i low nibble, 16 + i high) and
 * half multipliers m[0], m[1] (2 ls + 1). Codes index qiql_table's values: code(q) is q's index. */
void qiql_table(uint32_t type, int8_t tab[16], int *off);
float qiql_fscale(uint32_t type);
/* One super-block sb transcoded: block j's codes (byte i: value i low nibble, 16 + i high) and half
 * multipliers m[j][0], m[j][1] (2 ls + 1); returns d's f16 bits. */
uint16_t qiql_transcode(uint32_t type, const uint8_t *sb, uint8_t codes[8][16], uint8_t m[8][2]);
/* dequant_row's value of signed code q with multiplier m and super-block d (the packed copy's rows) */
float qiql_value(uint32_t type, float d, int m, int q);

/* res[k] = dot(weight row w, activation row i0 + k of x), k < nx (<= 4); nb = cols / 32.
 * Canonical order, every path (AVX2, AVX-VNNI or portable) the same bits: 8 float lanes, lane l
 * takes block l of every super-block in order: isum = m[0] * (exact sum of q x_q over values 0-15)
 * + m[1] * (over 16-31), acc_l = fma((float)isum, f * d_x, acc_l); result
 * ((acc_0 + acc_4) + (acc_2 + acc_6)) + ((acc_1 + acc_5) + (acc_3 + acc_7)). */
void qiql_dot(uint32_t type, const uint8_t *w, const qact *x, int i0, int nx, int nb, float *res);
#endif
