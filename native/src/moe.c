/* moe.c — the MoE FFN, routed as the architecture's forward says at each call (moe_opts):
 * routing (router logits + bias, top-k selection by logits or by probability + selection bias
 * within the kept expert groups, gating weights, usage bookkeeping), grouping the (row, expert)
 * pairs by expert, the routed and shared experts' matmuls as two parallel jobs (with per-expert
 * biases and the SiLU or gpt-oss's clamped SwiGLU activation), and the fixed-order combine.
 *
 * Every matmul, the routers' included, goes through the compute tier (P->tier->mul_multi).
 *
 * MoE combination order is fixed per row (selected experts in increasing id, then the shared
 * expert), so a row's result does not depend on which other rows share the batch. */
#include <math.h>
#include <string.h>

#include "model_impl.h"
/* y_i += w_ij * expert_out(i, j) for row i's pairs whose grouped position is in [lo, hi) (one
 * group of experts, eo from lo on), in the row's pair order (selected experts in increasing id);
 * the groups come in increasing expert id, so y_i sums its experts in the same order whichever
 * groups they fall in. The first group starts y at 0, the shared expert's output comes last. */
typedef struct {
    float *out;
    const float *selw, *eo, *so;
    const int *slot_of, *koff;
    int n, d, lo, hi, first;
} combine_ctx;
static void combine_chunk(void *vctx, int c) {
    const combine_ctx *C = vctx;
    const int d = C->d;
    for (int i = c * ROW_CHUNK; i < C->n && i < (c + 1) * ROW_CHUNK; i++) {
        float *restrict y = C->out + (size_t)i * d;
        if (C->first)
            for (int q = 0; q < d; q++) y[q] = 0.0f;
        for (int p = C->koff[i]; p < C->koff[i + 1]; p++) {
            const int g = C->slot_of[p];
            if (g < C->lo || g >= C->hi) continue;
            const float *restrict er = C->eo + (size_t)(g - C->lo) * d;
            const float wp = C->selw[p];
            for (int q = 0; q < d; q++) y[q] += wp * er[q];
        }
        if (C->so)
            for (int q = 0; q < d; q++) y[q] += C->so[(size_t)i * d + q];
    }
}

/* Experts per token of a row: its own count when set (1 .. n_experts), else the model's. */
static int row_experts(const model_config *c, const fwd_row *r) {
    return r->n_experts >= 1 && r->n_experts <= c->n_experts ? r->n_experts : c->top_k;
}

/* The K largest router logits of lg (ties -> lower id), written to s in increasing id. */
static void top_k_ids(const float *lg, int E, int K, int *s) {
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= s[q] == e;
            if (taken) continue;
            if (best < 0 || lg[e] > lg[best]) best = e;
        }
        s[j] = best;
    }
    for (int a = 1; a < K; a++)
        for (int b = a; b > 0 && s[b - 1] > s[b]; b--) {
            int t = s[b];
            s[b] = s[b - 1];
            s[b - 1] = t;
        }
}

/* The gating's probability of each of the E experts into p: SIGMOID's sigmoid(logit), else the
 * softmax over every logit. */
static void expert_probs(int gating, const float *lg, int E, float *p) {
    if (gating == GATING_SIGMOID) {
        for (int e = 0; e < E; e++) p[e] = 1.0f / (1.0f + expf(-lg[e]));
        return;
    }
    float mx = lg[0];
    for (int e = 1; e < E; e++) mx = fmaxf(mx, lg[e]);
    double sum = 0.0;
    for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
    for (int e = 0; e < E; e++) p[e] = (float)(expf(lg[e] - mx) / sum);
}

/* Gating weights of the K selected experts s of one row, before o->norm and o->scale: 1 each
 * (UNIT), the softmax of their logits (SOFTMAX), sigmoid (SIGMOID) or the softmax over all
 * experts (SOFTMAX_ALL) of each. */
