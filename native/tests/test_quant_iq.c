/* test_quant_iq.c — IQ4_NL / IQ4_XS (src/quant_iq.c): dequant_row against the block layout
 * decoded here independently; qmat_mul (int8 activations) equal, bit for bit, to quant_iq.h's
 * canonical order written out in scalar code (whatever SIMD path the build took) and within the
 * activation rounding of a double dot; identical bits for n = 1 / n = 8 and 1-3 threads; the
 * EXACT mode (float activations) equal to qdot_exact of the dequantized row. The kernel checks are
 * iq_driver.h's; this file gives the rows and the canonical order. */
#include "gguf.h"
#include "quant.h"
#include "quant_iq.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TEST_SEED 0x5851f42d4c957f2dull
#include "check.h"
#include "iq_driver.h"

static const int KV[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void put16(uint8_t *p, float f) { uint16_t h = f32_to_fp16(f); memcpy(p, &h, 2); }
static float get16(const uint8_t *p) { uint16_t h; memcpy(&h, p, 2); return fp16_to_f32(h); }

/* Random codes and scales (not a quantizer), a sane f16 d; big = 1: the largest finite fp16 d. */
static void make_row(uint32_t t, uint8_t *p, int cols, int big)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    for (size_t j = 0; j < rb; j++) p[j] = (uint8_t)rnd32();
    const int step = t == GGML_IQ4_XS ? 136 : 18;
    for (size_t o = 0; o < rb; o += (size_t)step) put16(p + o, big ? (rnd32() & 1 ? 65504.0f : -65504.0f) : frand() * 0.01f);
}

/* The row's values decoded from the layout (IQ4_XS: f16 d, u16 scales_h, u8 scales_l[4], qs[128]). */
static void ref_decode(uint32_t t, const uint8_t *p, float *out, int cols)
{
    for (int b = 0; b < cols / 32; b++) {
        const uint8_t *qs;
        float s;
        if (t == GGML_IQ4_NL) {
            s = get16(p + 18 * b);
            qs = p + 18 * b + 2;
        } else {
            const uint8_t *sb = p + 136 * (b / 8);
            const int j = b % 8, sh = sb[2] | sb[3] << 8;
            const int ls = ((sb[4 + j / 2] >> (4 * (j % 2))) & 15) | (((sh >> (2 * j)) & 3) << 4);
            s = get16(sb) * (float)(ls - 32);
            qs = sb + 8 + 16 * j;
        }
        for (int i = 0; i < 16; i++) {
            out[32 * b + i] = s * (float)KV[qs[i] & 15];
            out[32 * b + 16 + i] = s * (float)KV[qs[i] >> 4];
        }
    }
}

static void test_dequant(uint32_t t, int cols)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols);
    uint8_t *W = malloc(rb);
    float *a = malloc(sizeof(float) * cols), *b = malloc(sizeof(float) * cols);
    int same = 1;
    for (int r = 0; r < 40; r++) {
        make_row(t, W, cols, r % 4 == 3);
        dequant_row(t, W, a, cols);
        ref_decode(t, W, b, cols);
        same &= memcmp(a, b, sizeof(float) * cols) == 0;
    }
    CHECK(same, "%s: dequant_row differs from the layout", ggml_type_name(t));
    printf("  %-6s dequant_row = the layout decoded here, 40 rows x %d: %s\n", ggml_type_name(t), cols, same ? "yes" : "NO");
    free(W); free(a); free(b);
}

/* A plain row (a sane d) for the kernel checks. */
static void make_plain(uint32_t t, uint8_t *p, int cols) { make_row(t, p, cols, 0); }

/* The canonical order: 8 lanes, block b in lane b % 8. */
static int iq4_order(uint32_t t, const uint8_t *row, const qact *a, int i, int cols, float got)
{
    const int nb = cols / 32;
    const int8_t *xq = a->q + (size_t)i * cols;
    const float *xd = a->qd + (size_t)i * nb;
    float L[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int b = 0; b < nb; b++) {
        int8_t q[32];
        float s;
        qiq_block(t, row, b, q, &s);
        int32_t is = 0;
        for (int j = 0; j < 32; j++) is += q[j] * xq[32 * b + j];
        L[b % 8] = fmaf((float)is, s * xd[b], L[b % 8]);
    }
    const float acc = ((L[0] + L[4]) + (L[2] + L[6])) + ((L[1] + L[5]) + (L[3] + L[7]));
    return fbits(got) == fbits(acc);
}

int main(void)
{
    printf("IQ4_NL / IQ4_XS\n");
    test_dequant(GGML_IQ4_XS, 1024);
    test_dequant(GGML_IQ4_NL, 352);
    iq_test_kernel(GGML_IQ4_XS, 19, 512, 5, make_plain, iq4_order);
    iq_test_kernel(GGML_IQ4_XS, 300, 256, 3, make_plain, iq4_order);     /* large enough to run in parallel */
    iq_test_kernel(GGML_IQ4_XS, 7, 2048, 4, make_plain, iq4_order);
    iq_test_kernel(GGML_IQ4_NL, 19, 96, 5, make_plain, iq4_order);       /* 3 blocks: a short group */
    iq_test_kernel(GGML_IQ4_NL, 37, 288, 2, make_plain, iq4_order);      /* 9 blocks: 8 + 1 */
    iq_test_kernel(GGML_IQ4_NL, 300, 352, 3, make_plain, iq4_order);
    iq_test_determinism_exact(GGML_IQ4_XS, 301, 256, make_plain);
    iq_test_determinism_exact(GGML_IQ4_NL, 301, 352, make_plain);
    if (fails) {
        printf("test_quant_iq: %d FAILED\n", fails);
        return 1;
    }
    printf("test_quant_iq: all passed\n");
    return 0;
}
