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
    m->priv->moe.gating = GATING_SOFTMAX_ALL;
    m->priv->moe.norm = gguf_get_int(&m->g, ld_key(m, "expert_weights_norm", k, sizeof k), 0) != 0;
    ld_expert_widths(m);
    return 0;
}

static int olmoe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    if (ld_attention(m, l, QK_NORM_FULL, "ffn_norm", err, errlen) != 0) return -1;
    return ld_moe_ffn(m, l, src, err, errlen) != 0 ? -1 : 1;
}

/* llama.cpp's llm_build_olmoe: q/k norms over the whole projections, NeoX RoPE, MoE in every layer. */
static int olmoe_forward(fwd *F) {
    const model *m = F->m;
    const attn_opts att = {QKN_FULL, ROPE_NEOX, 0.0f};
    fwd_embed(F, 1.0f);
    for (int l = 0; l < m->c.n_layers; l++) {
        const layer_w *L = &m->layers[l];
        fwd_norm(F, L->attn_norm);
        fwd_attention(F, l, &att);
        fwd_residual(F, 1.0f);
        fwd_norm(F, L->ffn_norm);
        if (fwd_moe(F, L, &F->P->moe) != 0) return -1;
        fwd_residual(F, 1.0f);
    }
    return fwd_head(F, 1.0f);
}

const arch_ops arch_olmoe = {.name = "olmoe", .hparams = olmoe_hparams, .block = olmoe_block,
                             .forward = olmoe_forward};
