/* forward.c — the forward's building blocks (blocks.h): embedding, RMSNorm with the pending
 * residual, self-attention (projections, biases, q/k norms, RoPE, the KV append, the attention
 * kernel of attention.c, the output projection), the dense FFN, the MoE FFN (moe.c), the head.
 * Owns: the per-row formulas (same as llama.cpp's graphs):
 *   RMSNorm y = x / sqrt(mean(x^2) + eps) * w (the sum of squares in double);
 *   RoPE on the first rope_dim values of each q / k head (key width), angle pos * inv_freq_i
 *   (model_load.c's table), pairs (2i, 2i+1) or NeoX (i, i + rope_dim/2);
 *   causal GQA attention over [0, pos] of the row's slot, or its last `window` keys, with the
 *   layer's sinks in the softmax denominators (attention.c's fixed orders);
 *   FFN down(silu(gate h) * up h).
 * Which of them a layer uses, with which scales, is its architecture's forward (arch_<name>.c). */
#include "blocks.h"
#include "io.h"

#include <math.h>
#include <string.h>

/* ---------------------------------------------------------------- math helpers */

static void rmsnorm(float *out, const float *x, const float *w, int d, float eps) {
    double ss = 0.0;
    for (int j = 0; j < d; j++) ss += (double)(x[j] * x[j]);
    float mean = (float)(ss / d);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int j = 0; j < d; j++) out[j] = (x[j] * scale) * w[j];
}

void fwd_rmsnorm(float *out, const float *x, const float *w, int d, float eps) { rmsnorm(out, x, w, d, eps); }

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

/* In place: each head of v RMS-normalized with weight w [head_dim]. */
static void head_norm(float *v, int n_heads, int head_dim, const float *w, float eps) {
    for (int hh = 0; hh < n_heads; hh++) rmsnorm(v + (size_t)hh * head_dim, v + (size_t)hh * head_dim, w, head_dim, eps);
}

/* Matmuls over the same n input rows, run as one call into the compute tier. */
static void mm_many(struct model_priv *P, const float *x, int n, const qmat *const *ws, float *const *outs,
                    int cnt) {
    mm_job J[8];
    qact_prepare(&P->act, ws[0]->type, x, n, ws[0]->cols);
    for (int i = 0; i < cnt; i++) J[i] = (mm_job){ws[i], NULL, &P->act, outs[i], ws[i]->rows};
    P->tier->mul_multi(J, cnt);
}

void fwd_mm(fwd *F, const float *x, int n, const qmat *const *ws, float *const *outs, int cnt) {
    mm_many(F->P, x, n, ws, outs, cnt);
}

static void mm(struct model_priv *P, const qmat *w, const float *x, int n, float *out) {
    mm_many(P, x, n, &w, &out, 1);
}

/* ---------------------------------------------------------------- setup, embedding, norms */

/* Rows the per-part blocks (attention, dense FFN) take at once: the budget's prefill chunk. */
int part_rows(const fwd *F) {
    const int sub = F->P->part_rows;
    return sub > 0 && sub < F->n ? sub : F->n;
}

int fwd_begin(fwd *F, model *m, kv_cache *kv, fwd_row *rows, int n) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const size_t d = (size_t)c->d_model, nh = (size_t)c->n_heads, nkv = (size_t)c->n_kv_heads;
    const size_t hk = (size_t)c->head_dim_k, hv = (size_t)c->head_dim_v, N = (size_t)n;
    memset(F, 0, sizeof *F);
    F->m = m, F->P = P, F->kv = kv, F->rows = rows, F->n = n;
    for (int i = 0; i < n; i++)
        if (rows[i].pos > F->maxpos) F->maxpos = rows[i].pos;
    const size_t S = (size_t)part_rows(F);
    F->x = fb(&P->x, N * d), F->h = fb(&P->h, N * d), F->tmp = fb(&P->tmp, N * d);
    F->Q = fb(&P->q, S * nh * hk), F->K = fb(&P->k, S * nkv * hk), F->V = fb(&P->v, S * nkv * hv);
    F->att = fb(&P->att, S * nh * hv);
    F->sc_len = (F->maxpos + 8) / 8 * 8;
    F->ascr = fb(&P->ascr, (size_t)pool_threads() * ATT_G * (size_t)F->sc_len);
    F->rope = fb(&P->rope, N * (size_t)P->rope_dim);
    if (!ib(&P->ablk, S + 1) || !F->x || !F->h || !F->tmp || !F->Q || !F->K || !F->V || !F->att || !F->ascr ||
        !F->rope)
        return -1;
    for (int i = 0; i < n; i++) rope_table(P, rows[i].pos, F->rope + (size_t)i * P->rope_dim);
    return 0;
}