static void gate_weights_raw(const moe_opts *o, const float *lg, int E, const int *s, int K, float *w) {
    if (o->gating == GATING_UNIT) {
        for (int j = 0; j < K; j++) w[j] = 1.0f;
    } else if (o->gating == GATING_SIGMOID) {
        for (int j = 0; j < K; j++) w[j] = 1.0f / (1.0f + expf(-lg[s[j]]));
    } else if (o->gating == GATING_SOFTMAX_ALL) {
        float mx = lg[0];
        for (int e = 1; e < E; e++) mx = fmaxf(mx, lg[e]);
        double sum = 0.0;
        for (int e = 0; e < E; e++) sum += expf(lg[e] - mx);
        for (int j = 0; j < K; j++) w[j] = (float)(expf(lg[s[j]] - mx) / sum);
    } else {
        float mx = lg[s[0]];
        for (int j = 1; j < K; j++) mx = fmaxf(mx, lg[s[j]]);
        double sum = 0.0;
        for (int j = 0; j < K; j++) {
            w[j] = expf(lg[s[j]] - mx);
            sum += w[j];
        }
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < K; j++) w[j] *= inv;
    }
}

static void gate_weights(const moe_opts *o, const float *lg, int E, const int *s, int K, float *w) {
    gate_weights_raw(o, lg, E, s, K, w);
    if (o->norm && o->gating != GATING_SOFTMAX && o->gating != GATING_UNIT) {
        double sum = 0.0;
        for (int j = 0; j < K; j++) sum += w[j];
        float inv = (float)(1.0 / sum);
        for (int j = 0; j < K; j++) w[j] *= inv;
    }
    if (o->scale != 0.0f && o->scale != 1.0f)
        for (int j = 0; j < K; j++) w[j] *= o->scale;
}

/* With groups (o->n_group > 1), the experts of all but the o->group_used best groups get -inf in
 * the selection scores sc (a group's score: the sum of its two best). */
static void group_mask(const moe_opts *o, int E, float *sc) {
    const int G = o->n_group;
    if (G <= 1 || G > 64 || o->group_used >= G || E % G) return;
    const int per = E / G;
    float gs[64];
    int keep[64];
    for (int g = 0; g < G; g++) {
        float b1 = -INFINITY, b2 = -INFINITY;
        for (int e = g * per; e < (g + 1) * per; e++) {
            if (sc[e] > b1) { b2 = b1; b1 = sc[e]; }
            else if (sc[e] > b2) b2 = sc[e];
        }
        gs[g] = per > 1 ? b1 + b2 : b1;
        keep[g] = 0;
    }
    for (int j = 0; j < o->group_used; j++) {
        int best = -1;
        for (int g = 0; g < G; g++)
            if (!keep[g] && (best < 0 || gs[g] > gs[best])) best = g;
        keep[best] = 1;
    }
    for (int g = 0; g < G; g++)
        if (!keep[g])
            for (int e = g * per; e < (g + 1) * per; e++) sc[e] = -INFINITY;
}

/* The K experts one row selects, into s in increasing id: by its logits when neither a selection
 * bias nor groups apply and the gating is monotonic in them; else by the gating's probabilities
 * plus the bias, within the kept groups. sc: E floats of scratch. */
static void select_experts(const moe_opts *o, const float *lg, const float *bias, int E, int K, float *sc, int *s) {
    if (o->gating != GATING_SIGMOID && !bias && o->n_group <= 1) {
        top_k_ids(lg, E, K, s);
        return;
    }
    expert_probs(o->gating, lg, E, sc);
    if (bias)
        for (int e = 0; e < E; e++) sc[e] += bias[e];
    group_mask(o, E, sc);
    top_k_ids(sc, E, K, s);
}

/* Router logits, each row's selected experts (sel, koff) and their weights (selw); the
 * selections are counted in the expert store (heat unless the row says no_heat, HITS) and in
 * the row's route_counts, and written to its picks. */
static void moe_route(model *m, const layer_w *L, const moe_opts *o, const float *h, int n, const fwd_row *rows,
                      const int *koff, float *rl, float *sc, int *sel, float *selw) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const int d = c->d_model, E = c->n_experts, r = L->moe_row;
    qact_prepare(&P->act, L->router.type, h, n, d);
    P->tier->mul_multi(&(mm_job){&L->router, NULL, &P->act, rl, E}, 1);
    for (int i = 0; i < n; i++) {
        float *lg = rl + (size_t)i * E;
        if (L->router_b)
            for (int e = 0; e < E; e++) lg[e] += L->router_b[e];
        const int K = koff[i + 1] - koff[i];
        int *s = sel + koff[i];
        select_experts(o, lg, L->exp_bias, E, K, sc, s);
        gate_weights(o, lg, E, s, K, selw + koff[i]);
        for (int j = 0; j < K; j++) {
            es_note(m->es, r, s[j], !rows[i].no_heat);
            if (rows[i].route_counts) rows[i].route_counts[(size_t)r * E + s[j]]++;
            if (rows[i].picks) rows[i].picks[(size_t)r * K + j] = (uint16_t)s[j];
        }
    }
}

