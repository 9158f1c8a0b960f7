/* model.h — a llama-architecture model (dense or MoE) loaded from GGUF, and its forward pass.
 * Owns: hyper-parameters from metadata, validation of tensor shapes (refusal with a
 * one-line reason), and the batched forward over rows from any mix of slots. */
#ifndef COLI_MODEL_H
#define COLI_MODEL_H
#include <stdint.h>
#include "gguf.h"
#include "quant.h"
#include "kv.h"
#include "experts.h"
#include "tokenizer.h"

/* Expert weights of the selected experts (moe_opts.gating, model_impl.h): SOFTMAX over their
 * logits (Mixtral, colibri), UNIT (1 each), SOFTMAX_ALL: the softmax over every expert's logit,
 * SIGMOID (GLM-4.5, DeepSeek-V3): sigmoid of each logit. */
enum { GATING_SOFTMAX = 0, GATING_UNIT = 1, GATING_SOFTMAX_ALL = 2, GATING_SIGMOID = 3 };

typedef struct {
    int n_nextn;                               /* trailing MTP / NextN blocks of the file, after the
                                                * n_layers of the trunk: not run, not read */
    int n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab, ctx_train;
    /* A head's widths: q and k have head_dim_k (attention.key_length; RoPE and the scores work
     * on it), v and each head's attention output head_dim_v (attention.value_length). head_dim
     * is head_dim_k's former name, kept for callers that size a cache of equal widths (server.c). */
    union { int head_dim_k; int head_dim; };
    int head_dim_v;
    int n_experts, top_k, d_expert, d_shexp;   /* n_experts == 0: dense */
    float embd_scale, resid_scale, logit_scale; /* Granite's multipliers (1: none); read by its forward */
    float attn_scale;                          /* Granite's attention score scale (0: 1/sqrt(head_dim_k)) */
    float rope_base, rms_eps;
    int rope_dim;                              /* rotated dimensions of a head (<= head_dim_k) */
    /* RoPE scaling, llama.cpp's rope.scaling.* semantics (none: 1, 0, 1): angles pos * inv_freq_i *
     * (freq_scale (1 - r_i) + r_i), r_i = YaRN's ramp over the pairs x ext_factor (0: linear
     * scaling); cos/sin x attn_factor, x (1 + 0.1 ln(1 / freq_scale)) when ext_factor != 0. */
    float rope_freq_scale, rope_ext_factor, rope_attn_factor, rope_beta_fast, rope_beta_slow;
    int rope_ctx_orig;                         /* YaRN's original context (ramp range) */
    int n_moe_rows;                            /* MoE layers (EMAP rows) */
    int rope_imrope[4];                        /* interleaved M-RoPE sections (Qwen3.5; all 0: none):
                                                * for text every pair turns with the position except
                                                * those the sections leave to the 4th, which stay put */
    int ssm_d_conv, ssm_k_heads, ssm_v_heads, ssm_head;  /* Gated DeltaNet layers (0: none): conv
                                                * kernel, q/k heads, v heads, head width */
    int n_mtp;                                 /* 1: the MTP block is loaded (expert_opts.mtp) as
                                                * layers[n_layers], its K/V the cache's last layer,
                                                * its experts the store's last row; else 0 */
} model_config;

