/* arch_gptoss.c — llama.cpp's `gpt-oss` (LLM_ARCH_OPENAI_MOE: gpt-oss-20b, gpt-oss-120b), as its
 * loader (src/models/openai-moe.cpp) and graph (build_attn with sinks, build_moe_ffn) define it:
 * heads of attention.key_length (64; not embedding_length / head_count), q/k/v/output biases,
 * per-head attention sinks (blk.N.attn_sinks.weight [head_count]: a logit in each softmax's
 * denominator), NeoX RoPE with the file's YaRN scaling (model_load.c's table, llama.cpp's rounded
 * correction range), score scale 1/sqrt(key_length); a sliding window of
 * attention.sliding_window keys on the layers llama.cpp's set_swa_pattern(2) marks (layer l with
 * l % 2 == 0: 0, 2, 4, ...; or the file's attention.sliding_window_pattern), full attention on the
 * others; the FFN's pre-norm is blk.N.post_attention_norm; every block MoE: router with bias,
 * top-k of the biased logits, softmax over the selected ones (SOFTMAX_WEIGHT), experts with
 * per-expert gate/up/down biases and the clamped SwiGLU (ggml's swiglu_oai, alpha 1.702, limit 7);
 * untied output head. */
#include <stdio.h>
#include <stdlib.h>

#include "arch.h"

#define OAI_ALPHA 1.702f    /* llama.cpp's LLM_FFN_SWIGLU_OAI_MOE constants */
#define OAI_LIMIT 7.0f

/* Layer l slides its window: the file's attention.sliding_window_pattern (an array of flags, or a
 * period n: l % n < n - 1), else llama.cpp's period 2 for gpt-oss. */
static int swa_layer(const model *m, int l) {
    char k[128];
    const gguf_kv *kv = gguf_find_kv(&m->g, ld_key(m, "attention.sliding_window_pattern", k, sizeof k));
    if (kv && kv->type == GGUF_T_ARRAY) return (uint64_t)l < kv->arr_len && gguf_array_int(kv, (uint64_t)l) != 0;
    const int64_t n = kv ? gguf_get_int(&m->g, k, 2) : 2;
    return n == 0 || l % n < n - 1;
}

static int gptoss_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 1, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    if (c->n_experts < 1 || c->n_experts > 512)
        return model_fail(err, errlen, "gpt-oss.expert_count %d is not supported (1..512)", c->n_experts);
    if (c->d_expert < 1) return model_fail(err, errlen, "gpt-oss.expert_feed_forward_length is missing or invalid");
    m->priv->moe.gating = GATING_SOFTMAX;   /* as its forward passes it: the fingerprint's */
    return 0;
}

static int gptoss_block(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    const model_config *c = &m->c;
    layer_w *L = &m->layers[l];
    char nm[160];
    if (ld_attention(m, l, QK_NORM_NONE, "post_attention_norm", err, errlen) != 0) return -1;
    if (!L->q_b || !L->k_b || !L->v_b) return model_fail(err, errlen, "blk.%d: gpt-oss needs attn_q/k/v.bias", l);
    snprintf(nm, sizeof nm, "blk.%d.attn_output.bias", l);
    if (ld_vec(m, nm, c->d_model, 0, &L->o_b, err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.attn_sinks.weight", l);
    if (ld_vec(m, nm, c->n_heads, 0, &L->sinks, err, errlen) != 0) return -1;
    if (swa_layer(m, l)) {
        int w;
        if (ld_int_req(m, "attention.sliding_window", &w, err, errlen) != 0) return -1;
        L->window = w;
    }
    if (ld_moe_ffn(m, l, src, err, errlen) != 0) return -1;
    if (!L->router_b) return model_fail(err, errlen, "blk.%d.ffn_gate_inp.bias: tensor missing", l);
    const int E = c->n_experts, X = c->d_expert;
    snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.bias", l);    /* [X, E] in ggml order: expert-major */
    if (ld_vec2(m, nm, X, E, 0, &L->exp_gate_b, err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_up_exps.bias", l);
    if (ld_vec2(m, nm, X, E, 0, &L->exp_up_b, err, errlen) != 0) return -1;
    snprintf(nm, sizeof nm, "blk.%d.ffn_down_exps.bias", l);
    if (ld_vec2(m, nm, c->d_model, E, 0, &L->exp_down_b, err, errlen) != 0) return -1;
    return 1;
}

/* llama.cpp's llama_model_openai_moe graph: attention (biases, NeoX YaRN RoPE, sinks, the layer's
 * window: fwd_attention reads them from the layer), post_attention_norm, the MoE with
 * SOFTMAX_WEIGHT gating and SWIGLU_OAI experts. */
static int gptoss_forward(fwd *F) {
    const model *m = F->m;
    const attn_opts att = {QKN_NONE, ROPE_NEOX, 0.0f};
    moe_opts moe = F->P->moe;      /* softmax over the selected; the file's groups, if any */
    moe.act = MOE_ACT_SWIGLU_OAI, moe.alpha = OAI_ALPHA, moe.limit = OAI_LIMIT;
    fwd_embed(F, 1.0f);
    for (int l = 0; l < m->c.n_layers; l++) {
        const layer_w *L = &m->layers[l];
        fwd_norm(F, L->attn_norm);
        fwd_attention(F, l, &att);
        fwd_residual(F, 1.0f);
        fwd_norm(F, L->ffn_norm);          /* post_attention_norm in gpt-oss files */
        if (fwd_moe(F, L, &moe) != 0) return -1;
        fwd_residual(F, 1.0f);
    }
    return fwd_head(F, 1.0f);
}

const arch_ops arch_gptoss = {.name = "gpt-oss", .hparams = gptoss_hparams, .block = gptoss_block,
                              .forward = gptoss_forward};
