/* quant_fp4.c — MXFP4's values (see quant_fp4.h); its packed layout and tiles are quant_pack.c's
 * and quant_tile*.c's, beside the other 32-block types.
 * Owns: qfp4_kvalues and qfp4_dequant (dequant_row's MXFP4 case). */
#include "quant_fp4.h"

const int8_t qfp4_kvalues[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

void qfp4_dequant(const uint8_t *row, float *out, int n)
{
    for (int b = 0; b < n / 32; b++, row += MXFP4_BYTES) {
        const float d = qfp4_scale(row[0]);
        const uint8_t *qs = row + 1;
        for (int i = 0; i < 16; i++) {
            out[32 * b + i] = d * (float)qfp4_kvalues[qs[i] & 15];
            out[32 * b + 16 + i] = d * (float)qfp4_kvalues[qs[i] >> 4];
        }
    }
}
