/* server.c — the mux serve loop. See server.h and native/README.md for the wire format.
 * Owns: setup and teardown of the slots, signals, the loop, one continuously batched decode
 * step, sampling a token and acting on it, the end of a turn (DONE, STOP, CANCEL), slot files
 * and the usage file. The other serve files: server_impl.h.
 *
 * Shape of the loop: read and run every complete command that is buffered (a SUBMIT
 * tokenizes, answers ACCEPT and prefills right away, serially), read again what arrived
 * meanwhile (a few rounds: prefill before decode, see wire_read_commands), then do one decode
 * step: ONE model_forward with one row per active request. stdin is polled without
 * blocking while requests are active and waited on when idle. */
#include "server_impl.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PREFILL_CHUNK 256           /* without a budget (tests that drive serve_mux directly) */

/* The only mutable globals: what the signal handlers set. */
static volatile sig_atomic_t sig_int, sig_term;
static void on_sigint(int s) { (void)s; sig_int = 1; }
static void on_sigterm(int s) { (void)s; sig_term = 1; }

int srv_terminating(void) { return sig_term != 0; }

/* ------------------------------------------------------------------ slots and files */

static void kv_path(const server *S, int slot, char *out, size_t cap) {
    snprintf(out, cap, "%s.%d", S->o->kv_base, slot);
}

static void save_usage(server *S) {
    if (!S->m->es || !S->o->usage_save) return;
    const int rc = es_usage_save(S->m->es);
    if (rc == ES_USAGE_BUSY)
        fprintf(stderr, "[USAGE] another engine is writing the usage file; this save skipped\n");
    else if (rc != 0)
        fprintf(stderr, "[USAGE] could not write the usage file\n");
}

static void save_slot(server *S, int slot) {
    if (!S->o->kvsave) return;
    char path[1300];
    kv_path(S, slot, path, sizeof path);
    const uint64_t fp = model_fingerprint_k(S->m, S->req[slot].experts);
    if (kv_save(&S->kv, slot, path, fp) != 0)
        fprintf(stderr, "[KV] could not save slot %d to %s\n", slot, path);
    if (!model_state_bytes(S->m)) return;
    strcat(path, ".rs");                /* the recurrent state and its checkpoints beside it */
    if (model_state_save(S->m, &S->kv, slot, path, fp) != 0)
        fprintf(stderr, "[KV] could not save slot %d's recurrent state to %s\n", slot, path);
}

static void load_slots(server *S) {
    for (int s = 0; S->o->kvsave && s < S->o->n_slots; s++) {
        char path[1300];
        kv_path(S, s, path, sizeof path);
        if (kv_load(&S->kv, s, path, S->m->fingerprint) != 0 || S->kv.slots[s].n_pos == 0) continue;
        int n_ckpt = 0;
        if (model_state_bytes(S->m)) {
            strcat(path, ".rs");
            if (model_state_load(S->m, &S->kv, s, path, S->m->fingerprint) == 0)
                model_slot_state_bytes(S->m, s, &n_ckpt);
        }
        fprintf(stderr, "[KV] slot %d resumed from %s: %d tokens (%s, %d state checkpoint(s))\n", s, path,
                S->kv.slots[s].n_pos, model_state_bytes(S->m) ? "recurrent state" : "no re-prefill", n_ckpt);
    }
}

int srv_find_active(const server *S, uint64_t id) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active && S->req[s].id == id) return s;
    return -1;
}

int srv_any_active(const server *S) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active) return 1;
    return 0;
}

/* ------------------------------------------------------------------ turn end */

/* The slot is free again; its history stays for the next turn's prefix reuse, and a hybrid's
 * state where the turn ended is kept as a checkpoint (a next turn that edits this one's end
 * resumes from an earlier turn's). */
static void release_request(server *S, request *r) {
    if (model_checkpoint(S->m, &S->kv, r->slot) != 0)
        fprintf(stderr, "[KV] out of memory for slot %d's state checkpoint\n", r->slot);
    r->active = 0;
    gram_free(r->g);
    r->g = NULL;
    save_slot(S, r->slot);
}

