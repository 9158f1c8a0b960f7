/* model_impl.h — what the model's files share (not an API for the rest of the engine):
 * the private state and its scratch buffers, the loading helpers (model_load.c), the
 * architecture seam (arch.h), the compute-tier seam, and the parts of the forward that live
 * in files of their own (moe.c, attention.c).
 *
 * Files: model_load.c (open, validate, pack, free), arch_<name>.c (one per architecture:
 * hyper-parameters, tensor names and its forward), model.c (model_forward: row checks, slot
 * histories, the architecture's forward), forward.c (the forward's building blocks, blocks.h),
 * moe.c (routing and routed experts), attention.c (attention kernels). */
#ifndef COLI_MODEL_IMPL_H
#define COLI_MODEL_IMPL_H
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "model.h"
#include "pool.h"

typedef struct { float *p; size_t cap; } fbuf;   /* grown scratch, capacity in floats */
typedef struct { int *p; size_t cap; } ibuf;

/* The compute tier: where the forward's matrix jobs run. The CPU tier (quant.c's kernels on
 * the pool) is the only one; a GPU tier would supply its own mul_multi (and own the weights it
 * holds resident), leaving routing, attention bookkeeping and the protocol unchanged. */
typedef struct compute_tier {
    const char *name;
    void (*mul_multi)(const mm_job *jobs, int cnt);   /* every job's outputs, one call */
} compute_tier;
extern const compute_tier compute_cpu;

/* One slot's recurrent state (hybrid architectures, gdn.c; rstate.c): every recurrent
 * layer's conv and delta-rule states, valid for exactly the n_pos tokens whose hash it keeps
 * (-1: none), and up to RS_CKPTS copies of earlier states (checkpoints, p NULL: unused) that a
 * turn sharing only part of the history resumes from. */
#define RS_CKPTS MODEL_STATE_CKPTS
typedef struct { float *p; int n_pos; uint64_t hash; unsigned used; } rs_ckpt;
/* The trail (model_trail): the states after each of one forward's first rows of the slot, kept
 * so that a verify batch of drafted tokens can be cut back to any of them (model_rollback):
 * entry i (in model_priv's one trail buffer, while this slot armed it last) stands after the row
 * at position trail_pos + i; trail_want rows are armed for the next forward, trail_n were kept
 * by the last one. */
typedef struct {
    float *p; size_t n; int n_pos; uint64_t hash; rs_ckpt ck[RS_CKPTS]; unsigned tick;
    int trail_want, trail_pos, trail_n;
} rstate;
uint64_t rstate_hash(const int *tokens, int n);   /* what a state's hash is of */
void mtp_slots_free(struct model_priv *P);
/* Slot s's record with its live state allocated (the array grown to n_slots); NULL out of memory. */
rstate *rstate_slot(model *m, int s, int n_slots);
void rstate_free(rstate *r);

/* A slot's side of an MTP block (mtp.c): the trunk's normalized last hidden states of positions
 * h_from .. h_end - 1 (h: cap x d_model), and the block's K/V rows 0 .. m_end - 1 that stand for
 * the slot's history (row m_end - 1 read m_next as the token after it). */
typedef struct { float *h; int cap, h_from, h_end, m_end, m_next; } mtp_slot;
struct fwd;
int mtp_keep(struct fwd *F);            /* the trunk's forward, its rows' normalized states in F->h */
void mtp_cut(model *m, int s, int keep);    /* slot s cut back to keep positions */

/* How an MoE FFN routes, weighs and runs its experts: passed by the architecture's forward at
 * each call (llama.cpp's build_moe_ffn arguments), never read from model_config.
 *   gating      GATING_* (model.h): the weights' function of the router logits
 *   norm        the selected weights divided by their sum (Qwen's norm_topk_prob, GLM's
 *               expert_weights_norm); SOFTMAX's already sum to 1
 *   scale       the routed weights' multiplier (GLM's expert_weights_scale; 1: none)
 *   n_group, group_used   grouped top-k (DeepSeek-V3, GLM): experts in n_group equal groups, a
 *               group's score the sum of its two best selection scores, only the best
 *               group_used groups' experts compete (n_group <= 1: none)
 *   shexp_gated the shared expert's output times sigmoid(h . ffn_gate_inp_shexp) (Qwen2-MoE,
 *               Qwen3.5); else added as it is (GLM)
 *   act         the experts' activation: SILU silu(gate) * up (the fused gate/up job), or
 *               SWIGLU_OAI (gpt-oss, ggml's swiglu_oai): g = min(gate, limit),
 *               u = clamp(up, -limit, limit), g / (1 + exp(-alpha g)) * (u + 1)
 * The experts are chosen by the top-k selection scores: the router logits, or, with a layer's
 * exp_probs_b or with groups, the gating's probabilities (SIGMOID: always) plus that bias (the
 * bias chooses, the weights stay unbiased). The layer's per-expert biases (layer_w.exp_*_b),
 * when present, are added to gate, up and down. */
enum { MOE_ACT_SILU = 0, MOE_ACT_SWIGLU_OAI = 1 };
typedef struct {
    int gating;
    int norm;
    float scale;
    int n_group, group_used;
    int shexp_gated;
    int act;
    float alpha, limit;     /* SWIGLU_OAI's */
} moe_opts;

