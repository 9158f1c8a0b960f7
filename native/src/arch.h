/* arch.h — the per-architecture seam. An architecture is one file, arch_<name>.c, that
 * defines an arch_ops: how its GGUF names its hyper-parameters and tensors, and its forward.
 * model_load.c finds the file's general.architecture in arch_table and calls the hooks in order:
 *
 *   hparams(m)         m->c from the file's keys; refuse (one line) what cannot run
 *   block(m, l, src)   block l's tensors into m->layers[l]; a MoE block fills *src with its
 *                      stacked expert tensors and returns 1, a dense block returns 0
 *
 * and model_forward calls forward(F) for every batch: a loop over the layers composing the
 * building blocks of blocks.h with the architecture's own choices (its norms, RoPE pairs, q/k
 * norms, scales, which layers are dense), as llama.cpp's src/models/<name>.cpp graph builders.
 *
 * Everything else (tokenizer, embeddings, head, expert store, packing, fingerprint) is
 * common. Adding an architecture = adding arch_<name>.c and one line in arch_table. */
#ifndef COLI_ARCH_H
#define COLI_ARCH_H
#include <stddef.h>

#include "blocks.h"

typedef struct arch_ops {
    const char *name;       /* general.architecture */
    int (*hparams)(model *m, char *err, size_t errlen);
    int (*block)(model *m, int l, expert_layer_src *src, char *err, size_t errlen);
    int (*forward)(fwd *F);  /* 0, or -1 (out of memory, expert read failure) */
    /* The trailing MTP block (expert_opts.mtp; NULL: the architecture runs none): its own tensors
     * (block() loaded its layer as layers[l]), and its forward over F's rows (token: the one after
     * the row's position, hin: the trunk's or the block's own normalized hidden state per row)
     * into the rows' logits and hout (the block's normalized output, the next guess's hin). */
    int (*mtp_block)(model *m, int l, char *err, size_t errlen);
    int (*mtp_forward)(fwd *F, const float *hin, float *hout);
} arch_ops;

extern const arch_ops arch_llama;
extern const arch_ops arch_qwen3moe;
extern const arch_ops arch_olmoe;
extern const arch_ops arch_qwen2moe;
extern const arch_ops arch_granitemoe;
extern const arch_ops arch_glm4moe;
extern const arch_ops arch_gptoss;
extern const arch_ops arch_qwen35moe;
extern const arch_ops arch_qwen3next;

/* Building blocks for arch files (model_load.c), in llama.cpp's key and tensor names. */
/* <arch>.block_count, embedding_length, attention.head_count(_kv), feed_forward_length,
 * context_length, expert_count, expert_used_count, expert_(shared_)feed_forward_length,
 * rope.freq_base, attention.layer_norm_rms_epsilon, attention.key/value_length,
 * rope.dimension_count: into m->c, with their checks; nextn_predict_layers (the trailing MTP
 * blocks, out of n_layers) and expert_group_count / expert_group_used_count with the routing's
 * defaults into m->priv->moe (the arch's hparams hook sets the rest of its moe_opts). */
int ld_hparams_common(model *m, int own_head_dim, char *err, size_t errlen);
/* own_head_dim: head_dim_k = attention.key_length (even, <= 1024) and head_dim_v =
 * attention.value_length (<= 1024, default the key's), which need not be embedding_length /
 * head_count (Qwen3) nor equal; else both must be embedding_length / head_count. */
/* blk.l's attention: attn_norm, attn_q/k (head_count(_kv) x head_dim_k wide), attn_v
 * (head_count_kv x head_dim_v), attn_output (from head_count x head_dim_v), the optional
 * biases attn_{q,k,v}.bias, attn_q_norm / attn_k_norm: none (QK_NORM_NONE), optional per head (QK_NORM_OPT),
 * required per head [head_dim_k] (QK_NORM_HEAD) or over the whole projection (QK_NORM_FULL);
 * and the FFN's pre-norm blk.l.<ffn_norm>.weight ("ffn_norm"; GLM-4.5: "post_attention_norm"). 0 or -1. */
enum { QK_NORM_OPT = 0, QK_NORM_HEAD = 1, QK_NORM_FULL = 2, QK_NORM_NONE = 3 };   /* NONE: not read */
int ld_attention(model *m, int l, int qk_norm, const char *ffn_norm, char *err, size_t errlen);
/* d_expert / d_shexp from the first MoE block's tensors when the keys lack them. */
void ld_expert_widths(model *m);
/* blk.l.ffn_{gate,up,down}.weight (d_ff wide); returns 0 (a dense block) or -1. */
int ld_dense_ffn(model *m, int l, char *err, size_t errlen);
/* blk.l.ffn_gate_inp.weight (+ optional .bias) and the stacked ffn_{gate,up,down}_exps (gate and
 * up may be one ffn_gate_up_exps, each expert's gate rows then its up rows) into m->layers[l] and
 * *src. 0 or -1. */
int ld_moe_ffn(model *m, int l, expert_layer_src *src, char *err, size_t errlen);
/* blk.l.ffn_{gate,up,down}_shexp.weight (d_shexp wide). 0 or -1. */
int ld_shared_expert(model *m, int l, char *err, size_t errlen);

/* The Gated DeltaNet hybrids (gdn.c: qwen35moe, qwen3next): what sets one apart. */
typedef struct {
    int v_grouped;          /* v head h reads q/k head h / (Hv / Hk) (qwen3next: each q/k head's v
                             * heads adjacent), else h mod Hk (qwen35moe: its converter tiles them) */
    int fused_in;           /* the DeltaNet's input projections as qwen3next's: attn_qkv + attn_gate
                             * or the legacy fused ssm_in, and ssm_ba; else attn_qkv + attn_gate,
                             * ssm_beta and ssm_alpha */
    int shexp_required;     /* every block has the gated shared expert (else optional) */
} hybrid_variant;
/* m->c from the common keys and ssm.*, the routing (softmax over all, top-k renormalized,
 * expert_weights_scale, the gated shared expert). 0 or -1. */
int hybrid_hparams(model *m, char *err, size_t errlen);
/* Block l (the recurrent layers from full_attention_interval / attention.recurrent_layers, at
 * l = 0): attn_norm, post_attention_norm, a DeltaNet or gated-attention mixer, the MoE and the
 * shared expert. 1 or -1. */
int hybrid_block(model *m, int l, expert_layer_src *src, const hybrid_variant *hv, char *err, size_t errlen);
int hybrid_forward(fwd *F, const hybrid_variant *hv);
/* arch_ops.mtp_block / mtp_forward of both. */
int hybrid_mtp_block(model *m, int l, char *err, size_t errlen);
int hybrid_mtp_forward(fwd *F, const float *hin, float *hout);
/* The delta rule on one v head's S x S state M for one row (gdn.c states it): the vector form the
 * build has (AVX-512 or AVX2), else gdn_delta_rule_portable, whose bits every form gives. */
void gdn_delta_rule(float *M, const float *k, const float *q, const float *v, float decay, float b, float scale,
                    float *o, int S);
void gdn_delta_rule_portable(float *M, const float *k, const float *q, const float *v, float decay, float b,
                             float scale, float *o, int S);

/* NULL when the architecture is not supported. */
const arch_ops *arch_find(const char *name);
/* The supported names, ", "-separated (for the refusal line). */
const char *arch_names(void);
#endif