/* Ends a turn the normal way: held UTF-8 bytes, telemetry block, usage, REPIN, DONE. */
void srv_finish(server *S, request *r, int length_limited) {
    /* An incomplete UTF-8 sequence still held here (STOP or end-of-generation right after
     * a partial character) is dropped: a DATA frame carries exactly one token, and DONE's
     * count must match the frames (the length-limited end folds it into the last frame). */
    char tail[16];
    (void)utf8s_flush(&r->u8, tail, (int)sizeof tail);
    const double t_end = now_s(), wall = t_end - r->t_decode0;
    rep_turn_end(S, r, t_end);
    spec_turn_end(S, r);
    save_usage(S);
    rep_repin(S);
    double tok_s = wall > 0 ? r->emitted / wall : 0.0;
    double hit = S->m->es ? es_hit_pct_take(S->m->es) : 100.0;
    out_line("DONE %llu STAT %d %.2f %.1f %.2f %d %d", (unsigned long long)r->id, r->emitted,
             tok_s, hit, rss_peak_gb(), r->n_prompt, length_limited);
    release_request(S, r);
    fprintf(stderr, "[API] done id=%llu slot=%d emitted=%d prompt=%d %.2f tok/s%s\n",
            (unsigned long long)r->id, r->slot, r->emitted, r->n_prompt, tok_s,
            length_limited ? " (length)" : "");
}

static void finish_all(server *S) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active) srv_finish(S, &S->req[s], 0);
}

void srv_stop_cancel(server *S, uint64_t id, int cancel) {
    int s = srv_find_active(S, id);
    if (s < 0) {
        out_line("ERROR %llu NOT_FOUND", (unsigned long long)id);
        return;
    }
    request *r = &S->req[s];
    if (!cancel) {
        srv_finish(S, r, 0);
        return;
    }
    release_request(S, r);
    out_line("ERROR %llu CANCELLED", (unsigned long long)id);
    fprintf(stderr, "[API] cancelled id=%llu slot=%d after %d tokens\n", (unsigned long long)id, s,
            r->emitted);
}

/* ------------------------------------------------------------------ tokens */

/* Samples from r->logits (within a grammar's mask) and acts on the token (srv_emit_token). */
void srv_take_token(server *S, request *r) {
    r->allow = NULL;
    if (r->g && !(r->allow = gram_mask(r->g, r->max_tokens - r->emitted))) {
        fprintf(stderr, "[API] out of memory for the grammar mask of id=%llu\n", (unsigned long long)r->id);
        srv_finish(S, r, 0);
        return;
    }
    int tok = sample_token_k(r->logits, S->vocab, r->temperature, r->top_p, r->top_k, &r->rng, S->scratch, r->allow);
    if (tok < 0) {                       /* the grammar allows nothing: cut, as by the budget */
        srv_finish(S, r, !gram_accepting(r->g));
        return;
    }
    srv_emit_token(S, r, tok);
}

void srv_emit_token(server *S, request *r, int tok) {
    if (tok_is_eog(S->tok, tok)) {
        srv_finish(S, r, 0);
        return;
    }
    if (r->g && gram_advance(r->g, tok) != 0) {   /* cannot happen: tok was in the mask */
        fprintf(stderr, "[API] token %d left the grammar of id=%llu; ending it\n", tok, (unsigned long long)r->id);
        srv_finish(S, r, 1);
        return;
    }
    r->emitted++;
    spec_recorded(S, tok);
    /* A grammar's output is complete in a final state, and complete (not cut) when the budget
     * ends in an accepting one. */
    int complete = r->g && (gram_final(r->g) || (r->emitted >= r->max_tokens && gram_accepting(r->g)));
    int last = complete || r->emitted >= r->max_tokens;
    rep_token(S, r, tok, last);
    if (last) srv_finish(S, r, !complete);
    else r->next_tok = tok;
}