/* Attention blocks of F's rows: up to ATT_R consecutive rows of one slot at consecutive positions. */
static void attn_blocks(fwd *F) {
    int *blk = F->P->ablk.p, nblk = 0;
    const fwd_row *rows = F->rows;
    for (int i = 0; i < F->n; i++)
        if (i == 0 || i - blk[nblk - 1] >= ATT_R || rows[i].slot != rows[i - 1].slot || rows[i].pos != rows[i - 1].pos + 1)
            blk[nblk++] = i;
    blk[nblk] = F->n;
    F->blk = blk, F->nblk = nblk;
}

/* F narrowed to its rows a .. a + cnt - 1 (the per-row buffers and the rows offset), for a
 * block that runs a long prefill a part at a time. */
fwd fwd_part(const fwd *F, int a, int cnt) {
    fwd S = *F;
    const size_t d = (size_t)F->m->c.d_model;
    S.rows += a, S.n = cnt, S.x += (size_t)a * d, S.h += (size_t)a * d, S.tmp += (size_t)a * d;
    S.rope += (size_t)a * (size_t)F->P->rope_dim;
    S.maxpos = 0;
    for (int i = 0; i < cnt; i++)
        if (S.rows[i].pos > S.maxpos) S.maxpos = S.rows[i].pos;
    return S;
}

void fwd_embed(fwd *F, float scale) {
    const int d = F->m->c.d_model;
    for (int i = 0; i < F->n; i++) {
        float *xi = F->x + (size_t)i * d;
        qmat_row(&F->m->tok_embd, F->rows[i].token, xi);
        if (scale != 1.0f)
            for (int q = 0; q < d; q++) xi[q] *= scale;
    }
}

/* x += add * rs (when add); h = rmsnorm(x, w) (when w). */
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

/* The pending branch added to x, then h = rmsnorm(x, w) when w: one pass over the rows. */
void fwd_norm(fwd *F, const float *w) {
    const model_config *c = &F->m->c;
    norm_ctx N = {F->x, F->pend ? F->tmp : NULL, F->h, w, F->n, c->d_model, c->rms_eps, F->pend_scale};
    F->pend = 0;
    par_rows(norm_chunk, &N, F->n);
}

void fwd_residual(fwd *F, float scale) {
    F->pend = 1;
    F->pend_scale = scale;
}

/* ---------------------------------------------------------------- attention */

/* q/k RMSNorms (when the layer has them), RoPE on q and k (key width), then k and v appended
 * to the rows' slots. */
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
    const size_t qd = (size_t)R->nh * R->hd, kd = (size_t)R->nkv * R->hd, vd = (size_t)R->kv->v_dim;
    for (int i = c * ROW_CHUNK; i < R->n && i < (c + 1) * ROW_CHUNK; i++) {
        const float *cs = R->rope + (size_t)i * R->rdim;
        if (R->full) {
            if (R->qn) rmsnorm(R->Q + i * qd, R->Q + i * qd, R->qn, (int)qd, R->eps);
            if (R->kn) rmsnorm(R->K + i * kd, R->K + i * kd, R->kn, (int)kd, R->eps);
        } else {
            if (R->qn) head_norm(R->Q + i * qd, R->nh, R->hd, R->qn, R->eps);
            if (R->kn) head_norm(R->K + i * kd, R->nkv, R->hd, R->kn, R->eps);
        }
        void (*rot)(float *, int, int, int, const float *) = R->neox ? rope_apply_neox : rope_apply;
        rot(R->Q + i * qd, R->nh, R->hd, R->rdim, cs);
        rot(R->K + i * kd, R->nkv, R->hd, R->rdim, cs);
        kv_store(R->kv, R->rows[i].slot, R->l, R->rows[i].pos, R->K + i * kd, R->V + i * vd);
    }
}

