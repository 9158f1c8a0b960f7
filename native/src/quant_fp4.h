/* quant_fp4.h — MXFP4 (GGML 39, the OCP microscaling FP4 of gpt-oss's experts): blocks of 32
 * values, 17 bytes: one E8M0 exponent byte e, then 16 bytes of e2m1 codes (byte i: value i in the
 * low nibble, value 16 + i in the high one, as IQ4_NL). A code c indexes the e2m1 values doubled,
 * qfp4_kvalues = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, ..., -12} (int8), and the block's factor is half
 * of 2^(e - 127): value = qfp4_scale(e) * kv[c], both exact in float32 (a power of two times a
 * small integer), so the values are gguf-py's bit for bit. Every e is a finite power of two here
 * (llama.cpp's and gguf-py's reading: e = 0, 1 give the subnormals 2^-128, 2^-127; e = 255 gives
 * 2^127, not the spec's NaN). quant.c dispatches to these. */
#ifndef COLI_QUANT_FP4_H
#define COLI_QUANT_FP4_H
#include <stdint.h>
#include <string.h>

#define MXFP4_BYTES 17

extern const int8_t qfp4_kvalues[16];

/* 2^(e - 128) as float bits: the subnormals 0x00200000 << e for e < 2, else exponent field e - 1. */
static inline float qfp4_scale(uint8_t e)
{
    const uint32_t bits = e < 2 ? 0x00200000u << e : (uint32_t)(e - 1) << 23;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* One row of n values (n % 32 == 0) into out. */
void qfp4_dequant(const uint8_t *row, float *out, int n);
#endif