/* Groups the NP (row, rank) pairs by expert, rows in batch order within an expert: expert e's
 * pairs are eoff[e] .. eoff[e + 1] - 1, elist[q] the batch row of grouped pair q, slot_of[p]
 * the grouped position of pair p. ecnt: E + 1 ints of scratch. */
static void moe_group(const int *sel, const int *koff, int n, int E, int *ecnt, int *eoff, int *elist, int *slot_of) {
    const int NP = koff[n];
    memset(ecnt, 0, sizeof(int) * (size_t)(E + 1));
    for (int p = 0; p < NP; p++) ecnt[sel[p]]++;
    eoff[0] = 0;
    for (int e = 0; e < E; e++) eoff[e + 1] = eoff[e] + ecnt[e];
    for (int e = 0; e <= E; e++) ecnt[e] = eoff[e];
    for (int i = 0; i < n; i++)
        for (int p = koff[i]; p < koff[i + 1]; p++) {
            slot_of[p] = ecnt[sel[p]];
            elist[ecnt[sel[p]]++] = i;
        }
}

/* ggml's swiglu_oai on one value pair (gate g, up u). */
static inline float swiglu_oai(float g, float u, float alpha, float limit) {
    const float x = fminf(g, limit), y = fminf(fmaxf(u, -limit), limit);
    return x / (1.0f + expf(alpha * -x)) * (y + 1.0f);
}

/* The separate-job path's activation: each grouped pair q of an expert e with ready[e] == want
 * (experts outside the phase's group: ready -1):
 * gate (eg) and up (eu) rows plus the expert's biases, then the opts' activation, into eg. */
typedef struct {
    const layer_w *L;
    const moe_opts *o;
    const int *eoff, *ready;
    int want, base, X, NP;  /* eg / eu hold the pairs from grouped pair base on */
    float *eg;
    const float *eu;
} act_ctx;
static void expert_act_chunk(void *vctx, int c) {
    const act_ctx *A = vctx;
    const int X = A->X;
    int e = 0;
    for (int q = c * ROW_CHUNK; q < A->NP && q < (c + 1) * ROW_CHUNK; q++) {
        while (A->eoff[e + 1] <= q) e++;
        if (A->ready[e] != A->want) continue;
        const float *gb = A->L->exp_gate_b ? A->L->exp_gate_b + (size_t)e * X : NULL;
        const float *ub = A->L->exp_up_b ? A->L->exp_up_b + (size_t)e * X : NULL;
        float *g = A->eg + (size_t)(q - A->base) * X;
        const float *u = A->eu + (size_t)(q - A->base) * X;
        for (int k = 0; k < X; k++) {
            const float gv = g[k] + (gb ? gb[k] : 0.0f), uv = u[k] + (ub ? ub[k] : 0.0f);
            g[k] = A->o->act == MOE_ACT_SWIGLU_OAI ? swiglu_oai(gv, uv, A->o->alpha, A->o->limit) : qsilu_mul(gv, uv);
        }
    }
}

/* One phase of the experts' matmuls: gate/up (+ SiLU) of the experts whose ready flag equals
 * `want` on their gathered rows (and the shared expert's on all rows, when `shared`) as one
 * parallel job, then their down projections as a second one. P->act still holds h (prepared for
 * the router). eg, eu, eo: the group's pairs (from pair `base` on) x X, x X, x d; sg: n x S,
 * so: n x d. Plain SiLU experts without biases run gate and up as one fused job; otherwise gate
 * into eg and up into eu as two jobs, then expert_act_chunk. 0 ok, -1 out of memory. */
