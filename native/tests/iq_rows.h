/* iq_rows.h — a random row of one of the IQ1_S … IQ3_S formats, for the IQ tests and benches:
 * random code bytes (not a quantizer's output) with a sane f16 d in each super-block (IQ1_M keeps
 * its d in the top nibbles of the super-block's last four u16s). Include after the file's own
 * rnd32() and frand() (check.h's, with TEST_SEED) and quant.h / gguf.h. */
#ifndef COLI_TEST_IQ_ROWS_H
#define COLI_TEST_IQ_ROWS_H
#include <math.h>
#include <string.h>

static void iq_random_row(uint32_t t, uint8_t *p, int cols)
{
    const size_t rb = ggml_row_bytes(t, (uint64_t)cols), sbb = rb / (size_t)(cols / 256);
    for (size_t j = 0; j < rb; j++) p[j] = (uint8_t)rnd32();
    for (size_t o = 0; o < rb; o += sbb) {
        const uint16_t d = f32_to_fp16(0.0005f + fabsf(frand()) * 0.004f);
        if (t != GGML_IQ1_M) {
            memcpy(p + o, &d, 2);
            continue;
        }
        for (int i = 0; i < 4; i++) {
            uint16_t sc;
            memcpy(&sc, p + o + 48 + 2 * i, 2);
            sc = (uint16_t)((sc & 0x0fff) | ((d >> (4 * i)) & 15) << 12);
            memcpy(p + o + 48 + 2 * i, &sc, 2);
        }
    }
}
#endif
