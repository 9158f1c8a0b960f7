/* mtp.c — drafting with a file's MTP block (c.n_mtp; the architecture's mtp_forward).
 * Owns: per slot, the trunk's normalized last hidden state of each position (kept by every
 * forward of the trunk: mtp_keep), how far the block's own K/V rows stand for the slot's
 * history, catching them up, and the chain of guesses.
 *
 * The block's row at position i reads h_i (the trunk's hidden state after token i) and token
 * i + 1, and writes its K/V at i in the cache's last layer, as llama.cpp's MTP graph: its
 * attention sees the block's rows of positions 0 .. i. Rows 0 .. m_end - 1 stand for the
 * history; a trunk forward that rewrites positions from p (a verify batch cut back, a new turn's
 * prefix) takes back the rows that read a token at p or after. A guess past the history writes
 * rows there too; they are computed again from the trunk's states before anything reads them.
 * Drafts never change what the engine emits (the verify batch decides), only how many it keeps.
 * The block's expert picks add nothing to the store's counts (fwd_row.no_heat): under a budget
 * its experts are the first to go, so a paused draft head does not keep the trunk's out. */
#include <stdlib.h>
#include <string.h>

#include "arch.h"
#include "sampler.h"

static mtp_slot *slot_of(model *m, int s, int n_slots) {
    struct model_priv *P = m->priv;
    if (n_slots > P->n_mtp_slots) {
        mtp_slot *t = realloc(P->mtp_slots, sizeof *t * (size_t)n_slots);
        if (!t) return NULL;
        for (int i = P->n_mtp_slots; i < n_slots; i++) t[i] = (mtp_slot){0};
        P->mtp_slots = t, P->n_mtp_slots = n_slots;
    }
    return &P->mtp_slots[s];
}

void mtp_slots_free(struct model_priv *P) {
    for (int i = 0; i < P->n_mtp_slots; i++) free(P->mtp_slots[i].h);
    free(P->mtp_slots);
    free(P->mtp_draft.p);
    P->mtp_slots = NULL, P->n_mtp_slots = 0, P->mtp_draft = (fbuf){0};
}

/* Rows first .. first + n - 1 of a slot (consecutive positions from p) were forwarded by the
 * trunk: their hidden states kept, the block's rows that read a rewritten token taken back. */
static int keep_rows(fwd *F, int first, int n) {
    const int d = F->m->c.d_model, s = F->rows[first].slot, p = F->rows[first].pos;
    mtp_slot *t = slot_of(F->m, s, F->kv->n_slots);
    if (!t) return -1;
    if (p + n > t->cap) {
        int cap = t->cap ? t->cap : 64;
        while (cap < p + n) cap *= 2;
        float *h = realloc(t->h, (size_t)cap * (size_t)d * sizeof(float));
        if (!h) return -1;
        t->h = h, t->cap = cap;
    }
    if (p < t->h_from || p > t->h_end) t->h_from = p;      /* what lies before p is not the slot's */
    t->h_end = p + n;
    memcpy(t->h + (size_t)p * d, F->h + (size_t)first * d, sizeof(float) * (size_t)n * (size_t)d);
    if (p < t->m_end || (p == t->m_end && p > 0 && F->rows[first].token != t->m_next))
        t->m_end = p > 0 ? p - 1 : 0;
    return 0;
}

int mtp_keep(fwd *F) {
    for (int i = 0, j; i < F->n; i = j) {
        for (j = i + 1; j < F->n && F->rows[j].slot == F->rows[i].slot; j++) {}
        if (keep_rows(F, i, j - i) != 0) return -1;
    }
    return 0;
}

void mtp_cut(model *m, int s, int keep) {
    struct model_priv *P = m->priv;
    if (s < 0 || s >= P->n_mtp_slots) return;
    mtp_slot *t = &P->mtp_slots[s];
    if (t->h_end > keep) t->h_end = keep;
    if (t->m_end > keep - 1) t->m_end = keep > 0 ? keep - 1 : 0;
}