static int moe_phase(model *m, const layer_w *L, const moe_opts *o, int n, const int *eoff, const int *elist,
                     const int *ready, int want, int shared, int base, float *eg, float *eu, float *eo, float *sg,
                     float *so) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const int d = c->d_model, E = c->n_experts, X = c->d_expert;
    const int S = shared && L->sh_gate.rows > 0 ? c->d_shexp : 0;
    const int fused = o->act == MOE_ACT_SILU && !L->exp_gate_b && !L->exp_up_b;
    qact *gact = P->eact, *dact = P->eact + E, *gview = P->eact + 2 * E;
    mm_job *J = P->jobs;
    int nj = 0;
    for (int e = 0; e < E; e++) {
        int cnt = eoff[e + 1] - eoff[e];
        if (cnt == 0 || ready[e] != want) continue;
        const qmat *g = &P->ew[e].gate, *u = &P->ew[e].up;
        const qact *x = &gview[e];
        if (qpack_ok(g->type, g->rows, g->cols) && qpack_ok(u->type, u->rows, u->cols)) {
            gview[e] = P->act;                  /* a view (tiled kernels only): rows by index, no copy */
            gview[e].n = cnt;
            gview[e].idx = elist + eoff[e];
        } else {
            if (qact_gather(&gact[e], &P->act, elist + eoff[e], cnt) != 0) return -1;
            x = &gact[e];
        }
        const size_t at = (size_t)(eoff[e] - base) * X;
        if (fused) {
            J[nj++] = (mm_job){g, u, x, eg + at, X};
        } else {
            J[nj++] = (mm_job){g, NULL, x, eg + at, X};
            J[nj++] = (mm_job){u, NULL, x, eu + at, X};
        }
    }
    if (S) J[nj++] = (mm_job){&L->sh_gate, &L->sh_up, &P->act, sg, S};
    if (nj == 0) return 0;
    P->tier->mul_multi(J, nj);
    nj = 0;
    if (!fused) {
        act_ctx A = {L, o, eoff, ready, want, base, X, eoff[E], eg, eu};
        par_rows(expert_act_chunk, &A, eoff[E]);
    }
    for (int e = 0; e < E; e++) {
        int cnt = eoff[e + 1] - eoff[e];
        if (cnt == 0 || ready[e] != want) continue;
        qact_prepare(&dact[e], P->ew[e].down.type, eg + (size_t)(eoff[e] - base) * X, cnt, X);
        J[nj++] = (mm_job){&P->ew[e].down, NULL, &dact[e], eo + (size_t)(eoff[e] - base) * d, d};
    }
    if (S) {                                    /* P->act keeps h for the second phase */
        P->sh_act.exact = m->exact;
        qact_prepare(&P->sh_act, L->sh_down.type, sg, n, S);
        J[nj++] = (mm_job){&L->sh_down, NULL, &P->sh_act, so, d};
    }
    P->tier->mul_multi(J, nj);
    if (L->exp_down_b)
        for (int e = 0; e < E; e++) {
            if (eoff[e + 1] == eoff[e] || ready[e] != want) continue;
            const float *db = L->exp_down_b + (size_t)e * d;
            for (int p = eoff[e]; p < eoff[e + 1]; p++)
                for (int q = 0; q < d; q++) eo[(size_t)(p - base) * d + q] += db[q];
        }
    return 0;
}

/* The guesses in descending confidence: the lanes read them in that order, so the least likely
 * are the last begun and the likeliest to be cancelled unread when the layer's real selection
 * comes (es_acquire_begin sweeps the unstarted wrong guesses). Insertion sort: at most a few
 * rows' top-k. */
static void most_likely_first(int *guess, float *conf, int n) {
    for (int a = 1; a < n; a++)
        for (int b = a; b > 0 && conf[b - 1] < conf[b]; b--) {
            const float cf = conf[b];
            const int g = guess[b];
            conf[b] = conf[b - 1], guess[b] = guess[b - 1];
            conf[b - 1] = cf, guess[b - 1] = g;
        }
}

/* The next MoE layer's router applied to this layer's input h: each row's top-k guess of the
 * experts it will select there, read ahead on the I/O lanes while this layer computes (a
 * token's hidden state changes little from one layer to the next). Only for decode-sized
 * batches of a store that reads from disk. */
