/* model.c — the batched forward of a loaded model (dense or MoE).
 *
 * Forward, per row (same formulas as llama.cpp's llama graph):
 *   x = token_embd[token]
 *   per layer: h = rmsnorm(x, attn_norm); q,k,v = Wq h, Wk h, Wv h; RoPE (interleaved
 *   pairs, ggml mode 0) on q and k; K/V appended to the row's slot; causal attention over
 *   [0, pos] of the slot (GQA, scale 1/sqrt(head_dim), float softmax with max subtraction);
 *   x += Wo o; h = rmsnorm(x, ffn_norm); x += FFN(h) where FFN is the SiLU-gated MLP or
 *   the MoE (top-k routed experts + optional shared expert).
 *   logits = output * rmsnorm(x, output_norm)  (output tied to token_embd when absent).
 *
 * MoE combination order is fixed per row (selected experts in increasing id, then the
 * shared expert), so a row's result does not depend on which other rows share the batch.
 *
 * The parts live in their own files (model_impl.h lists them): loading in model_load.c and
 * arch_<name>.c, the MoE FFN in moe.c, attention kernels in attention.c. */
#include "model_impl.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

/* The CPU compute tier: quant.c's kernels on the pool. */
const compute_tier compute_cpu = {"cpu", qmat_mul_multi};

/* ---------------------------------------------------------------- math helpers */

static void rmsnorm(float *out, const float *x, const float *w, int d, float eps) {
    double ss = 0.0;
    for (int j = 0; j < d; j++) ss += (double)(x[j] * x[j]);
    float mean = (float)(ss / d);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int j = 0; j < d; j++) out[j] = (x[j] * scale) * w[j];
}


/* cs: rope_dim/2 (cos, sin) pairs for position pos. */
static void rope_table(const struct model_priv *P, int pos, float *cs) {
    for (int i = 0; i < P->rope_dim / 2; i++) {
        double th = (double)pos * P->inv_freq[i];
        cs[2 * i] = (float)(cos(th) * P->rope_mscale);
        cs[2 * i + 1] = (float)(sin(th) * P->rope_mscale);
    }
}

/* NeoX order: the pairs are (i, i + rope_dim/2). */
static void rope_apply_neox(float *v, int n_heads, int head_dim, int rope_dim, const float *cs) {
    const int h = rope_dim / 2;
    for (int hh = 0; hh < n_heads; hh++) {
        float *p = v + (size_t)hh * head_dim;
        for (int i = 0; i < h; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = p[i], x1 = p[i + h];
            p[i] = x0 * c - x1 * s;
            p[i + h] = x0 * s + x1 * c;
        }
    }
}

/* In place: each head of v RMS-normalized with weight w [head_dim]. */
static void head_norm(float *v, int n_heads, int head_dim, const float *w, float eps) {
    for (int hh = 0; hh < n_heads; hh++) rmsnorm(v + (size_t)hh * head_dim, v + (size_t)hh * head_dim, w, head_dim, eps);
}

