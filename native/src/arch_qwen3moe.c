/* arch_qwen3moe.c — llama.cpp's `qwen3moe` (Qwen3-30B-A3B, Qwen3-Coder, Qwen3-235B-A22B):
 * attention with head widths attention.key_length (not embedding_length / head_count), per-head
 * RMSNorm of q and k (attn_q_norm / attn_k_norm) before RoPE, NeoX RoPE; every block MoE with
 * a softmax router over all experts, top-k, the selected weights renormalized
 * (qwen3moe.expert_weights_norm, default true as llama.cpp's qwen3moe graph; HF's
 * norm_topk_prob); no shared expert; untied output head. A block without ffn_gate_inp falls
 * back to a dense SiLU FFN (Qwen3-MoE's mlp_only_layers), when feed_forward_length is set.
 * attention.value_length may differ from key_length (v and the attention output are then that
 * wide): llama.cpp's qwen3moe graph asserts they are equal; the maths is the same either way. */
#include <stdio.h>

#include "arch.h"

static int qwen3moe_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 1, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    char k[128];
    m->priv->moe.gating = GATING_SOFTMAX_ALL;
    m->priv->moe.norm = gguf_get_int(&m->g, ld_key(m, "expert_weights_norm", k, sizeof k), 1) != 0;
    if (c->n_experts < 1) return model_fail(err, errlen, "qwen3moe.expert_count is missing or invalid");
    ld_expert_widths(m);
    return 0;
}

static int qwen3moe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    char nm[160];
    if (ld_attention(m, l, QK_NORM_HEAD, "ffn_norm", err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
    if (!gguf_find_tensor(&m->g, nm)) return ld_dense_ffn(m, l, err, errlen);
    return ld_moe_ffn(m, l, src, err, errlen) != 0 ? -1 : 1;
}

/* llama.cpp's llm_build_qwen3moe: per-head q/k norms before NeoX RoPE. */
static int qwen3moe_forward(fwd *F) {
    const model *m = F->m;
    const attn_opts att = {QKN_HEAD, ROPE_NEOX, 0.0f};
    fwd_embed(F, 1.0f);
    for (int l = 0; l < m->c.n_layers; l++) {
        const layer_w *L = &m->layers[l];
        fwd_norm(F, L->attn_norm);
        fwd_attention(F, l, &att);
        fwd_residual(F, 1.0f);
        fwd_norm(F, L->ffn_norm);
        if ((L->moe_row < 0 ? fwd_ffn(F, L) : fwd_moe(F, L, &F->P->moe)) != 0) return -1;
        fwd_residual(F, 1.0f);
    }
    return fwd_head(F, 1.0f);
}

const arch_ops arch_qwen3moe = {.name = "qwen3moe", .hparams = qwen3moe_hparams, .block = qwen3moe_block,
                                .forward = qwen3moe_forward};
