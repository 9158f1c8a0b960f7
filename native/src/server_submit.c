/* server_submit.c — a SUBMIT after its header and payload are read (server_wire.c).
 * Owns: admission in the order of mux-protocol.md §5.1 (slot, payload, experts, SLOT_BUSY,
 * DUPLICATE_ID, grammar), tokenizing against CTX and the KV share, per-slot prefix reuse,
 * the request's start (ACCEPT), serial chunked prefill, and the first sampled token. */
#include "server_impl.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int prefill_tail(model *m, kv_cache *kv, int s, const int *ids, int from, int n,
                 float *logits, uint32_t *route_counts, int n_experts, int no_heat, fwd_row *rows,
                 int chunk) {
    for (int p = from; p < n; p += chunk) {
        int cnt = n - p < chunk ? n - p : chunk;
        if (kv_reserve(kv, s, p + cnt) != 0) return -1;
        for (int i = 0; i < cnt; i++) {
            rows[i].slot = s;
            rows[i].pos = p + i;
            rows[i].token = ids[p + i];
            rows[i].logits = p + i == n - 1 ? logits : NULL;
            rows[i].route_counts = route_counts;
            rows[i].n_experts = n_experts;
            rows[i].no_heat = no_heat;
            rows[i].picks = NULL;           /* per-token routing is for generated tokens only */
        }
        if (model_forward(m, kv, rows, cnt) != 0) return -1;
    }
    return 0;
}

int srv_kv_grow(server *S, int s, int n_pos) {
    int rc = kv_reserve(&S->kv, s, n_pos);
    for (int o = 0; rc == KV_OVER_BUDGET && o < S->o->n_slots; o++)
        if (o != s && !S->req[o].active && S->kv.slots[o].cap > 0) {
            fprintf(stderr, "[KV] slot %d's history freed for slot %d (KV share full)\n", o, s);
            kv_release(&S->kv, o);
            model_forget(S->m, o);      /* its state checkpoints stood on that history */
            rc = kv_reserve(&S->kv, s, n_pos);
        }
    return rc;
}

/* Positions slot s can get within the KV share once the idle slots' histories are freed. */
static int kv_room_idle(server *S, int s) {
    size_t held = 0;
    for (int o = 0; o < S->o->n_slots; o++)
        if (o != s && S->req[o].active) held += (size_t)S->kv.slots[o].cap * kv_pos_bytes(&S->kv);
    if (!S->kv.budget) return S->o->ctx;
    const size_t fit = S->kv.budget > held ? (S->kv.budget - held) / kv_pos_bytes(&S->kv) : 0;
    return fit < (size_t)S->o->ctx ? (int)fit : S->o->ctx;
}

/* The request's grammar=1 DFA, or NULL after answering ERROR <id> BAD_REQUEST (the stream is
 * in sync: the bytes were consumed). */
static gram *submit_grammar(server *S, unsigned long long id, const uint8_t *bytes, size_t n) {
    char err[160] = "out of memory";
    gram *g = S->gv ? gram_parse(bytes, n, S->gv, err, sizeof err) : NULL;
    if (!g) {
        fprintf(stderr, "[API] grammar of id=%llu refused: %s\n", id, err);
        out_line("ERROR %llu BAD_REQUEST", id);
    }
    return g;
}

/* Step: admission. 0 and *g (the grammar, or NULL without grammar=1), or -1 after answering. */
static int submit_admit(server *S, const submit_hdr *h, const char *payload, gram **g) {
    unsigned long long id = (unsigned long long)h->id;
    *g = NULL;
    if (h->slot >= (uint64_t)S->o->n_slots || memchr(payload, 0, (size_t)h->bytes) ||
        (h->have_experts && (h->experts < 1 || h->experts > (uint64_t)S->m->c.n_experts))) {
        out_line("ERROR %llu BAD_REQUEST", id);
        return -1;
    }
    if (S->req[h->slot].active) {
        out_line("ERROR %llu SLOT_BUSY", id);
        return -1;
    }
    if (srv_find_active(S, h->id) >= 0) {
        out_line("ERROR %llu DUPLICATE_ID", id);
        return -1;
    }
    /* Without grammar=1 the grammar bytes are accepted and ignored (colibri: drafts only). */
    if (h->grammar && !(*g = submit_grammar(S, id, (const uint8_t *)payload + h->bytes, (size_t)h->gbytes)))
        return -1;
    return 0;
}

/* Step: the prompt's tokens into S->ids. Their count, or -1 after answering (too long for CTX
 * or for the KV share with the other slots' turns in it, empty, tokenizer out of memory). */
static int submit_tokenize(server *S, const submit_hdr *h, const char *payload, int slot) {
    unsigned long long id = (unsigned long long)h->id;
    const int ctx = S->o->ctx;
    int n = tok_encode(S->tok, payload, (size_t)h->bytes, S->ids, ctx - 1);
    if (n < 0) {
        fprintf(stderr, "[API] tokenizer out of memory for id=%llu\n", id);
        out_line("ERROR %llu BAD_REQUEST", id);
        return -1;
    }
    if (n > ctx - 1) n = ctx - 1;
    if (n == 0) {
        out_line("ERROR %llu EMPTY_PROMPT", id);
        return -1;
    }
    if (n > ctx - 2) {
        out_line("ERROR %llu CONTEXT_EXCEEDED %d %d", id, n, ctx - 2);
        fprintf(stderr, "[API] prompt of at least %d tokens does not fit CTX=%d (limit %d); "
                        "raise CTX or shorten the conversation\n", n, ctx, ctx - 2);
        return -1;
    }
    const int kv_fit = kv_room_idle(S, slot);
    if (n > kv_fit - 2) {
        out_line("ERROR %llu CONTEXT_EXCEEDED %d %d", id, n, kv_fit > 2 ? kv_fit - 2 : 0);
        fprintf(stderr, "[API] prompt of %d tokens does not fit the KV share of the memory budget now "
                        "(%d positions free for slot %d); raise the budget or lower KV_SLOTS / CTX\n", n, kv_fit, slot);
        return -1;
    }
    return n;
}

