/* arch_qwen2moe.c — llama.cpp's `qwen2moe` (Qwen1.5-MoE-A2.7B, Qwen2-57B-A14B): attention with
 * q/k/v biases, NeoX RoPE; every block MoE: softmax router over all experts, top-k without
 * renormalisation (qwen2moe.expert_weights_norm, default false: HF norm_topk_prob), plus a shared
 * expert (ffn_*_shexp, expert_shared_feed_forward_length wide) scaled by its own sigmoid gate
 * sigmoid(h . ffn_gate_inp_shexp); untied head. */
#include <stdio.h>

#include "arch.h"

static int qwen2moe_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 0, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    char k[128];
    if (c->n_experts < 1) return model_fail(err, errlen, "qwen2moe.expert_count is missing or invalid");
    m->priv->moe.gating = GATING_SOFTMAX_ALL;
    m->priv->moe.norm = gguf_get_int(&m->g, ld_key(m, "expert_weights_norm", k, sizeof k), 0) != 0;
    m->priv->moe.shexp_gated = 1;
    ld_expert_widths(m);
    return 0;
}

static int qwen2moe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    char nm[160];
    if (ld_attention(m, l, QK_NORM_NONE, "ffn_norm", err, errlen) != 0) return -1;
    if (ld_moe_ffn(m, l, src, err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_shexp.weight", l);
    if (gguf_find_tensor(&m->g, nm)) {
        if (ld_shared_expert(m, l, err, errlen) != 0) return -1;
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp_shexp.weight", l);
        if (ld_vec(m, nm, m->c.d_model, 0, &m->layers[l].sh_gate_inp, err, errlen) != 0) return -1;   /* required with the shared expert, as llama.cpp */
    }
    return 1;
}

/* llama.cpp's llm_build_qwen2moe: q/k/v biases (attention block), NeoX RoPE, MoE with the gated
 * shared expert (moe.c) in every layer. */
static int qwen2moe_forward(fwd *F) {
    const model *m = F->m;
    const attn_opts att = {QKN_NONE, ROPE_NEOX, 0.0f};
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

const arch_ops arch_qwen2moe = {.name = "qwen2moe", .hparams = qwen2moe_hparams, .block = qwen2moe_block,
                                .forward = qwen2moe_forward};