static void rope_apply(float *v, int n_heads, int head_dim, int rope_dim, const float *cs) {
    for (int hh = 0; hh < n_heads; hh++) {
        float *p = v + (size_t)hh * head_dim;
        for (int i = 0; i < rope_dim / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = p[2 * i], x1 = p[2 * i + 1];
            p[2 * i] = x0 * c - x1 * s;
            p[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

void par_rows(pool_fn fn, void *ctx, int n) {
    int nc = (n + ROW_CHUNK - 1) / ROW_CHUNK;
    if (n >= 2 * ROW_CHUNK) pool_run(fn, ctx, nc);
    else
        for (int c = 0; c < nc; c++) fn(ctx, c);
}

/* x += add (when add); h = rmsnorm(x, w) (when w). */
typedef struct { float *x; const float *add; float *h; const float *w; int n, d; float eps, rs; } norm_ctx;
static void norm_chunk(void *vctx, int c) {
    const norm_ctx *N = vctx;
    const size_t d = (size_t)N->d;
    for (int i = c * ROW_CHUNK; i < N->n && i < (c + 1) * ROW_CHUNK; i++) {
        float *xi = N->x + i * d;
        if (N->add && N->rs != 1.0f)
            for (size_t q = 0; q < d; q++) xi[q] += N->add[i * d + q] * N->rs;
        else if (N->add)
            for (size_t q = 0; q < d; q++) xi[q] += N->add[i * d + q];
        if (N->w) rmsnorm(N->h + i * d, xi, N->w, N->d, N->eps);
    }
}
/* x += add * rs (the residual scale: 1 for all but Granite); h = rmsnorm(x, w). */
static void add_norm(float *x, const float *add, float rs, float *h, const float *w, int n, int d, float eps) {
    norm_ctx N = {x, add, h, w, n, d, eps, rs};
    par_rows(norm_chunk, &N, n);
}

/* Per-head q/k RMSNorm (when the layer has them), RoPE on q and k, then k and v appended to
 * the rows' slots. */
typedef struct {
    kv_cache *kv;
    const fwd_row *rows;
    float *Q, *K;
    const float *V, *rope;
    int n, l, nh, nkv, hd, rdim;
    const float *qn, *kn;
    float eps;
    int neox, full;
} rope_ctx;
static void rope_chunk(void *vctx, int c) {
    const rope_ctx *R = vctx;
    const size_t qd = (size_t)R->nh * R->hd, kvd = (size_t)R->nkv * R->hd;
    for (int i = c * ROW_CHUNK; i < R->n && i < (c + 1) * ROW_CHUNK; i++) {
        const float *cs = R->rope + (size_t)i * R->rdim;
        if (R->full) {
            if (R->qn) rmsnorm(R->Q + i * qd, R->Q + i * qd, R->qn, (int)qd, R->eps);
            if (R->kn) rmsnorm(R->K + i * kvd, R->K + i * kvd, R->kn, (int)kvd, R->eps);
        } else {
            if (R->qn) head_norm(R->Q + i * qd, R->nh, R->hd, R->qn, R->eps);
            if (R->kn) head_norm(R->K + i * kvd, R->nkv, R->hd, R->kn, R->eps);
        }
        void (*rot)(float *, int, int, int, const float *) = R->neox ? rope_apply_neox : rope_apply;
        rot(R->Q + i * qd, R->nh, R->hd, R->rdim, cs);
        rot(R->K + i * kvd, R->nkv, R->hd, R->rdim, cs);
        kv_store(R->kv, R->rows[i].slot, R->l, R->rows[i].pos, R->K + i * kvd, R->V + i * kvd);
    }
}

/* Matmuls over the same n input rows, run as one parallel job. */
static void mm_many(struct model_priv *P, const float *x, int n, const qmat *const *ws, float *const *outs,
                    int cnt) {
    mm_job J[8];
    qact_prepare(&P->act, ws[0]->type, x, n, ws[0]->cols);
    for (int i = 0; i < cnt; i++) J[i] = (mm_job){ws[i], NULL, &P->act, outs[i], ws[i]->rows};
    P->tier->mul_multi(J, cnt);
}

static void mm(struct model_priv *P, const qmat *w, const float *x, int n, float *out) {
    mm_many(P, x, n, &w, &out, 1);
}

static int forward_inner(model *m, kv_cache *kv, fwd_row *rows, int n) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const int d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int qd = nh * hd, kvd = nkv * hd, grp = nh / nkv, rdim = P->rope_dim;
    int maxpos = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].pos > maxpos) maxpos = rows[i].pos;
    int nthr = pool_threads();
    float *x = fb(&P->x, (size_t)n * d), *h = fb(&P->h, (size_t)n * d);
    float *Q = fb(&P->q, (size_t)n * qd), *Kb = fb(&P->k, (size_t)n * kvd), *Vb = fb(&P->v, (size_t)n * kvd);
    float *att = fb(&P->att, (size_t)n * qd), *tmp = fb(&P->tmp, (size_t)n * d);
    const int sc_len = (maxpos + 8) / 8 * 8;
    float *ascr = fb(&P->ascr, (size_t)nthr * ATT_G * (size_t)sc_len);
    /* attention blocks: up to ATT_R consecutive rows of one slot at consecutive positions */
    int *blk = ib(&P->ablk, (size_t)n + 1), nblk = 0;
    if (!blk) return -1;
    for (int i = 0; i < n; i++)
        if (i == 0 || i - blk[nblk - 1] >= ATT_R || rows[i].slot != rows[i - 1].slot || rows[i].pos != rows[i - 1].pos + 1)
            blk[nblk++] = i;
    blk[nblk] = n;
    float *rope = fb(&P->rope, (size_t)n * rdim);
    if (!x || !h || !Q || !Kb || !Vb || !att || !tmp || !ascr || !rope) return -1;

    for (int i = 0; i < n; i++) {
        qmat_row(&m->tok_embd, rows[i].token, x + (size_t)i * d);
        if (c->embd_scale != 1.0f)
            for (int q = 0; q < d; q++) x[(size_t)i * d + q] *= c->embd_scale;
        rope_table(P, rows[i].pos, rope + (size_t)i * rdim);
    }
    const float scale = c->attn_scale > 0.0f ? c->attn_scale : 1.0f / sqrtf((float)hd);

    for (int l = 0; l < c->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        double t0 = mnow();
        /* h = attn_norm(x); the previous layer's FFN output is added to x first */
        add_norm(x, l > 0 ? tmp : NULL, c->resid_scale, h, L->attn_norm, n, d, c->rms_eps);
        {
            const qmat *ws[3] = {&L->q, &L->k, &L->v};
            float *os[3] = {Q, Kb, Vb};
            mm_many(P, h, n, ws, os, 3);
            const float *bs[3] = {L->q_b, L->k_b, L->v_b};
            const int ws_[3] = {qd, kvd, kvd};
            for (int k = 0; k < 3; k++)
                if (bs[k])
                    for (int i = 0; i < n; i++)
                        for (int q = 0; q < ws_[k]; q++) os[k][(size_t)i * ws_[k] + q] += bs[k][q];
        }
        rope_ctx R = {kv, rows, Q, Kb, Vb, rope, n, l, nh, nkv, hd, rdim, L->q_norm, L->k_norm, c->rms_eps, c->rope_neox,
                      c->qk_norm_full};
        par_rows(rope_chunk, &R, n);
        /* threads only when there is enough work to pay for them (results do not depend
         * on it: each (row, head) task is computed the same way either way) */
        long awork = (long)n * nh * (long)(maxpos + 1) * hd;
        attn_ctx A = {kv, rows, blk, Q, att, ascr, sc_len, l, nh, nkv, hd, qd, grp, scale};
        if (awork > (1L << 15)) pool_run(attn_task, &A, nblk * nkv);
        else
            for (int task = 0; task < nblk * nkv; task++) attn_task(&A, task);
        mm(P, &L->o, att, n, tmp);
        m->perf.t_attn += mnow() - t0;

        add_norm(x, tmp, c->resid_scale, h, L->ffn_norm, n, d, c->rms_eps);
        if (L->moe_row < 0) {
            t0 = mnow();
            float *g = fb(&P->fg, (size_t)n * c->d_ff), *u = fb(&P->fu, (size_t)n * c->d_ff);
            if (!g || !u) return -1;
            const qmat *ws[2] = {&L->ffn_gate, &L->ffn_up};
            float *os[2] = {g, u};
            mm_many(P, h, n, ws, os, 2);
            for (size_t q = 0; q < (size_t)n * c->d_ff; q++) g[q] = qsilu_mul(g[q], u[q]);
            mm(P, &L->ffn_down, g, n, tmp);
            m->perf.t_dense += mnow() - t0;
        } else {
            if (moe_ffn(m, L, h, n, rows, tmp) != 0) return -1;
        }
    }
    add_norm(x, tmp, c->resid_scale, NULL, NULL, n, d, c->rms_eps);

    double t0 = mnow();
    int nl = 0;
    for (int i = 0; i < n; i++) nl += rows[i].logits != NULL;
    if (nl > 0) {
        float *hin = fb(&P->hin, (size_t)nl * d), *hout = fb(&P->hout, (size_t)nl * c->vocab);
        if (!hin || !hout) return -1;
        int j = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].logits) rmsnorm(hin + (size_t)(j++) * d, x + (size_t)i * d, m->output_norm, d, c->rms_eps);
        mm(P, &m->output, hin, nl, hout);
        j = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].logits) memcpy(rows[i].logits, hout + (size_t)(j++) * c->vocab, sizeof(float) * c->vocab);
        if (c->logit_scale != 1.0f)       /* Granite: logits / logit_scale */
            for (int i = 0; i < n; i++)
                if (rows[i].logits)
                    for (int v = 0; v < c->vocab; v++) rows[i].logits[v] /= c->logit_scale;
    }
    m->perf.t_head += mnow() - t0;
    m->perf.forwards++;
    return 0;
}