typedef struct {
    const float *attn_norm, *ffn_norm;         /* F32 [d_model] */
    const float *q_norm, *k_norm;              /* optional RMSNorm of q and k [head_dim_k], or over
                                                * the whole projection (OLMoE's forward) */
    const float *q_b, *k_b, *v_b;              /* optional attention biases (Qwen2, GLM-4.5) */
    const float *o_b;                          /* optional attn_output bias [d_model] (gpt-oss) */
    const float *sinks;                        /* optional per-head attention sink logits [n_heads]:
                                                * one more term in each softmax's denominator (gpt-oss) */
    int window;                                /* sliding-window attention: a query at p sees keys
                                                * p - window + 1 .. p (0: every earlier key) */
    const float *sh_gate_inp;                  /* optional shared-expert gate [d_model]: the shared
                                                * expert's output times sigmoid(h . w) (Qwen2-MoE) */
    const float *exp_bias;                     /* optional expert-selection bias [n_experts]
                                                * (exp_probs_b: chooses experts, never weighs them) */
    qmat q, k, v, o;
    qmat ffn_gate, ffn_up, ffn_down;           /* dense FFN (rows 0 when MoE) */
    qmat router;                               /* ffn_gate_inp: n_experts x d_model */
    const float *router_b;                     /* optional ffn_gate_inp.bias [n_experts], or NULL */
    const float *exp_gate_b, *exp_up_b;        /* optional per-expert biases [n_experts][d_expert] */
    const float *exp_down_b;                   /* ... and [n_experts][d_model] (gpt-oss) */
    qmat sh_gate, sh_up, sh_down;              /* shared expert (rows 0 when absent) */
    /* a Gated DeltaNet layer (linear attention, gdn.c; rows 0 elsewhere): the joint
     * q|k|v input of the conv, the output gate z, beta and alpha per v head, the output
     * (qwen3next's fused ssm_in / ssm_ba: in ssm_qkv / ssm_beta, ssm_z / ssm_alpha rows 0) */
    qmat ssm_qkv, ssm_z, ssm_beta, ssm_alpha, ssm_out;
    const float *ssm_conv, *ssm_dt, *ssm_a, *ssm_norm;  /* [conv channels x d_conv], [v heads] x2, [head] */
    int rec_row;                               /* -1, or the layer's index among the recurrent ones */
    int moe_row;                               /* -1 dense layer, else EMAP row */
    int next_moe;                              /* index of the next MoE layer (-1: none), for the
                                                * read-ahead; set once at load */
} layer_w;

/* Per-turn profile counters (seconds), accumulated by the forward. */
typedef struct {
    double t_edisk, t_emm, t_attn, t_head, t_dense;
    double t_head_idle;                        /* of t_head, the disk idle (io_idle_s) */
    long forwards;
} perf_counters;

typedef struct model {
    gguf_file g;
    model_config c;
    layer_w *layers;
    qmat tok_embd, output;                     /* output == tok_embd when tied */
    const float *output_norm;
    expert_store *es;
    tokenizer *tok;
    char name[256], arch[64];
    char *chat_template;                       /* NULL if absent */
    struct {                                   /* the file's recommended sampling */
        int has_temp, has_top_p, has_top_k;    /* general.sampling.{temp,top_p,top_k} present */
        float temp, top_p;
        int top_k;
    } sampling;
    uint64_t fingerprint;                      /* for KV slot files */
    perf_counters perf;
    struct {                                   /* the MTP block's own tensors (c.n_mtp) */
        qmat eh_proj;                          /* [enorm(embedding) | hnorm(h)] (2 d_model) -> d_model */
        const float *enorm, *hnorm, *head_norm;    /* head_norm: shared_head_norm, else output_norm */
    } mtp;
    int exact;                                 /* EXACT=1 (expert_opts.exact): float activations,
                                                * weights unpacked (quant.h qact.exact) */
    struct model_priv *priv;                   /* model.c-private: scratch buffers, owned copies */
} model;

/* 0 ok; -1 with a one-line reason in err. Refuses unsupported arch/types/shapes. */
int model_load(model *m, const char *path, const expert_opts *eo, char *err, size_t errlen);
void model_free(model *m);

/* One input row of a batched forward. Rows of the same slot must be in increasing
 * pos order and contiguous positions; pos must equal the slot's n_pos at the first
 * row of that slot (the forward appends K/V and token to the slot history). */
typedef struct {
    int slot, pos, token;
    float *logits;          /* NULL: no logits wanted for this row; else vocab floats */
    uint32_t *route_counts; /* NULL or n_moe_rows*n_experts counters (per-turn routing) */
    int n_experts;          /* routed experts per token for this row, 1..n_experts; 0 (or out
                             * of range: callers validate) = the model's top_k */
    int no_heat;            /* 1: this row's selections do not add to the store's cumulative
                             * counts (SUBMIT heat=0); HITS and route_counts still see them */
    uint16_t *picks;        /* NULL or n_moe_rows*K slots: this row's selected experts, K per
                             * MoE row in selection order (per-token routing, SUBMIT routes=2) */
} fwd_row;