/* Q, K, V = Wq h, Wk h, Wv h (one call into the tier), plus the layer's biases. Gated: Wq h is
 * [q | gate] per head into QG, split into Q and G (each n x heads x head width). */
static void attn_qkv(fwd *F, const layer_w *L, float *QG, float *G) {
    const qmat *ws[3] = {&L->q, &L->k, &L->v};
    float *os[3] = {QG ? QG : F->Q, F->K, F->V};
    mm_many(F->P, F->h, F->n, ws, os, 3);
    if (QG) {
        const int nh = F->m->c.n_heads, hd = F->m->c.head_dim_k;
        for (int i = 0; i < F->n; i++)
            for (int hh = 0; hh < nh; hh++) {
                const float *src = QG + ((size_t)i * nh + hh) * 2 * hd;
                memcpy(F->Q + ((size_t)i * nh + hh) * hd, src, sizeof(float) * hd);
                memcpy(G + ((size_t)i * nh + hh) * hd, src + hd, sizeof(float) * hd);
            }
    }
    const float *bs[3] = {L->q_b, L->k_b, L->v_b};
    for (int k = 0; k < 3; k++) {
        const int w = ws[k]->rows;
        if (bs[k])
            for (int i = 0; i < F->n; i++)
                for (int q = 0; q < w; q++) os[k][(size_t)i * w + q] += bs[k][q];
    }
}

static int attn_rows(fwd *F, int l, const attn_opts *o);

/* A part at a time (the prefill chunk): the K/V of a part's rows are stored before its
 * attention, and every earlier part's before it, so each row sees exactly its past. */
int fwd_attention(fwd *F, int l, const attn_opts *o) {
    const int sub = part_rows(F);
    for (int a = 0; a < F->n; a += sub) {
        fwd S = fwd_part(F, a, F->n - a < sub ? F->n - a : sub);
        attn_blocks(&S);
        if (attn_rows(&S, l, o) != 0) return -1;
    }
    return 0;
}

static int attn_rows(fwd *F, int l, const attn_opts *o) {
    model *m = F->m;
    const model_config *c = &m->c;
    const layer_w *L = &m->layers[l];
    const int nh = c->n_heads, nkv = c->n_kv_heads, hk = c->head_dim_k, hv = c->head_dim_v, n = F->n;
    double t0 = mnow();
    float *QG = NULL, *G = NULL;    /* the gate's scratch: the dense FFN's, free during attention */
    if (L->q.rows == 2 * nh * hk) {
        QG = fb(&F->P->fg, (size_t)n * nh * 2 * hk), G = fb(&F->P->fu, (size_t)n * nh * hk);
        if (!QG || !G) return -1;
    }
    attn_qkv(F, L, QG, G);
    const int qkn = o->qk_norm != QKN_NONE;
    rope_ctx R = {F->kv, F->rows, F->Q, F->K, F->V, F->rope, n, l, nh, nkv, hk, F->P->rope_dim, qkn ? L->q_norm : NULL,
                  qkn ? L->k_norm : NULL, c->rms_eps, o->rope == ROPE_NEOX, o->qk_norm == QKN_FULL};
    par_rows(rope_chunk, &R, n);
    const float scale = o->scale > 0.0f ? o->scale : 1.0f / sqrtf((float)hk);
    /* threads only when there is enough work to pay for them (results do not depend
     * on it: each (row, head) task is computed the same way either way) */
    long awork = (long)n * nh * (long)(F->maxpos + 1) * hk;
    attn_ctx A = {F->kv, F->rows, F->blk, F->Q, F->att, F->ascr, F->sc_len, l, nh, nkv, hk, hv, nh * hk, nh * hv,
                  nh / nkv, scale, L->window, L->sinks};
    if (awork > (1L << 15)) pool_run(attn_task, &A, F->nblk * nkv);
    else
        for (int task = 0; task < F->nblk * nkv; task++) attn_task(&A, task);
    if (G)      /* head width hv == hk (the loader checks) */
        for (size_t q = 0; q < (size_t)n * nh * hv; q++) F->att[q] *= 1.0f / (1.0f + expf(-G[q]));
    mm(F->P, &L->o, F->att, n, F->tmp);
    if (L->o_b)
        for (int i = 0; i < n; i++)
            for (int q = 0; q < c->d_model; q++) F->tmp[(size_t)i * c->d_model + q] += L->o_b[q];
    m->perf.t_attn += mnow() - t0;
    return 0;
}

