/* arch_olmoe.c — llama.cpp's `olmoe` (OLMoE-1B-7B): q/k RMSNorm over the whole projection
 * (attn_q_norm [head_count x head_dim], attn_k_norm [head_count_kv x head_dim]) before NeoX RoPE;
 * every block MoE, softmax router over all experts, top-k, no renormalisation
 * (olmoe.expert_weights_norm, default false: HF norm_topk_prob); no shared expert; untied head. */
#include <stdio.h>

#include "arch.h"

static int olmoe_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 0, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    char k[128];
    if (c->n_experts < 1) return model_fail(err, errlen, "olmoe.expert_count is missing or invalid");
    c->gating = GATING_SOFTMAX_ALL;
    c->norm_topk = gguf_get_int(&m->g, ld_key(m, "expert_weights_norm", k, sizeof k), 0) != 0;
    c->rope_neox = 1;
    c->qk_norm_full = 1;
    ld_expert_widths(m);
    return 0;
}

static int olmoe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    if (ld_attention(m, l, QK_NORM_FULL, "ffn_norm", err, errlen) != 0) return -1;
    return ld_moe_ffn(m, l, src, err, errlen) != 0 ? -1 : 1;
}

const arch_ops arch_olmoe = {"olmoe", olmoe_hparams, olmoe_block};
