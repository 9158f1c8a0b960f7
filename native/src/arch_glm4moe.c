/* arch_glm4moe.c — llama.cpp's `glm4moe` (GLM-4.5, GLM-4.5-Air, GLM-4.6): head widths
 * attention.key_length / value_length (equal in GLM's files; llama.cpp asserts so), q/k/v
 * biases, optional per-head q/k norms, partial NeoX RoPE (rope.dimension_count < key_length); the FFN's pre-norm is blk.N.post_attention_norm (llama.cpp's
 * name for it in GLM files); the first leading_dense_block_count blocks dense
 * (ffn_gate/up/down, feed_forward_length), the others MoE: sigmoid router, experts chosen by
 * score + exp_probs_b.bias (within the best expert_group_used_count of expert_group_count groups
 * when grouped), weights = the chosen scores, renormalised (expert_weights_norm) and times
 * expert_weights_scale, plus an ungated shared expert; the trailing nextn_predict_layers blocks
 * (multi-token prediction) are not part of the forward. */
#include <math.h>
#include <stdio.h>

#include "arch.h"

static int glm4moe_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 1, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    const gguf_file *g = &m->g;
    char k[128];
    if (c->n_experts < 1 || c->n_experts > 512)
        return model_fail(err, errlen, "glm4moe.expert_count %d is not supported (1..512)", c->n_experts);
    int64_t func = gguf_get_int(g, ld_key(m, "expert_gating_func", k, sizeof k), 2);
    if (func != 2) return model_fail(err, errlen, "%s = %lld is not supported (2: sigmoid)", k, (long long)func);
    moe_opts *o = &m->priv->moe;        /* the groups: ld_hparams_common's */
    o->gating = GATING_SIGMOID;
    o->norm = gguf_get_int(g, ld_key(m, "expert_weights_norm", k, sizeof k), 1) != 0;
    double sc = gguf_get_float(g, ld_key(m, "expert_weights_scale", k, sizeof k), 1.0);
    if (!(sc > 0.0) || !isfinite(sc)) return model_fail(err, errlen, "%s = %g is invalid", k, sc);
    o->scale = (float)sc;
    ld_expert_widths(m);
    return 0;
}

static int glm4moe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    char nm[160];
    if (ld_attention(m, l, QK_NORM_OPT, "post_attention_norm", err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
    if (!gguf_find_tensor(&m->g, nm)) return ld_dense_ffn(m, l, err, errlen);
    if (ld_moe_ffn(m, l, src, err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.exp_probs_b.bias", l);
    if (ld_vec(m, nm, m->c.n_experts, 1, &m->layers[l].exp_bias, err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_shexp.weight", l);
    if (gguf_find_tensor(&m->g, nm) && ld_shared_expert(m, l, err, errlen) != 0) return -1;
    return 1;
}

/* llama.cpp's llm_build_glm4_moe: biases, optional per-head q/k norms, partial NeoX RoPE (the
 * RoPE table is rope.dimension_count wide); the leading dense blocks' FFN dense, the others MoE
 * with the ungated shared expert; the MTP blocks are not in the loop (c->n_layers excludes them). */
static int glm4moe_forward(fwd *F) {
    const model *m = F->m;
    const attn_opts att = {QKN_HEAD, ROPE_NEOX, 0.0f};
    fwd_embed(F, 1.0f);
    for (int l = 0; l < m->c.n_layers; l++) {
        const layer_w *L = &m->layers[l];
        fwd_norm(F, L->attn_norm);
        fwd_attention(F, l, &att);
        fwd_residual(F, 1.0f);
        fwd_norm(F, L->ffn_norm);          /* post_attention_norm in GLM's files */
        if ((L->moe_row < 0 ? fwd_ffn(F, L) : fwd_moe(F, L, &F->P->moe)) != 0) return -1;
        fwd_residual(F, 1.0f);
    }
    return fwd_head(F, 1.0f);
}

const arch_ops arch_glm4moe = {.name = "glm4moe", .hparams = glm4moe_hparams, .block = glm4moe_block,
                               .forward = glm4moe_forward};