static void moe_read_ahead(model *m, const layer_w *L, const moe_opts *o, const float *h, int n, const fwd_row *rows) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    if (n > 4 || L->next_moe < 0 || !es_lookahead(m->es)) return;
    const layer_w *N = &m->layers[L->next_moe];
    const int E = c->n_experts, d = c->d_model;
    float *lg = fb(&P->ahead_lg, (size_t)n * E + (size_t)E);
    int *guess = ib(&P->guess, (size_t)E * 2);
    if (!lg || !guess) return;
    P->ahead_act.exact = m->exact;
    qact_prepare(&P->ahead_act, N->router.type, h, n, d);
    P->tier->mul_multi(&(mm_job){&N->router, NULL, &P->ahead_act, lg, E}, 1);
    if (N->router_b)
        for (int i = 0; i < n; i++)
            for (int e = 0; e < E; e++) lg[(size_t)i * E + e] += N->router_b[e];
    int *seen = guess + E, ng = 0;
    float *conf = lg + (size_t)n * E;   /* each guess's score (its best row's) */
    memset(seen, 0, sizeof(int) * (size_t)E);
    for (int i = 0; i < n; i++) {
        const int K = row_experts(c, &rows[i]);
        int s[512];
        float sc[512];
        if (K > 512) return;
        const float *li = lg + (size_t)i * E;
        if (E <= 512) select_experts(o, li, N->exp_bias, E, K, sc, s);   /* the selection's rule */
        else top_k_ids(li, E, K, s);
        /* the score the selection ranked by: sc where select_experts computed one (sigmoid, a
         * selection bias, groups), else the logit (softmax's order) */
        const int scored = E <= 512 && (o->gating == GATING_SIGMOID || N->exp_bias || o->n_group > 1);
        for (int j = 0; j < K; j++) {
            const float v = scored ? sc[s[j]] : li[s[j]];
            if (!seen[s[j]]) {
                seen[s[j]] = 1;
                guess[ng] = s[j];
                conf[ng++] = v;
            } else
                for (int g = 0; g < ng; g++)
                    if (guess[g] == s[j] && v > conf[g]) conf[g] = v;
        }
    }
    most_likely_first(guess, conf, ng);
    es_read_ahead(m->es, N->moe_row, guess, ng);
}

/* One layer's MoE scratch: pairs (row, selected expert) koff[i] .. koff[i + 1] - 1 of row i;
 * eg, eo hold one group of experts' pairs (moe_experts sizes them). */
typedef struct {
    int *koff, *sel, *ecnt, *eoff, *elist, *slot_of, *ready_k, *ready, *chosen;
    float *rl, *sc, *selw, *eg, *eu, *eo, *sg, *so;
    int NP, S;
} moe_bufs;

/* Each row's expert count, and the scratch sized for this batch. 0, or -1 out of memory. */
static int moe_scratch(model *m, const layer_w *L, int n, const fwd_row *rows, moe_bufs *B) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const int d = c->d_model, E = c->n_experts;
    const int S = B->S = L->sh_gate.rows > 0 ? c->d_shexp : 0;
    int *koff = B->koff = ib(&P->koff, (size_t)n + 1);
    if (!koff) return -1;
    koff[0] = 0;
    for (int i = 0; i < n; i++) koff[i + 1] = koff[i] + row_experts(c, &rows[i]);
    const int NP = B->NP = koff[n];
    B->rl = fb(&P->rlog, (size_t)n * E + (size_t)E);   /* the logits, then a row's selection scores */
    B->sel = ib(&P->sel, (size_t)NP);
    B->selw = fb(&P->selw, (size_t)NP);
    B->ecnt = ib(&P->ecnt, (size_t)E + 1);
    B->eoff = ib(&P->eoff, (size_t)E + 1);
    B->elist = ib(&P->elist, (size_t)NP * 2 + E); /* pairs by expert | slot of each pair | experts */
    B->sg = S ? fb(&P->fg, (size_t)n * S) : NULL, B->so = S ? fb(&P->shout, (size_t)n * d) : NULL;
    B->ready_k = ib(&P->ready, (size_t)E * 2);
    if (!B->rl || !B->sel || !B->selw || !B->ecnt || !B->eoff || !B->elist || !B->ready_k ||
        (S && (!B->sg || !B->so)))
        return -1;
    B->sc = B->rl + (size_t)n * E;
    B->slot_of = B->elist + NP, B->chosen = B->elist + 2 * NP, B->ready = B->ready_k + E;
    if (!P->eact) {
        P->eact = calloc((size_t)E * 3, sizeof(qact));   /* gathered, down inputs, views */
        P->ew = calloc((size_t)E, sizeof(expert_w));
        P->jobs = calloc((size_t)E * 2 + 2, sizeof(mm_job));   /* gate and up apart: two per expert */
        if (!P->eact || !P->ew || !P->jobs) return -1;
        for (int e = 0; e < 3 * E; e++) P->eact[e].exact = m->exact;
    }
    return 0;
}

