/* rows.h — random weight rows in each format for the kernel tests (random codes and scales,
 * not a quantizer; a Q8_0 row's first code is the extreme -128). Include after check.h with
 * TEST_SEED defined, and after quant.h / gguf.h. */
#ifndef COLI_TEST_ROWS_H
#define COLI_TEST_ROWS_H
#include <math.h>
#include <string.h>

static void put16(uint8_t *p, float f) { uint16_t h = f32_to_fp16(f); memcpy(p, &h, 2); }

/* Random row in the given format (random codes and scales, not a quantizer). */
static void make_row(uint32_t t, uint8_t *p, int cols)
{
    if (t == GGML_F32) {
        for (int j = 0; j < cols; j++) { float f = frand(); memcpy(p + 4 * j, &f, 4); }
        return;
    }
    if (t == GGML_F16) {
        for (int j = 0; j < cols; j++) put16(p + 2 * j, frand());
        return;
    }
    if (t == GGML_BF16) {
        for (int j = 0; j < cols; j++) {
            float f = frand();
            uint32_t u;
            memcpy(&u, &f, 4);
            p[2 * j] = (uint8_t)(u >> 16);
            p[2 * j + 1] = (uint8_t)(u >> 24);
        }
        return;
    }
    if (t >= GGML_Q2_K && t <= GGML_Q6_K) {   /* random codes and scales, sane f16 d (and dmin) */
        static const int bytes[] = {84, 110, 144, 176, 210}, d_at[] = {80, 108, 0, 0, 208};
        const int bb = bytes[t - GGML_Q2_K], da = d_at[t - GGML_Q2_K];
        for (int s = 0; s < cols / 256; s++, p += bb) {
            for (int j = 0; j < bb; j++) p[j] = (uint8_t)rnd32();
            put16(p + da, 0.0005f + fabsf(frand()) * 0.004f);
            if (t == GGML_Q2_K || t == GGML_Q4_K || t == GGML_Q5_K)
                put16(p + da + 2, fabsf(frand()) * 0.004f);
        }
        return;
    }
    for (int b = 0; b < cols / 32; b++) {
        if (t == GGML_Q8_0) {
            put16(p, 0.001f + fabsf(frand()) * 0.02f);
            for (int j = 0; j < 32; j++) p[2 + j] = (uint8_t)(int8_t)(rnd32() % 255 - 127);
            if (b == 0) p[2] = (uint8_t)(int8_t)-128;   /* extreme code */
            p += 34;
        } else if (t == GGML_Q4_0) {
            put16(p, frand() * 0.1f);
            for (int j = 0; j < 16; j++) p[2 + j] = (uint8_t)rnd32();
            p += 18;
        } else if (t == GGML_Q5_0 || t == GGML_Q5_1) {   /* d (, m), 4 bytes qh, 16 nibble bytes */
            const int h = t == GGML_Q5_1 ? 4 : 2;
            put16(p, t == GGML_Q5_1 ? fabsf(frand()) * 0.05f : frand() * 0.05f);
            if (t == GGML_Q5_1) put16(p + 2, frand() * 0.5f);
            for (int j = 0; j < 20; j++) p[h + j] = (uint8_t)rnd32();
            p += h + 20;
        } else {
            put16(p, fabsf(frand()) * 0.1f);
            put16(p + 2, frand() * 0.5f);
            for (int j = 0; j < 16; j++) p[4 + j] = (uint8_t)rnd32();
            p += 20;
        }
    }
}
#endif