/* The only active request when speculative decoding is on, else NULL. */
static request *solo_request(server *S) {
    request *one = NULL;
    for (int s = 0; S->o->spec_draft > 0 && s < S->o->n_slots; s++)
        if (S->req[s].active) {
            if (one) return NULL;
            one = &S->req[s];
        }
    return one;
}

/* One continuous-batching step: one row per active request (or the only one's verify batch of
 * drafted tokens, server_spec.c). */
static void decode_step(server *S) {
    request *solo = solo_request(S);
    if (solo && spec_decode(S, solo)) return;
    es_io_stats io0 = {0}, io1 = {0};
    if (solo && S->m->es) es_io(S->m->es, &io0);
    const double t0 = now_s();
    int n = 0;
    for (int s = 0; s < S->o->n_slots; s++) {
        request *r = &S->req[s];
        if (!r->active) continue;
        int pos = S->kv.slots[s].n_pos;
        const int kr = srv_kv_grow(S, s, pos + 1);
        if (kr != 0) {
            fprintf(stderr, "[API] %s growing KV slot %d; ending id=%llu\n",
                    kr == KV_OVER_BUDGET ? "KV share of the memory budget full" : "out of memory", s,
                    (unsigned long long)r->id);
            srv_finish(S, r, kr == KV_OVER_BUDGET);     /* the budget ends it as a length limit would */
            continue;
        }
        S->fwd[n++] = (fwd_row){ .slot = s, .pos = pos, .token = r->next_tok, .logits = r->logits,
                                 .route_counts = r->route, .n_experts = r->experts,
                                 .no_heat = !r->heat, .picks = r->routes == 2 && S->rows ? r->picks : NULL };
    }
    if (n == 0) return;
    if (model_forward(S->m, &S->kv, S->fwd, n) != 0) {
        fprintf(stderr, "[API] forward failed; ending %d active request(s)\n", n);
        for (int i = 0; i < n; i++) srv_finish(S, &S->req[S->fwd[i].slot], 0);
        return;
    }
    /* Each forwarded token's selections go out before the DATA of the token it predicts. */
    for (int i = 0; i < n; i++)
        if (S->fwd[i].picks) rep_routestep(S, &S->req[S->fwd[i].slot]);
    if (solo && S->m->es) es_io(S->m->es, &io1);
    if (solo) spec_plain_done(S, solo, now_s() - t0, io1.disk_bytes - io0.disk_bytes);
    /* Copy the slots first: take_token may finish a request, but never reuses S->fwd. */
    for (int i = 0; i < n; i++) srv_take_token(S, &S->req[S->fwd[i].slot]);
    if (solo) spec_guess_check(S, solo);
}

/* ------------------------------------------------------------------ setup & loop */

static void server_free(server *S) {
    for (int s = 0; S->req && s < S->o->n_slots; s++) {
        free(S->req[s].route);
        free(S->req[s].picks);
        free(S->req[s].logits);
        gram_free(S->req[s].g);
    }
    free(S->req);
    gram_vocab_free(S->gv);
    free(S->scratch);
    free(S->fwd);
    free(S->ids);
    free(S->emap);
    free(S->hits);
    free(S->hex);
    free(S->in);
    free(S->line);
    spec_free(S);
    if (S->m) budget_lend(NULL, S->m, &S->kv);  /* the store must not read a freed cache */
    kv_free(&S->kv);
}