/* Step: the positions of the slot's history this prompt reuses (the rest is prefilled). */
static int submit_reuse(server *S, int slot, int n, int experts) {
    /* K/V rows (and states) computed with another expert count are not this turn's: recompute */
    if (experts != S->req[slot].experts) model_forget(S->m, slot);
    int keep = experts == S->req[slot].experts ? kv_common_prefix(&S->kv, slot, S->ids, n) : 0;
    if (keep >= n) keep = n - 1;            /* identical prompt: re-forward the last token */
    keep = kv_rewind(&S->kv, slot, keep);   /* sliding windows: what their kept rows allow */
    return model_resume(S->m, &S->kv, slot, keep);   /* a hybrid's recurrent state */
}

/* Step: the request record of an admitted turn, and ACCEPT. */
static request *submit_start(server *S, const submit_hdr *h, gram *g, int n, int keep, int experts) {
    request *r = &S->req[h->slot];
    uint64_t room = (uint64_t)(S->o->ctx - n - 1);
    *r = (request){ .active = 1, .id = h->id, .slot = (int)h->slot, .n_prompt = n, .reused = keep,
                    .max_tokens = (int)(h->max_tokens < room ? h->max_tokens : room),
                    .temperature = (float)h->temperature, .top_p = (float)h->top_p,
                    .logprobs = h->logprobs, .lptext = h->lptext, .top_k = (int)h->top_k,
                    .experts = experts, .routes = h->routes, .heat = h->heat, .g = g,
                    .route = r->route, .picks = r->picks, .logits = r->logits };
    rng_seed(&r->rng, h->have_seed ? h->seed : h->id);
    spec_start(S, r);
    utf8s_init(&r->u8);
    memset(r->route, 0, (size_t)S->rows * S->cols * sizeof *r->route);
    r->t_accept = now_s();
    r->perf0 = S->m->perf;
    es_io(S->m->es, &r->io0);
    out_line("ACCEPT %llu %d reused=%d", (unsigned long long)h->id, n, keep);
    fprintf(stderr, "[API] KV slot %d prefix %d/%d token, prefill %d\n", r->slot, keep, n, n - keep);
    return r;
}

/* Where a hybrid's prefill part starting at p stops: the next multiple of `every` (0: none),
 * at most the prompt's last-but-one position, then its end. */
static int part_end(int p, int n, int every) {
    const int e = every > 0 ? (p / every + 1) * every : n;
    if (e < n - 1) return e;
    return p < n - 1 ? n - 1 : n;
}

/* Forwards the prompt's positions [from, n). A hybrid's in parts, its state checkpointed after
 * each but the last: every ckpt_every positions of a long prompt, and before the prompt's last
 * token, where the same prompt sent again (a regenerated reply) resumes; the turn's end keeps
 * the last. 0 ok, -1 as prefill_tail. */
static int prefill_parts(server *S, request *r, int from) {
    const int n = r->n_prompt, hybrid = model_state_bytes(S->m) != 0;
    for (int p = from, e; p < n; p = e) {
        e = hybrid ? part_end(p, n, S->o->ckpt_every) : n;
        if (prefill_tail(S->m, &S->kv, r->slot, S->ids, p, e, r->logits, r->route, r->experts, !r->heat,
                         S->fwd, S->chunk) != 0)
            return -1;
        if (e < n && model_checkpoint(S->m, &S->kv, r->slot) != 0) return -1;
    }
    return 0;
}

/* Step: prefill the prompt past the reused prefix. 0 ok; -1 after ending the turn. */
static int submit_prefill(server *S, request *r) {
    const int slot = r->slot, keep = r->reused, n = r->n_prompt;
    kv_truncate(&S->kv, slot, keep);
    if (srv_kv_grow(S, slot, n) != 0 || prefill_parts(S, r, keep) != 0) {
        fprintf(stderr, "[API] prefill failed for id=%llu (out of memory or expert read error)\n",
                (unsigned long long)r->id);
        kv_truncate(&S->kv, slot, keep);
        r->t_decode0 = now_s();
        srv_finish(S, r, 0);
        return -1;
    }
    /* the windows where this prompt ends: the next stateless turn repeats the prompt and may
     * diverge right after it, past rows the windows will have dropped by then */
    kv_checkpoint(&S->kv, slot);
    r->t_decode0 = now_s();
    return 0;
}

/* SUBMIT after its header and payload: admit → tokenize → reuse a prefix → start → prefill →
 * the first token. */
void cmd_submit(server *S, const submit_hdr *h, const char *payload) {
    gram *g;
    if (submit_admit(S, h, payload, &g) != 0) return;
    const int slot = (int)h->slot;
    const int n = submit_tokenize(S, h, payload, slot);
    if (n < 0) {
        gram_free(g);
        return;
    }
    const int experts = h->have_experts ? (int)h->experts : S->m->c.top_k;
    const int keep = submit_reuse(S, slot, n, experts);
    request *r = submit_start(S, h, g, n, keep, experts);
    if (submit_prefill(S, r) != 0) return;
    if (r->max_tokens == 0) {              /* max_tokens=0 with logprobs: prompt only */
        srv_finish(S, r, 1);
        return;
    }
    srv_take_token(S, r);
}