/* moe_opts.shexp_gated (Qwen2-MoE, Qwen3.5): the shared expert's output so times sigmoid(h . w), per row. */
static void shared_gate(const float *w, const float *h, int n, int d, float *so) {
    for (int i = 0; i < n; i++) {
        double z = 0.0;
        for (int q = 0; q < d; q++) z += (double)h[(size_t)i * d + q] * w[q];
        const float g = 1.0f / (1.0f + expf(-(float)z));
        for (int q = 0; q < d; q++) so[(size_t)i * d + q] *= g;
    }
}

/* The group's per-expert gate/up and down inputs bigger than keep_rows rows are freed: each
 * expert keeps its own, so kept at their largest they added up to every expert's biggest prefill
 * share (2.7 MB over a 32 MB budget on 256 experts), where the budget counts one chunk's pairs
 * in flight and keep_rows rows per expert kept. */
static void trim_inputs(model *m, const int *list, int cnt) {
    struct model_priv *P = m->priv;
    const int E = m->c.n_experts;
    if (P->keep_rows <= 0) return;
    for (int k = 0; k < cnt; k++) {
        qact *g = &P->eact[list[k]], *dn = &P->eact[E + list[k]];
        if (g->cap > 64 && g->cap > (size_t)P->keep_rows * (size_t)m->c.d_model) qact_free(g);
        if (dn->cap > 64 && dn->cap > (size_t)P->keep_rows * (size_t)m->c.d_expert) qact_free(dn);
    }
}

/* One group of the chosen experts, list[0..cnt), whose pairs start at grouped pair `base`: the
 * ones in RAM at once, the misses on the I/O lanes while the resident ones (and, in the first
 * group, the shared expert) compute; then the rest; then they are released. While this group
 * computes, the lanes read the next group's misses (next[0..n_next)), or after the last group
 * the next layer's guess. 0 or -1. */
static int moe_group_run(model *m, const layer_w *L, const moe_opts *o, const float *h, int n, const fwd_row *rows,
                         moe_bufs *B, const int *list, int cnt, const int *next, int n_next, int first, int base) {
    struct model_priv *P = m->priv;
    const int E = m->c.n_experts, r = L->moe_row;
    int rc = es_acquire_begin(m->es, r, list, cnt, P->ew, B->ready_k), held = rc == 0;
    if (rc != 0) return rc;
    if (n_next > 0) es_read_ahead(m->es, r, next, n_next);
    else moe_read_ahead(m, L, o, h, n, rows);
    for (int e = 0; e < E; e++) B->ready[e] = -1;       /* not in this group: skipped */
    for (int k = 0; k < cnt; k++) B->ready[list[k]] = B->ready_k[k];
    rc = moe_phase(m, L, o, n, B->eoff, B->elist, B->ready, 1, first, base, B->eg, B->eu, B->eo, B->sg, B->so);
    int pending = 0;
    for (int k = 0; k < cnt; k++) pending |= !B->ready_k[k];
    if (pending) {
        double tw = mnow();
        int rf = es_acquire_finish(m->es, r, list, cnt, P->ew, B->ready_k, &m->perf.t_edisk);
        held = rf == 0;                     /* a failed finish holds nothing */
        m->perf.t_emm -= mnow() - tw;       /* the wait is disk time, not matmul time */
        if (rc == 0) rc = rf;
        if (rc == 0) rc = moe_phase(m, L, o, n, B->eoff, B->elist, B->ready, 0, 0, base, B->eg, B->eu, B->eo, B->sg, B->so);
    }
    for (int k = 0; held && k < cnt; k++) es_release(m->es, r, list[k]);
    trim_inputs(m, list, cnt);
    return rc;
}

static int expert_pairs(const moe_bufs *B, int e) { return B->eoff[e + 1] - B->eoff[e]; }