/* The slots, the KV cache and the buffers. 0 ok, -1 out of memory (S half built: free it). */
static int server_init(server *S, model *m, const serve_opts *o) {
    *S = (server){ .m = m, .o = o, .tok = m->tok, .vocab = m->c.vocab, .reading = 1,
                   .rows = m->es ? es_rows(m->es) : 0, .cols = m->es ? es_cols(m->es) : 0,
                   .chunk = o->budget ? o->budget->rows : PREFILL_CHUNK };
    int nfwd = o->n_slots > S->chunk ? o->n_slots : S->chunk;
    if (nfwd < SPEC_MAX + 1) nfwd = SPEC_MAX + 1;     /* a verify batch */
    size_t ncells = (size_t)S->rows * S->cols;
    int ok = model_kv_init(m, &S->kv, o->n_slots, o->ctx) == 0 && kv_set_f16(&S->kv, o->kv_f16) == 0;
    if (ok && o->budget) kv_set_budget(&S->kv, o->budget->kv);
    if (ok && o->budget) budget_lend(o->budget, m, &S->kv);
    S->req = calloc((size_t)o->n_slots, sizeof *S->req);
    S->scratch = malloc((size_t)S->vocab * 8);
    S->fwd = calloc((size_t)nfwd, sizeof *S->fwd);
    S->ids = malloc(((size_t)o->ctx + 1) * sizeof *S->ids);
    S->emap = malloc(ncells + 1);
    S->hits = malloc(ncells / 8 + 2);
    S->hex = malloc(2 * ncells + 3);
    S->line = malloc(MAX_LINE + 1);
    S->gv = gram_vocab_build(S->tok, S->vocab);
    ok = ok && S->gv && S->req && S->scratch && S->fwd && S->ids && S->emap && S->hits && S->hex && S->line;
    for (int s = 0; ok && s < o->n_slots; s++) {
        S->req[s].route = calloc(ncells + 1, sizeof *S->req[s].route);
        S->req[s].picks = calloc(ncells + 1, sizeof *S->req[s].picks);   /* experts <= cols */
        S->req[s].logits = malloc((size_t)S->vocab * sizeof(float));
        S->req[s].experts = m->c.top_k;     /* what a loaded slot file's rows were computed with */
        ok = S->req[s].route && S->req[s].picks && S->req[s].logits;
    }
    return ok ? 0 : -1;
}

static void install_signals(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_sigint;          /* no SA_RESTART: poll/read return EINTR */
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);
}

/* READY and the opening block: STAT, HWINFO, TIERS, EMAP, MODEL. */
static void announce(server *S) {
    if (S->m->es) {                     /* start the windows clean */
        es_hits_take(S->m->es, S->hits);
        es_hit_pct_take(S->m->es);
    }
    out_line("\x01\x01READY\x01\x01");
    out_line("STAT 0 0.00 0.0 %.2f", rss_peak_gb());
    rep_hwinfo();
    rep_tiers(S);
    rep_emap(S);
    rep_model(S);
    fprintf(stderr, "[API] mux ready: %d slot(s), CTX=%d, model %s\n", S->o->n_slots, S->o->ctx, S->m->name);
}

/* Until EOF with nothing active, SIGTERM, or a closed stdout. */
static void serve_loop(server *S) {
    for (;;) {
        if (sig_term) {
            finish_all(S);
            break;
        }
        if (out_closed()) {
            /* the bridge is gone (killed, crashed): decoding on would only burn the CPU */
            fprintf(stderr, "[API] stdout closed: stopping active requests and exiting\n");
            finish_all(S);
            break;
        }
        if (sig_int) {
            sig_int = 0;
            fprintf(stderr, "[API] SIGINT: stopping active requests\n");
            finish_all(S);
        }
        int busy = srv_any_active(S);
        if (!S->reading && !busy) break;
        if (S->reading && wire_read_commands(S, busy) < 0) continue;
        if (srv_any_active(S)) decode_step(S);
    }
}

int serve_mux(model *m, const serve_opts *o) {
    server S_, *S = &S_;
    if (server_init(S, m, o) != 0) {
        fprintf(stderr, "colibri-engine: out of memory setting up %d slots\n", o->n_slots);
        server_free(S);
        return 1;
    }
    if (spec_init(S) != 0) {
        server_free(S);
        return 2;
    }
    load_slots(S);
    install_signals();
    announce(S);
    serve_loop(S);
    save_usage(S);
    fprintf(stderr, "[API] exit\n");
    server_free(S);
    return 0;
}