/* ---------------------------------------------------------------- FFN, head */

static int ffn_rows(fwd *F, const layer_w *L);

int fwd_ffn(fwd *F, const layer_w *L) {
    const int sub = part_rows(F);
    for (int a = 0; a < F->n; a += sub) {
        fwd S = fwd_part(F, a, F->n - a < sub ? F->n - a : sub);
        if (ffn_rows(&S, L) != 0) return -1;
    }
    return 0;
}

static int ffn_rows(fwd *F, const layer_w *L) {
    struct model_priv *P = F->P;
    const size_t nf = (size_t)F->n * F->m->c.d_ff;
    double t0 = mnow();
    float *g = fb(&P->fg, nf), *u = fb(&P->fu, nf);
    if (!g || !u) return -1;
    const qmat *ws[2] = {&L->ffn_gate, &L->ffn_up};
    float *os[2] = {g, u};
    mm_many(P, F->h, F->n, ws, os, 2);
    for (size_t q = 0; q < nf; q++) g[q] = qsilu_mul(g[q], u[q]);
    mm(P, &L->ffn_down, g, F->n, F->tmp);
    F->m->perf.t_dense += mnow() - t0;
    return 0;
}

int fwd_moe(fwd *F, const layer_w *L, const moe_opts *o) {
    return moe_ffn(F->m, L, F->h, F->n, F->rows, F->tmp, o);
}

int fwd_head(fwd *F, float div) { return fwd_head_norm(F, F->m->output_norm, div); }

int fwd_head_norm(fwd *F, const float *norm_w, float div) {
    model *m = F->m;
    struct model_priv *P = F->P;
    const model_config *c = &m->c;
    const int d = c->d_model, V = c->vocab;
    fwd_norm(F, NULL);
    const double idle0 = io_idle_s();
    double t0 = mnow();
    int nl = 0;
    for (int i = 0; i < F->n; i++) nl += F->rows[i].logits != NULL;
    if (nl > 0) {
        float *hin = fb(&P->hin, (size_t)nl * d), *hout = fb(&P->hout, (size_t)nl * V);
        if (!hin || !hout) return -1;
        int j = 0;
        for (int i = 0; i < F->n; i++)
            if (F->rows[i].logits) rmsnorm(hin + (size_t)(j++) * d, F->x + (size_t)i * d, norm_w, d, c->rms_eps);
        mm(P, &m->output, hin, nl, hout);
        j = 0;
        for (int i = 0; i < F->n; i++) {
            float *lg = F->rows[i].logits;
            if (!lg) continue;
            memcpy(lg, hout + (size_t)(j++) * V, sizeof(float) * V);
            if (div != 1.0f)
                for (int v = 0; v < V; v++) lg[v] /= div;
        }
    }
    m->perf.t_head += mnow() - t0;
    m->perf.t_head_idle += io_idle_s() - idle0;
    return 0;
}
