/* quant_tile_scalar.c — the portable packed tile (builds without AVX2): every output of a tile
 * computed alone, in the canonical order of quant_impl.h / quant_k.h with scalar fmaf, so it gives
 * the vector tiles' bits.
 * Owns: pk_scalar and its per-type steps (pk_wval: one weight code from a packed block). */
#include "quant_tile.h"
#include "quant_fp4.h"
#include "quant_iqlow.h"

#ifndef __AVX2__
static int pk_wval(uint32_t t, const uint8_t *blk, int j, int v)
{
    if (t == GGML_Q6_K) return pk_k6_code(blk, j, v) - K6OFF;
    if (K23(t)) return pk_k23_code(t, blk, j, v) - K23OFF(t);
    if (t == GGML_Q4_1 || t == GGML_Q4_K || t == GGML_Q5_K || t == GGML_Q5_0 || t == GGML_Q5_1) {
        uint8_t byte = blk[PK_NIB(t) + 32 * ((v % 16) / 4) + 4 * j + v % 4];
        int c = v < 16 ? byte & 15 : byte >> 4;
        if (t == GGML_Q5_K || t == GGML_Q5_0 || t == GGML_Q5_1)
            c |= ((blk[PK_HOFF(t) + 4 * j + v % 4] >> ((v % 16) / 4 + (v < 16 ? 0 : 4))) & 1) << 4;
        return t == GGML_Q5_0 ? c - 16 : c;
    }
    if (t == GGML_MXFP4) {
        const uint8_t byte = blk[PK_NIB(t) + 32 * ((v % 16) / 4) + 4 * j + v % 4];
        return qfp4_kvalues[v < 16 ? byte & 15 : byte >> 4];
    }
    return (int8_t)(blk[16 + 32 * (v / 4) + 4 * j + v % 4] ^ 0x80);
}

/* F16: row j of group g against float row xf: two fma chains (even / odd columns). */
static float pk_out_f16(const uint8_t *g, int j, const float *xf, int cols)
{
    float e = 0.0f, o = 0.0f;
    for (int c = 0; c < cols; c++) {
        float w = ld_f16(g + 16 * (size_t)c + 2 * j);
        if (c % 2 == 0) e = fmaf(w, xf[c], e);
        else o = fmaf(w, xf[c], o);
    }
    return e + o;
}

/* Q6_K, Q3_K, Q2_K: block b of row j (packed block blk of group g) added to acc. */
static float pk_step_k6(uint32_t t, const uint8_t *g, const uint8_t *blk, int b, int j, const int8_t *xq,
                        float xd, float acc)
{
    int32_t sa = 0, sb = 0;
    for (int v = 0; v < QK; v++) {
        const int32_t p = pk_wval(t, blk, j, v) * xq[b * QK + v];
        if (v < 16) sa += p;
        else sb += p;
    }
    const uint8_t *hd = g + (size_t)(b / 8) * (t == GGML_Q6_K ? PK_K6_SB : K23SB(t));
    const float d = ld_f16(hd + 2 * j);
    int ma = 0, mb = 0, sca, scb;
    if (t == GGML_Q6_K) {
        sca = (int8_t)blk[j];
        scb = (int8_t)blk[8 + j];
    } else {
        sca = pk_k23_scale(t, blk, j, 0, &ma);
        scb = pk_k23_scale(t, blk, j, 1, &mb);
    }
    acc = fmaf((float)(sca * sa + scb * sb), d * xd, acc);
    if (t != GGML_Q2_K) return acc;
    int32_t xa = 0, xb2 = 0;
    for (int v = 0; v < 16; v++) {
        xa += xq[b * QK + v];
        xb2 += xq[b * QK + 16 + v];
    }
    return fmaf(-(float)(ma * xa + mb * xb2), ld_f16(hd + 16 + 2 * j) * xd, acc);
}

/* BF16: row j of group g against float row xf, qdot_exact's order (8 lanes by k % 8). */
static float pk_out_bf16(const uint8_t *g, int j, const float *xf, int cols)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int c = 0; c < cols; c++) {
        uint16_t h;
        memcpy(&h, g + 32 * (size_t)(c / 2) + 4 * j + 2 * (c % 2), 2);
        const uint32_t u = (uint32_t)h << 16;
        float w;
        memcpy(&w, &u, 4);
        l[c % 8] = fmaf(w, xf[c], l[c % 8]);
    }
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

/* A quantized type: row j of group g against activation row (xq, xd, xs), blocks in order. */
static float pk_out_q(uint32_t t, const uint8_t *g, int j, const int8_t *xq, const float *xd, const float *xs, int nb)
{
    float acc = 0.0f;
    for (int b = 0; b < nb; b++) {
        const uint8_t *blk = pk_blk(t, g, b);
        if (t == GGML_Q6_K || K23(t)) {
            acc = pk_step_k6(t, g, blk, b, j, xq, xd[b], acc);
            continue;
        }
        if (IQL(t)) {   /* halves apart, their multipliers, (d * fscale) * d_x */
            int8_t tab[16];
            int off;
            qiql_table(t, tab, &off);
            int32_t sa = 0, sb = 0;
            for (int v = 0; v < 16; v++) {
                sa += tab[pk_iql_code(t, blk, j, v)] * xq[b * QK + v];
                sb += tab[pk_iql_code(t, blk, j, 16 + v)] * xq[b * QK + 16 + v];
            }
            const float d = ld_f16(g + (size_t)(b / 8) * PK_IQL_SB(t) + 2 * j) * qiql_fscale(t);
            acc = fmaf((float)(pk_iql_m(blk, j, 0) * sa + pk_iql_m(blk, j, 1) * sb), d * xd[b], acc);
            continue;
        }
        int32_t is = 0;
        for (int v = 0; v < QK; v++) is += pk_wval(t, blk, j, v) * xq[b * QK + v];
        if (t == GGML_Q4_K || t == GGML_Q5_K) {
            float dl, ml;
            pk_k4_scales(t, g, b, j, &dl, &ml);
            acc = fmaf((float)is, dl * xd[b], acc);
            acc = fmaf(ml, xs[b], acc);
            continue;
        }
        if (t == GGML_MXFP4) {
            acc = fmaf((float)is, qfp4_scale(blk[j]) * xd[b], acc);
            continue;
        }
        acc = fmaf((float)is, ld_f16(blk + 2 * j) * xd[b], acc);
        if (t == GGML_Q4_1 || t == GGML_Q5_1) acc = fmaf(ld_f16(blk + 16 + 2 * j), xs[b], acc);
    }
    return acc;
}

void pk_scalar(uint32_t t, const uint8_t *const *gp, int NG, const qact *x, int i0, int NX, int cols, float *res)
{
    const int nb = cols / QK;
    for (int k = 0; k < NX; k++)
        for (int g = 0; g < NG; g++)
            for (int j = 0; j < PK_ROWS; j++) {
                const size_t xi = (size_t)(x->idx ? x->idx[i0 + k] : i0 + k);
                float r;
                if (t == GGML_F16) r = pk_out_f16(gp[g], j, x->f + xi * cols, cols);
                else if (t == GGML_BF16) r = pk_out_bf16(gp[g], j, x->f + xi * cols, cols);
                else r = pk_out_q(t, gp[g], j, x->q + xi * cols, x->qd + xi * nb, x->qs + xi * nb, nb);
                res[k * 8 * NG + g * 8 + j] = r;
            }
}
#endif
