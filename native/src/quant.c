/* quant.c — dequant_row: the values of every weight format, one row at a time.
 * Owns: dequant_row's dispatch over the types (the K-quants and BF16 in quant_k.c, IQ4 in
 * quant_iq.c, IQ1-IQ3 in quant_iqlow.c, MXFP4 in quant_fp4.c). It sits above the per-format files, which sit on quant_base.c (fp16, the float
 * dot): the quant layer has no import circle.
 * The rest of quant.h lives beside it: quant_act.c (activations), quant_rows.c (row kernels),
 * quant_pack.c (packed layouts), quant_tile*.c (packed tiles), quant_tp.c (transposed F16),
 * quant_mm.c (the matmul dispatch), quant_exact.c (EXACT=1); quant_impl.h is what they share.
 *
 * Determinism: every output element out[i][r] is computed by exactly one thread with
 * one fixed sequence of operations that depends only on (weight row r, input row i).
 * So results are bit-identical whatever the batch size n and the thread count.
 *
 * Quantized weights are multiplied with activations quantized per 32-block to int8
 * (scale d = max|x| / 127), like ggml's q8_0; Q4_1's min term uses the exact float
 * sum of the block's activations (qs), which is more accurate than d * sum(q).
 *
 * Block layouts (32 values each):
 *   Q8_0: f16 d, int8 q[32]            value j = d * q[j]
 *   Q4_0: f16 d, u8 qs[16]             value j = d * (nib_j - 8)
 *   Q4_1: f16 d, f16 m, u8 qs[16]      value j = d * nib_j + m
 *   Q5_0: f16 d, u32 qh, u8 qs[16]     value j = d * (q5_j - 16)
 *   Q5_1: f16 d, f16 m, u32 qh, u8 qs[16]   value j = d * q5_j + m
 * with nib_j = qs[j] & 15 for j < 16 and qs[j-16] >> 4 for j >= 16, and
 * q5_j = nib_j | ((qh >> j) & 1) << 4 (qh little-endian). */
#include "quant_impl.h"
#include "quant_iq.h"
#include "quant_fp4.h"
#include "quant_iqlow.h"

void dequant_row(uint32_t type, const void *row, float *out, int n)
{
    const uint8_t *p = row;
    int nb = n / QK;
    switch (type) {
    case GGML_F32:
        memcpy(out, row, (size_t)n * sizeof(float));
        break;
    case GGML_F16:
        for (int j = 0; j < n; j++) out[j] = ld_f16(p + 2 * (size_t)j);
        break;
    case GGML_Q8_0:
        for (int b = 0; b < nb; b++, p += Q8_0_BYTES) {
            float d = ld_f16(p);
            const int8_t *q = (const int8_t *)(p + 2);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)q[j];
        }
        break;
    case GGML_Q4_0:
        for (int b = 0; b < nb; b++, p += Q4_0_BYTES) {
            float d = ld_f16(p);
            const uint8_t *qs = p + 2;
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = d * (float)((qs[j] & 15) - 8);
                out[b * QK + j + 16] = d * (float)((qs[j] >> 4) - 8);
            }
        }
        break;
    case GGML_Q4_1:
        for (int b = 0; b < nb; b++, p += Q4_1_BYTES) {
            float d = ld_f16(p), m = ld_f16(p + 2);
            const uint8_t *qs = p + 4;
            for (int j = 0; j < 16; j++) {
                out[b * QK + j] = d * (float)(qs[j] & 15) + m;
                out[b * QK + j + 16] = d * (float)(qs[j] >> 4) + m;
            }
        }
        break;
    case GGML_Q5_0:
        for (int b = 0; b < nb; b++, p += Q5_0_BYTES) {
            float d = ld_f16(p);
            int8_t q[QK];
            q5_codes(p + 2, 16, q);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)q[j];
        }
        break;
    case GGML_Q5_1:
        for (int b = 0; b < nb; b++, p += Q5_1_BYTES) {
            float d = ld_f16(p), m = ld_f16(p + 2);
            int8_t q[QK];
            q5_codes(p + 4, 0, q);
            for (int j = 0; j < QK; j++) out[b * QK + j] = d * (float)q[j] + m;
        }
        break;
    case GGML_MXFP4:
        qfp4_dequant(p, out, n);
        break;
    default:
        if (qiq_is_iq(type)) qiq_dequant(type, p, out, n);
        else if (qiql_is(type)) qiql_dequant(type, p, out, n);
        else if (qk_is_k(type) || type == GGML_BF16) qk_dequant(type, p, out, n);
        else memset(out, 0, (size_t)n * sizeof(float));
        break;
    }
}