int model_forward(model *m, kv_cache *kv, fwd_row *rows, int n) {
    if (n <= 0) return 0;
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    if (!P || !kv || kv->n_layers != c->n_layers || kv->kv_dim != c->n_kv_heads * c->head_dim) return -1;
    int *slot0 = ib(&P->slot0, (size_t)kv->n_slots);
    if (!slot0) return -1;
    for (int s = 0; s < kv->n_slots; s++) slot0[s] = -1;
    /* Validate rows and append their tokens to the slot histories; undone on failure. */
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int s = rows[i].slot;
        if (s < 0 || s >= kv->n_slots || rows[i].token < 0 || rows[i].token >= c->vocab) {
            rc = -1;
            break;
        }
        kv_slot *sl = &kv->slots[s];
        if (slot0[s] < 0) slot0[s] = sl->n_pos;
        if (rows[i].pos != sl->n_pos || rows[i].pos >= kv->ctx || kv_reserve(kv, s, rows[i].pos + 1) != 0) {
            rc = -1;
            break;
        }
        sl->tokens[rows[i].pos] = rows[i].token;
        sl->n_pos = rows[i].pos + 1;
    }
    if (rc == 0) rc = forward_inner(m, kv, rows, n);
    if (rc != 0)
        for (int s = 0; s < kv->n_slots; s++)
            if (slot0[s] >= 0) kv_truncate(kv, s, slot0[s]);
    return rc;
}