struct arch_ops;
struct model_priv {
    int g_open;
    const struct arch_ops *ops;     /* the file's architecture (its forward) */
    moe_opts moe;           /* the routing the file's keys set (the hparams hook reads them); the
                             * architecture's forward passes it, or its own, at each MoE call */
    float **owned;          /* owned copies: converted norm vectors, packed matrices */
    int n_owned, cap_owned;
    double *inv_freq;       /* RoPE: base^(-2i/rope_dim), i < rope_dim/2 (x the scaling's factor) */
    double rope_mscale;     /* RoPE: cos/sin multiplier (1 without YaRN / attn_factor) */
    int rope_dim;
    const compute_tier *tier;
    qact act, ahead_act, sh_act;    /* the lookahead's router input; the shared expert's down input */
    fbuf x, h, q, k, v, att, tmp, fg, fu, rlog, eout, shout, xin, eg, eu, eo, hin, hout, ascr, rope, selw;
    ibuf sel, ecnt, eoff, elist, slot0, ablk, koff, ready, guess;
    fbuf ahead_lg;
    int part_rows;          /* rows the attention, dense FFN and routed experts take at once in a
                             * long forward (the budget's prefill chunk); 0: all of them */
    mtp_slot *mtp_slots;    /* per slot (an MTP block loaded; mtp.c), n_mtp_slots of them */
    int n_mtp_slots;
    fbuf mtp_draft;         /* a draft's logits and states (mtp.c): kept, a step drafts every time */
    rstate *rs;             /* per slot (hybrids; NULL otherwise), n_rs of them */
    int n_rs;
    fbuf gdn;               /* the recurrent layers' scratch */
    fbuf trail;             /* the trail of the slot that armed it last (one: a verify batch is one
                             * request's; arming it clears every other slot's trail_n) */
    int keep_rows;          /* rows an expert's gate/up and down inputs keep their buffers for
                             * between groups (the budget's slots: decode never reallocates);
                             * a prefill group's bigger ones are freed after it; 0: all kept */
    qact *eact;             /* per expert: gate/up input (E), down input (E), row views of act (E) */
    expert_w *ew;
    mm_job *jobs;
};

static inline double mnow(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline float *fb(fbuf *b, size_t n) {
    if (n == 0) n = 1;
    if (n > b->cap) {
        float *p = realloc(b->p, n * sizeof(float));
        if (!p) return NULL;
        b->p = p;
        b->cap = n;
    }
    return b->p;
}

static inline int *ib(ibuf *b, size_t n) {
    if (n == 0) n = 1;
    if (n > b->cap) {
        int *p = realloc(b->p, n * sizeof(int));
        if (!p) return NULL;
        b->p = p;
        b->cap = n;
    }
    return b->p;
}

/* Writes the one-line reason into err; returns -1. */
int model_fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Row loops of the forward, run on the pool in chunks of ROW_CHUNK rows when the batch is
 * large (each row is computed the same way either way). */
#define ROW_CHUNK 16
void par_rows(pool_fn fn, void *ctx, int n);

/* ---- loading helpers (model_load.c), for the architecture files ---- */
/* Finds `name` and checks its shape (nd dims e[0..nd), missing trailing dims = 1).
 * *t = NULL and 0 when optional and absent. */
int ld_tensor(const gguf_file *g, const char *name, int nd, const uint64_t *e, int optional,
              const gguf_tensor **t, char *err, size_t errlen);
int ld_mat_type_ok(uint32_t type);       /* a weight type the matmul kernels run */
const char *ld_mat_types(void);          /* their names, for refusals: "F32, F16, Q8_0, Q4_1" */
/* A cols x rows matrix; rows 0 when optional and absent. */
int ld_mat(const gguf_file *g, const char *name, uint64_t cols, uint64_t rows, int optional, qmat *q,
           char *err, size_t errlen);
/* F32 [n] vector, an owned copy (F16 / BF16 converted); NULL with 0 when optional and absent. */
int ld_vec(model *m, const char *name, int n, int optional, const float **out, char *err, size_t errlen);
/* The same for an F32 [n0, n1] tensor (ggml order: n1 rows of n0), n0 * n1 floats. */
int ld_vec2(model *m, const char *name, int n0, int n1, int optional, const float **out, char *err, size_t errlen);
/* The same for an F32 array of nd dims e[0..nd) (a row-major copy: ssm_conv1d's [d_conv, channels]). */
int ld_vec_nd(model *m, const char *name, int nd, const uint64_t *e, int optional, const float **out, char *err,
              size_t errlen);
/* "<arch>.<suffix>" into buf (the per-architecture GGUF key names). */
const char *ld_key(const model *m, const char *suffix, char *buf, size_t cap);
/* The integer key <arch>.<suffix>: required (1 .. 2^24) or optional (0 .. 2^24, default def). */
int ld_int_req(const model *m, const char *suffix, int *dst, char *err, size_t errlen);
int ld_int_opt(const model *m, const char *suffix, int def, int *dst, char *err, size_t errlen);

/* ---- parts of the forward ---- */
/* MoE FFN of layer L for n rows of normalized input h, routed as o says; result (not yet
 * added) in out (moe.c). */
int moe_ffn(model *m, const layer_w *L, const float *h, int n, const fwd_row *rows, float *out, const moe_opts *o);

/* Attention (attention.c): tasks of up to ATT_R consecutive rows of one slot x one KV head
 * with its query heads (up to ATT_G per kernel call). Scores over the key width hdk (Q rows qd
 * = nh x hdk apart), outputs of the value width hdv (att rows od = nh x hdv apart). */
#define ATT_R 4
#define ATT_G 4
typedef struct {
    kv_cache *kv;
    const fwd_row *rows;
    const int *blk;         /* task blocks: rows blk[b] .. blk[b + 1] - 1 */
    const float *Q;
    float *att, *ascr;
    int sc_len, l, nh, nkv, hdk, hdv, qd, od, grp;
    float scale;
    int window;             /* 0, or keys p - window + 1 .. p only */
    const float *sinks;     /* NULL, or per query head a logit joining each softmax's denominator */
} attn_ctx;
void attn_task(void *vctx, int task);
#endif