/* Runs all rows through the model in one pass (weight rows read once per pass).
 * 0 ok, -1 on OOM/expert read failure. */
int model_forward(model *m, kv_cache *kv, fwd_row *rows, int n);

/* Positions of slot s's history a new turn may keep, given `keep` shared with it: keep for a
 * transformer; for a hybrid (recurrent layers) keep when the slot's recurrent state stands
 * exactly after those keep tokens, else the position of its longest checkpoint within them
 * (restored as the live state), else 0 (re-prefill: state cannot be truncated as K/V can). */
int model_resume(model *m, const kv_cache *kv, int s, int keep);
#define MODEL_STATE_CKPTS 4     /* checkpoints a slot of a hybrid keeps */
/* A hybrid: keeps a copy of slot s's state, when it stands after the slot's whole history, as
 * a checkpoint (the least recently used of RS_CKPTS goes). 0 (also: nothing to keep), -1 OOM. */
int model_checkpoint(model *m, const kv_cache *kv, int s);
/* Drops slot s's checkpoints (its history is being recomputed another way, e.g. expert count). */
void model_forget(model *m, int s);
/* Bytes slot s's recurrent state and its checkpoints take now; *n_ckpt: checkpoints held. */
size_t model_slot_state_bytes(const model *m, int s, int *n_ckpt);
/* Slot s's state and checkpoints to / from the file beside its K/V file (fp: the K/V file's
 * fingerprint). Loaded states become checkpoints that model_resume validates against the
 * slot's tokens. 0 ok (save: also nothing to save), -1 on I/O error or a foreign file. */
int model_state_save(const model *m, const kv_cache *kv, int s, const char *path, uint64_t fp);
int model_state_load(model *m, const kv_cache *kv, int s, const char *path, uint64_t fp);
/* A verify batch of drafted tokens (speculative decoding): the next forward keeps, for its
 * first n rows of slot s, the recurrent state after each row (a hybrid's trail; nothing for a
 * transformer), so that model_rollback can cut the slot back to any of them. One trail serves
 * every slot (the budget counts SPEC_DRAFT states once): arming it for s drops another slot's.
 * 0, -1 OOM. */
int model_trail(model *m, int s, int n, int n_slots);
/* Cuts slot s's history back to its first keep positions after a forward whose trail covers
 * keep (or keep == n_pos): K/V rows truncated (the windows keep what a continuation at keep
 * reads), a hybrid's live state set to the trail's entry. keep, or -1 when the trail does not
 * reach it (the slot's history is then cut to 0: re-prefill). */
int model_rollback(model *m, kv_cache *kv, int s, int keep);
/* Bytes of one slot's recurrent state (0 for a transformer): every recurrent layer's last
 * ssm_d_conv - 1 conv inputs and its v heads' S x S delta-rule matrices, floats. */
size_t model_state_bytes(const model *m);

/* Drafting with the file's MTP block (c.n_mtp): for slot s, whose history holds n_pos tokens
 * and whose next token `next` is sampled but not yet forwarded, n greedy guesses of the tokens
 * after `next` into out. The block first catches its K/V up (one batch) over the positions since
 * its last call, from the trunk's normalized last hidden states, which every forward keeps per
 * slot; then each guess is one more row on the block's own output. The K/V of positions the
 * slot will hold must be reserved (n_pos + n). Returns the guesses made: 0 when the slot's kept
 * hidden states do not reach back to where the block stopped (a slot file loaded from disk), -1
 * on failure. */
int model_mtp_draft(model *m, kv_cache *kv, int s, int next, int n, int *out);
/* The block's logits for each of slot s's positions i (from the trunk's h_i and token i + 1,
 * `next` for the last): n_pos x vocab floats into logits (a test driver's: fwd_dump). 0 or -1. */
int model_mtp_logits(model *m, kv_cache *kv, int s, int next, float *logits);

/* A KV cache for m's rows (K and V row widths from its heads): kv_init_kv's result. */
int model_kv_init(const model *m, kv_cache *kv, int n_slots, int ctx);

/* The fingerprint of K/V rows computed with k routed experts per token (slot files): the
 * model's own for its top_k, a distinct one for any other count. */
uint64_t model_fingerprint_k(const model *m, int k);
#endif
