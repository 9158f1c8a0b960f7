/* arch_llama.c — llama.cpp's `llama` architecture, dense or MoE (Mixtral's layout: routed
 * experts stacked in ffn_{gate,up,down}_exps, or in older files one tensor per expert,
 * ffn_{gate,up,down}.E: see ld_moe_ffn; router ffn_gate_inp), plus colibri's additions:
 * an optional router bias (ffn_gate_inp.bias), an optional shared expert (ffn_*_shexp, no
 * gate of its own) and colibri.expert_gating (softmax over the selected experts' logits, or
 * unit weights). Its forward is llama.cpp's llm_build_llama: RoPE on interleaved pairs, scores
 * scaled by 1/sqrt(head_dim), each layer's FFN dense or MoE. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "arch.h"

static int llama_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 0, err, errlen) != 0) return -1;
    char *gs = gguf_get_string(&m->g, "colibri.expert_gating");
    if (gs) {
        if (strcmp(gs, "softmax") == 0) m->priv->moe.gating = GATING_SOFTMAX;
        else if (strcmp(gs, "unit") == 0) m->priv->moe.gating = GATING_UNIT;
        else {
            model_fail(err, errlen, "colibri.expert_gating '%s' is not supported (softmax or unit)", gs);
            free(gs);
            return -1;
        }
        free(gs);
    }
    ld_expert_widths(m);
    return 0;
}

static int llama_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const gguf_file *g = &m->g;
    layer_w *L = &m->layers[l];
    char nm[160];
    const uint64_t D = (uint64_t)c->d_model, KV = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim_k;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
    if (ld_vec(m, NAME("attn_norm.weight"), c->d_model, 0, &L->attn_norm, err, errlen)) return -1;
    if (ld_vec(m, NAME("ffn_norm.weight"), c->d_model, 0, &L->ffn_norm, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_q.weight"), D, D, 0, &L->q, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_k.weight"), D, KV, 0, &L->k, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_v.weight"), D, KV, 0, &L->v, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_output.weight"), D, D, 0, &L->o, err, errlen)) return -1;
    int is_moe = c->n_experts > 0 && gguf_find_tensor(g, NAME("ffn_gate_inp.weight")) != NULL;
    if (!is_moe) return ld_dense_ffn(m, l, err, errlen);
    if (ld_moe_ffn(m, l, src, err, errlen) != 0) return -1;
    int has_sh = gguf_find_tensor(g, NAME("ffn_gate_shexp.weight")) || gguf_find_tensor(g, NAME("ffn_up_shexp.weight")) ||
                 gguf_find_tensor(g, NAME("ffn_down_shexp.weight"));
#undef NAME
    if (has_sh && ld_shared_expert(m, l, err, errlen) != 0) return -1;
    return 1;
}

static int llama_forward(fwd *F) {
    const model *m = F->m;
    const attn_opts att = {QKN_NONE, ROPE_NORM, 0.0f};
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

const arch_ops arch_llama = {.name = "llama", .hparams = llama_hparams, .block = llama_block,
                             .forward = llama_forward};