/* The end of the group of chosen experts that starts at k: at most G experts and at most cap
 * pairs (an expert with more pairs than cap forms a group alone). */
static int group_end(const moe_bufs *B, int k, int nsel, int G, int cap) {
    int j = k + 1, pairs = expert_pairs(B, B->chosen[k]);
    while (j < nsel && j - k < G && pairs + expert_pairs(B, B->chosen[j]) <= cap) pairs += expert_pairs(B, B->chosen[j++]);
    return j;
}

/* Groups of at most what the store may hold at once from disk (a long prompt's layer selects
 * nearly every expert) and at most a prefill chunk's pairs (the eg / eo buffers), each group's
 * misses read while the previous group computes, its outputs added to out. The groups' largest
 * pair count sizes eg / eo. 0 or -1. */
static int moe_experts(model *m, const layer_w *L, const moe_opts *o, const float *h, int n, const fwd_row *rows,
                       moe_bufs *B, int nsel, float *out) {
    struct model_priv *P = m->priv;
    const int G = es_hold_max(m->es) > 0 ? es_hold_max(m->es) : nsel;
    const int sub = P->part_rows > 0 && P->part_rows < n ? P->part_rows : n;
    const int cap = sub * (m->c.top_k > 0 ? m->c.top_k : 1);  /* a chunk's pairs at the default count */
    int maxp = 1;
    for (int k = 0, j; k < nsel; k = j) {
        j = group_end(B, k, nsel, G, cap);
        const int p = B->eoff[B->chosen[j - 1] + 1] - B->eoff[B->chosen[k]];
        if (p > maxp) maxp = p;
    }
    B->eg = fb(&P->eg, (size_t)maxp * m->c.d_expert), B->eo = fb(&P->eout, (size_t)maxp * m->c.d_model);
    const int split = o->act != MOE_ACT_SILU || L->exp_gate_b || L->exp_up_b;   /* moe_phase's two jobs */
    B->eu = split ? fb(&P->eu, (size_t)maxp * m->c.d_expert) : NULL;
    if (!B->eg || !B->eo || (split && !B->eu)) return -1;
    double t1 = mnow();
    int rc = 0;
    for (int k = 0, j; rc == 0 && k < nsel; k = j) {
        j = group_end(B, k, nsel, G, cap);
        const int jn = j < nsel ? group_end(B, j, nsel, G, cap) : j;
        const int lo = B->eoff[B->chosen[k]], hi = B->eoff[B->chosen[j - 1] + 1];
        rc = moe_group_run(m, L, o, h, n, rows, B, B->chosen + k, j - k, B->chosen + j, jn - j, k == 0, lo);
        combine_ctx C = {out, B->selw, B->eo, NULL, B->slot_of, B->koff, n, m->c.d_model, lo, hi, k == 0};
        if (rc == 0) par_rows(combine_chunk, &C, n);
    }
    m->perf.t_emm += mnow() - t1;
    if (rc == 0 && B->S) {                      /* the shared expert's output, after every routed one */
        if (o->shexp_gated && L->sh_gate_inp) shared_gate(L->sh_gate_inp, h, n, m->c.d_model, B->so);
        combine_ctx C = {out, B->selw, B->eo, B->so, B->slot_of, B->koff, n, m->c.d_model, 0, 0, nsel == 0};
        par_rows(combine_chunk, &C, n);
    }
    return rc;
}

/* MoE FFN of layer L for n rows of normalized input h; result (not yet added) in out. */
int moe_ffn(model *m, const layer_w *L, const float *h, int n, const fwd_row *rows, float *out, const moe_opts *o) {
    const int E = m->c.n_experts;
    moe_bufs B;
    if (moe_scratch(m, L, n, rows, &B) != 0) return -1;
    double t0 = mnow();
    moe_route(m, L, o, h, n, rows, B.koff, B.rl, B.sc, B.sel, B.selw);
    moe_group(B.sel, B.koff, n, E, B.ecnt, B.eoff, B.elist, B.slot_of);
    m->perf.t_dense += mnow() - t0;
    int nsel = 0;
    for (int e = 0; e < E; e++)
        if (B.eoff[e + 1] > B.eoff[e]) B.chosen[nsel++] = e;
    if (moe_experts(m, L, o, h, n, rows, &B, nsel, out) != 0) return -1;
    return 0;
}