/* The block over rows (slot s) at positions from p: token of each = the one after its position,
 * hin its input states; logits of each row (or the last only when all == 0) and the last row's
 * output state into hout. */
static int run_rows(model *m, kv_cache *kv, int s, int p, const int *tok, int n, const float *hin, float *logits,
                    int all, float *hout) {
    struct model_priv *P = m->priv;
    const size_t d = (size_t)m->c.d_model, V = (size_t)m->c.vocab;
    fwd_row *rows = calloc((size_t)n, sizeof *rows);
    float *ho = malloc((size_t)n * d * sizeof(float));
    int rc = -1;
    if (rows && ho) {
        for (int i = 0; i < n; i++)
            rows[i] = (fwd_row){.slot = s, .pos = p + i, .token = tok[i], .no_heat = 1,
                                .logits = all ? logits + (size_t)i * V : i == n - 1 ? logits : NULL};
        fwd F;
        if (fwd_begin(&F, m, kv, rows, n) == 0 && P->ops->mtp_forward(&F, hin, ho) == 0) {
            memcpy(hout, ho + (size_t)(n - 1) * d, d * sizeof(float));
            rc = 0;
        }
    }
    free(rows);
    free(ho);
    return rc;
}

/* The block's rows m_end .. n_pos - 1 of slot s (the last reads `next`). 0 done, 1 the kept
 * states do not reach back to m_end, -1 failure. */
static int catch_up(model *m, kv_cache *kv, int s, int next, float *logits, int all, float *hout) {
    mtp_slot *t = slot_of(m, s, kv->n_slots);
    const int n_pos = kv->slots[s].n_pos;
    if (!t) return -1;
    /* the last row again in any case: it reads `next`, and its output starts the chain */
    const int from = all ? 0 : t->m_end < n_pos - 1 ? t->m_end : n_pos - 1, n = n_pos - from;
    if (n_pos <= 0 || from < t->h_from || t->h_end < n_pos) return 1;
    int *tok = malloc((size_t)n * sizeof *tok);
    if (!tok) return -1;
    for (int i = 0; i < n; i++) tok[i] = from + i + 1 < n_pos ? kv->slots[s].tokens[from + i + 1] : next;
    const int rc = run_rows(m, kv, s, from, tok, n, t->h + (size_t)from * m->c.d_model, logits, all, hout);
    free(tok);
    if (rc != 0) return -1;
    t->m_end = n_pos, t->m_next = next;
    return 0;
}

int model_mtp_draft(model *m, kv_cache *kv, int s, int next, int n, int *out) {
    if (!m->c.n_mtp || n <= 0 || s < 0 || s >= kv->n_slots) return 0;
    const size_t d = (size_t)m->c.d_model, V = (size_t)m->c.vocab;
    float *lg = fb(&m->priv->mtp_draft, V + 2 * d), *h = lg ? lg + V : NULL;
    int made = -1;
    if (lg) {
        const int rc = catch_up(m, kv, s, next, lg, 0, h);
        made = rc < 0 ? -1 : 0;
        for (int k = 0; rc == 0; k++) {
            out[k] = sample_token(lg, m->c.vocab, 0.0f, 1.0f, NULL, NULL, NULL);   /* greedy */
            made = k + 1;
            if (made == n) break;
            memcpy(h + d, h, d * sizeof(float));    /* the guess's input: the block's own output */
            if (run_rows(m, kv, s, kv->slots[s].n_pos + k, &out[k], 1, h + d, lg, 0, h) != 0) {
                made = -1;
                break;
            }
        }
    }
    return made;
}

int model_mtp_logits(model *m, kv_cache *kv, int s, int next, float *logits) {
    if (!m->c.n_mtp) return -1;
    float *h = malloc((size_t)m->c.d_model * sizeof(float));
    const int rc = h ? catch_up(m, kv, s, next, logits, 1, h) : -1;
    free(h);
    return rc == 0 ? 0 : -1;
}
