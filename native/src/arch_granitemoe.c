/* arch_granitemoe.c — llama.cpp's `granitemoe` (granite-3.x-1b-a400m / 3b-a800m): llama's
 * layout (normal RoPE, tied head usually) with Granite's multipliers: embeddings times
 * granitemoe.embedding_scale, attention scores times granitemoe.attention.scale (instead of
 * 1/sqrt(head_dim)), each residual branch times granitemoe.residual_scale, logits divided by
 * granitemoe.logit_scale; router top-k with the softmax over the selected logits (HF's
 * top_k_gates). */
#include <math.h>
#include <stdio.h>

#include "arch.h"

static int granite_scale(model *m, const char *suffix, float *dst, char *err, size_t errlen) {
    char k[128];
    double v = gguf_get_float(&m->g, ld_key(m, suffix, k, sizeof k), NAN);
    if (isnan(v)) return 0;                      /* absent: the default */
    if (!(v > 0.0) || !isfinite(v)) return model_fail(err, errlen, "%s = %g is invalid", k, v);
    *dst = (float)v;
    return 0;
}

static int granitemoe_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 0, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    if (c->n_experts < 1) return model_fail(err, errlen, "granitemoe.expert_count is missing or invalid");
    if (granite_scale(m, "embedding_scale", &c->embd_scale, err, errlen) ||
        granite_scale(m, "residual_scale", &c->resid_scale, err, errlen) ||
        granite_scale(m, "attention.scale", &c->attn_scale, err, errlen) ||
        granite_scale(m, "logit_scale", &c->logit_scale, err, errlen))
        return -1;
    ld_expert_widths(m);
    return 0;
}

static int granitemoe_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    if (ld_attention(m, l, QK_NORM_NONE, "ffn_norm", err, errlen) != 0) return -1;
    return ld_moe_ffn(m, l, src, err, errlen) != 0 ? -1 : 1;
}

/* llama.cpp's llm_build_granite (MoE layers): the four multipliers; RoPE on interleaved pairs. */
static int granitemoe_forward(fwd *F) {
    const model *m = F->m;
    const model_config *c = &m->c;
    const attn_opts att = {QKN_NONE, ROPE_NORM, c->attn_scale};
    fwd_embed(F, c->embd_scale);
    for (int l = 0; l < c->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        fwd_norm(F, L->attn_norm);
        fwd_attention(F, l, &att);
        fwd_residual(F, c->resid_scale);
        fwd_norm(F, L->ffn_norm);
        if (fwd_moe(F, L, &F->P->moe) != 0) return -1;
        fwd_residual(F, c->resid_scale);
    }
    return fwd_head(F, c->logit_scale);
}

const arch_ops arch_granitemoe = {.name = "granitemoe", .hparams = granitemoe_hparams, .block = granitemoe_block,
                                  .forward = granitemoe_forward};
