/* arch_qwen35moe.c — llama.cpp's `qwen35moe` (Qwen3.5 / Qwen3.6-35B-A3B and larger): a Gated
 * DeltaNet / gated full-attention hybrid with an MoE FFN and a sigmoid-gated shared expert in every
 * layer, and a trailing MTP block (gdn.c: the layers, their forward and the per-slot recurrent
 * state, shared with qwen3next). Its own: interleaved M-RoPE with the file's required
 * rope.dimension_sections (for text: NeoX pairs, the pairs the sections leave to the 4th position
 * unturned; model_load.c's imrope_mask); the DeltaNet's attn_qkv + attn_gate, ssm_beta and
 * ssm_alpha, the v heads tiled over the q/k heads (v head h reads q/k head h mod Hk: the
 * converter reorders them so, for ggml's broadcast); the shared expert optional. */
#include <stdio.h>

#include "arch.h"

static const hybrid_variant qwen35 = {.v_grouped = 0, .fused_in = 0, .shexp_required = 0};

static int qwen35moe_hparams(model *m, char *err, size_t errlen) {
    if (hybrid_hparams(m, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    char k[128];
    const gguf_kv *sk = gguf_find_kv(&m->g, ld_key(m, "rope.dimension_sections", k, sizeof k));
    if (!sk || sk->type != GGUF_T_ARRAY || sk->arr_len < 3 || sk->arr_len > 4)
        return model_fail(err, errlen, "%s is missing or not an array of 4", k);
    for (uint64_t i = 0; i < sk->arr_len; i++) {
        int64_t v = gguf_array_int(sk, i);
        if (v < 0 || v > c->rope_dim) return model_fail(err, errlen, "%s[%llu] = %lld is invalid", k, (unsigned long long)i, (long long)v);
        c->rope_imrope[i] = (int)v;
    }
    if (c->rope_imrope[0] + c->rope_imrope[1] + c->rope_imrope[2] < 1) return model_fail(err, errlen, "%s are all 0", k);
    return 0;
}

static int qwen35moe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    return hybrid_block(m, l, src, &qwen35, err, errlen);
}

static int qwen35moe_forward(fwd *F) { return hybrid_forward(F, &qwen35); }

const arch_ops arch_qwen35moe = {.name = "qwen35moe", .hparams = qwen35moe_hparams, .block = qwen35moe_block,
                                 .forward = qwen35moe_forward, .mtp_block = hybrid_mtp_block,
                                 .mtp_forward = hybrid_mtp_forward};
