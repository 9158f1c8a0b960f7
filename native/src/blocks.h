/* blocks.h — the forward's building blocks (forward.c), which each architecture's forward
 * (arch_<name>.c, arch_ops.forward) composes into its layer loop, as llama.cpp's
 * src/models/<name>.cpp graph builders compose theirs.
 * Owns: the per-forward state (fwd) that the blocks pass along: the residual stream x, the
 * normalized input h of the next branch, the branch output that waits to be added.
 *
 * A forward reads, per layer:
 *   fwd_norm(F, L->attn_norm);              h = rmsnorm(x)   (after adding the pending branch)
 *   fwd_attention(F, l, &opts);             branch = Wo attn(rope(norm(Wq h)), ...)
 *   fwd_residual(F, scale);                 x += branch * scale   (done by the next norm/head)
 *   fwd_norm(F, L->ffn_norm); fwd_moe(F, L, &moe) or fwd_ffn(F, L); fwd_residual(F, scale);
 * and ends with fwd_head(F, divisor). The pending residual lets one pass over the rows add the
 * branch and normalize (the same operations, in the same order, as two passes). Every matmul
 * goes through the compute tier (P->tier->mul_multi). */
#ifndef COLI_BLOCKS_H
#define COLI_BLOCKS_H
#include "model_impl.h"

typedef struct fwd {
    model *m;
    struct model_priv *P;
    kv_cache *kv;
    fwd_row *rows;
    int n, maxpos, nblk, sc_len;
    const int *blk;         /* attention blocks: rows blk[b] .. blk[b + 1] - 1 (attn_ctx) */
    float *x, *h, *tmp;     /* n x d_model: residual stream, branch input, branch output */
    float *Q, *K, *V, *att; /* n x (heads x key width), (KV heads x key), (KV heads x value), (heads x value) */
    float *rope, *ascr;     /* per row rope_dim (cos, sin) values; attention scores scratch */
    int pend;               /* tmp is a branch output not yet added to x */
    float pend_scale;       /* ... times this */
} fwd;

/* Scratch, attention blocks and each row's RoPE table (model.c calls it before the
 * architecture's forward). 0, or -1 out of memory. */
int fwd_begin(fwd *F, model *m, kv_cache *kv, fwd_row *rows, int n);

/* Rows a block takes at once in a long forward (the budget's prefill chunk), and F narrowed to
 * its rows a .. a + cnt - 1 (per-row buffers and rows offset): blocks run a part at a time. */
int part_rows(const fwd *F);
fwd fwd_part(const fwd *F, int a, int cnt);
/* outs[i] = ws[i] x for the n rows of x (widths ws[i]->cols, the same for all): one call into the
 * compute tier (an architecture's own block keeps the one seam). */
void fwd_mm(fwd *F, const float *x, int n, const qmat *const *ws, float *const *outs, int cnt);

/* out = rmsnorm(x, w) over d values (the forward's RMSNorm, for an architecture's own inputs). */
void fwd_rmsnorm(float *out, const float *x, const float *w, int d, float eps);
/* x = token_embd[token] (times scale when it is not 1: Granite's embedding_scale). */
void fwd_embed(fwd *F, float scale);
/* x += the pending branch; h = rmsnorm(x, w) (w NULL: the add only). */
void fwd_norm(fwd *F, const float *w);
/* The branch just computed (tmp) is added to x times scale, by the next fwd_norm / fwd_head. */
void fwd_residual(fwd *F, float scale);

/* q/k RMSNorm: none, per head [head_dim_k] (when the layer has the norms: GLM-4.5's are
 * optional), or over the whole q / k projection (OLMoE). */
enum { QKN_NONE = 0, QKN_HEAD = 1, QKN_FULL = 2 };
/* RoPE pairs: (2i, 2i + 1) (llama.cpp's NORM) or (i, i + rope_dim/2) (NEOX). */
enum { ROPE_NORM = 0, ROPE_NEOX = 1 };
typedef struct {
    int qk_norm;            /* QKN_* */
    int rope;               /* ROPE_* */
    float scale;            /* score scale; 0: 1/sqrt(head_dim_k) */
} attn_opts;
/* Layer l's self-attention on h: q, k, v (+ their biases when the layer has them), q/k norms,
 * (a gated layer, whose attn_q has 2 x heads x head_dim_k rows, gives each head [q | gate], and
 * each head's output is times sigmoid(gate) before attn_output: Qwen3.5 / Qwen3-Next),
 * RoPE on the key width, K/V appended to the rows' slots, causal GQA attention (over the
 * layer's sliding window when it has one, with its per-head sinks when it has them), the output
 * projection (+ its bias) into the branch (tmp). */
int fwd_attention(fwd *F, int l, const attn_opts *o);   /* 0, or -1 out of memory (gated only) */

/* Dense SiLU-gated FFN of layer L on h into the branch. 0, or -1 out of memory. */
int fwd_ffn(fwd *F, const layer_w *L);
/* The MoE FFN of layer L on h (routed experts + the layer's shared expert; moe.c) into the
 * branch, routed as the architecture passes (moe_opts, model_impl.h). 0, or -1 (out of
 * memory, expert read failure). */
int fwd_moe(fwd *F, const layer_w *L, const moe_opts *o);
/* x += the pending branch; the rows that want logits: output(rmsnorm(x, output_norm)),
 * divided by div when it is not 1 (Granite's logit_scale). 0, or -1 out of memory. */
int fwd_head(fwd *F, float div);
/* The same with another final norm (an MTP block's shared_head_norm). */
int fwd_head_norm(fwd *F, const float *norm_w, float div);
#endif
