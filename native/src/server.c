/* server.c — the mux serve loop. See server.h and native/README.md for the wire format.
 *
 * Shape of the loop: read and run every complete command that is buffered (a SUBMIT
 * tokenizes, answers ACCEPT and prefills right away, serially), read again what arrived
 * meanwhile (a few rounds: prefill before decode, see read_commands), then do one decode
 * step: ONE model_forward with one row per active request. stdin is polled without
 * blocking while requests are active and waited on when idle. */
#include "server.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "grammar.h"
#include "sampler.h"
#include "telemetry.h"
#include "utf8stream.h"

#define MAX_PAYLOAD   (16u << 20)   /* SUBMIT bytes: 16 MiB accepted, one more refused */
#define MAX_GRAMMAR   (1u << 20)    /* gbytes */
#define MAX_LINE      (1 << 20)     /* longer command lines are refused and skipped */
#define MAX_LOGPROBS  32
#define PREFILL_CHUNK 256           /* without a budget (tests that drive serve_mux directly) */
#define HITS_EVERY    6             /* a HITS line every 6 decoded tokens, engine-wide */
#define LIVE_EVERY_S  1.0           /* while decoding, HITS and TIERS + EMAP at least this often: a
                                     * big model under a budget decodes ~1 token/s, and a turn-end
                                     * block alone left the atlas still for minutes */
#define TOPK_N        5
#define INPUT_ROUNDS  4             /* reads of newly arrived commands before a decode step */

/* The only mutable globals: what the signal handlers set. */
static volatile sig_atomic_t sig_int, sig_term;
static void on_sigint(int s) { (void)s; sig_int = 1; }
static void on_sigterm(int s) { (void)s; sig_term = 1; }

typedef struct {
    int active;
    uint64_t id;
    int slot;
    int n_prompt, reused;
    int max_tokens;             /* after the silent clamp to the room left */
    int emitted;
    float temperature, top_p;
    int logprobs;               /* k of logprobs=k, 0 = off */
    int lptext;                 /* lptext=1: the logprobs tail also carries the tokens' bytes (hex) */
    int top_k;                  /* top_k=N: sample among the N most likely tokens only; 0 = all */
    int experts;                /* routed experts per token of this turn (experts=N, else the
                                 * model's top_k); kept after the turn: the count that computed
                                 * the slot's K/V history, which a turn with another count
                                 * does not reuse */
    int routes;                 /* routes=1: a ROUTES line after ENTROPY; routes=2: also a
                                 * ROUTESTEP line per generated token forwarded */
    int heat;                   /* heat=0: selections not added to the cumulative counts */
    gram *g;                    /* grammar=1: the DFA the output must stay in, else NULL */
    const uint64_t *allow;      /* the mask the last token was sampled under (NULL: none) */
    rng_state rng;
    utf8s u8;
    int next_tok;               /* sampled and sent, to be forwarded by the next step */
    uint32_t *route;            /* n_rows * n_cols routing counts of this turn */
    uint16_t *picks;            /* n_rows * experts: the last forwarded token's selections */
    float *logits;              /* vocab floats */
    double t_accept, t_decode0;
    perf_counters perf0;
    es_io_stats io0;            /* the expert store's I/O counters at ACCEPT */
} request;

typedef struct {
    model *m;
    const serve_opts *o;
    const tokenizer *tok;
    kv_cache kv;
    request *req;               /* one per slot: a slot runs at most one request */
    int vocab, rows, cols;
    void *scratch;              /* sampler scratch */
    gram_vocab *gv;             /* the vocabulary's byte trie for grammar requests */
    fwd_row *fwd;               /* max(chunk, n_slots) rows */
    int chunk;                  /* prefill rows per forward (the budget's prefill_rows) */
    int *ids;                   /* ctx token ids for tokenizing a prompt */
    uint8_t *emap, *hits;
    char *hex;
    long decoded;               /* tokens sent, engine-wide (HITS cadence) */
    double t_hits, t_emap;      /* when the last HITS / EMAP went out (LIVE_EVERY_S) */
    /* input */
    char *in;
    size_t in_len, in_off, in_cap;
    int reading;                /* 0 after EOF, BAD_FRAME or SIGTERM */
    int skipping;               /* discarding the rest of an overlong line */
    char *line;                 /* copy of the command line being handled */
} server;

/* ------------------------------------------------------------------ small helpers */

static void kv_path(const server *S, int slot, char *out, size_t cap) {
    snprintf(out, cap, "%s.%d", S->o->kv_base, slot);
}

static int parse_u64(const char *s, uint64_t *out) {
    if (!*s) return -1;
    uint64_t v = 0;
    for (; *s; s++) {
        if (*s < '0' || *s > '9') return -1;
        unsigned d = (unsigned)(*s - '0');
        if (v > (UINT64_MAX - d) / 10) return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

static int parse_float(const char *s, double *out) {
    if (!*s || !(*s == '.' || *s == '-' || *s == '+' || (*s >= '0' && *s <= '9'))) return -1;
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (*end || errno == ERANGE || !isfinite(v)) return -1;
    *out = v;
    return 0;
}

/* Splits s in place at single spaces; an empty field (double space, leading or
 * trailing space) makes the line malformed: returns -1. */
static int split_fields(char *s, char **f, int maxf) {
    int n = 0;
    if (!*s) return 0;
    for (;;) {
        if (n == maxf) return -1;
        f[n++] = s;
        char *sp = strchr(s, ' ');
        if (!sp) break;
        *sp = 0;
        s = sp + 1;
        if (!*s || *s == ' ') return -1;
    }
    for (int i = 0; i < n; i++)
        if (!*f[i]) return -1;
    return n;
}

static void hex_line(server *S, const char *kind, const uint8_t *bytes, size_t n) {
    hex_encode(bytes, n, S->hex);
    out_line("%s %d %d %s", kind, S->rows, S->cols, S->hex);
}

static void emit_hits(server *S) {
    if (!S->m->es) { out_line("HITS 0 0 "); return; }
    es_hits_take(S->m->es, S->hits);
    hex_line(S, "HITS", S->hits, ((size_t)S->rows * S->cols + 7) / 8);
}

static void emit_emap(server *S) {
    if (!S->m->es) { out_line("EMAP 0 0 "); return; }
    es_emap(S->m->es, S->emap);
    hex_line(S, "EMAP", S->emap, (size_t)S->rows * S->cols);
}

static void emit_tiers(server *S) {
    int v = 0, r = 0, d = 0;
    double vgb = 0, rgb = 0;
    if (S->m->es) es_tiers(S->m->es, &v, &r, &d, &vgb, &rgb);
    out_line("TIERS %d %d %d %.2f %.2f", v, r, d, vgb, rgb);
}

/* The live telemetry of a decode step: HITS every HITS_EVERY tokens or LIVE_EVERY_S, and the
 * tiers with their heat (TIERS, EMAP) every LIVE_EVERY_S, so that pages watching the experts
 * move as tokens flow; the turn-end block still carries all of them (mux-protocol.md). */
static void emit_live(server *S) {
    const double t = now_s();
    if (++S->decoded % HITS_EVERY == 0 || t - S->t_hits >= LIVE_EVERY_S) {
        emit_hits(S);
        S->t_hits = t;
    }
    if (t - S->t_emap >= LIVE_EVERY_S) {
        emit_tiers(S);
        emit_emap(S);
        S->t_emap = t;
    }
}

static void emit_hwinfo(void) {
    char hw[512];
    hw_line(hw, sizeof hw);
    out_raw_line(hw, strlen(hw));
}

static void on_repin(void *ud, int layer, int eid, int old_tier, int gpu) {
    (void)ud;
    out_line("REPIN %d %d %d %d", layer, eid, old_tier, gpu);
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
    if (kv_save(&S->kv, slot, path, model_fingerprint_k(S->m, S->req[slot].experts)) != 0)
        fprintf(stderr, "[KV] could not save slot %d to %s\n", slot, path);
}

/* ------------------------------------------------------------------ turn end */

static void emit_entropy(server *S, const request *r) {
    size_t cap = 16 + (size_t)S->rows * 12;
    char *buf = malloc(cap);
    if (!buf) return;
    size_t len = (size_t)snprintf(buf, cap, "ENTROPY");
    for (int row = 0; row < S->rows; row++) {
        const uint32_t *c = r->route + (size_t)row * S->cols;
        double tot = 0, h = 0;
        for (int e = 0; e < S->cols; e++) tot += c[e];
        for (int e = 0; e < S->cols; e++)
            if (c[e]) {
                double p = c[e] / tot;
                h -= p * log2(p);
            }
        len += (size_t)snprintf(buf + len, cap - len, " %.3f", h + 0.0);
    }
    out_raw_line(buf, len);
    free(buf);
}

/* ROUTES <id> <rows> <cols> <row>:<expert>:<count>...: this turn's selection counts (the ones
 * ENTROPY is computed from), nonzero cells only, row-major. */
static void emit_routes(server *S, const request *r) {
    size_t ncell = (size_t)S->rows * S->cols, nz = 0;
    for (size_t i = 0; i < ncell; i++) nz += r->route[i] != 0;
    size_t cap = 64 + nz * 36;
    char *buf = malloc(cap);
    if (!buf) return;
    size_t len = (size_t)snprintf(buf, cap, "ROUTES %llu %d %d", (unsigned long long)r->id, S->rows, S->cols);
    for (size_t i = 0; i < ncell; i++)
        if (r->route[i])
            len += (size_t)snprintf(buf + len, cap - len, " %d:%d:%u", (int)(i / (size_t)S->cols),
                                    (int)(i % (size_t)S->cols), (unsigned)r->route[i]);
    out_raw_line(buf, len);
    free(buf);
}

/* ROUTESTEP <id> <rows> <cols> <k> <hex>: the selections of the generated token this step
 * forwarded (routes=2): per MoE row, k expert ids in selection order, each as 2 hex digits
 * (4 when cols > 256). A bridge that knows which tokens were thinking splits the turn's
 * ROUTES by phase from these, exactly (the engine does not know the markers). */
static void emit_routestep(server *S, const request *r) {
    const int w = S->cols > 256 ? 4 : 2;
    const size_t n = (size_t)S->rows * (size_t)r->experts, cap = 96 + n * (size_t)w;
    char *buf = malloc(cap);
    if (!buf) return;
    size_t len = (size_t)snprintf(buf, cap, "ROUTESTEP %llu %d %d %d ", (unsigned long long)r->id,
                                  S->rows, S->cols, r->experts);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(buf + len, cap - len, w == 2 ? "%02x" : "%04x", (unsigned)r->picks[i]);
    out_raw_line(buf, len);
    free(buf);
}

/* IOSTAT <id> <tokens> <disk_bytes> <ideal_bytes> <hits> <acquisitions> <stall_s> <ahead_issued>
 * <ahead_used>: the expert store's I/O over this turn (our extension; concurrent turns share
 * the counters of the steps they share). tokens: those the turn ran through the model. */
static void emit_iostat(server *S, const request *r) {
    es_io_stats now;
    const es_io_stats *a = &r->io0;
    es_io(S->m->es, &now);
    out_line("IOSTAT %llu %d %llu %llu %llu %llu %.3f %llu %llu", (unsigned long long)r->id,
             r->n_prompt - r->reused + r->emitted, (unsigned long long)(now.disk_bytes - a->disk_bytes),
             (unsigned long long)(now.ideal_bytes - a->ideal_bytes), (unsigned long long)(now.hits - a->hits),
             (unsigned long long)(now.acquisitions - a->acquisitions), now.stall_s - a->stall_s,
             (unsigned long long)(now.ahead_issued - a->ahead_issued),
             (unsigned long long)(now.ahead_used - a->ahead_used));
}

/* Ends a turn the normal way: held UTF-8 bytes, telemetry block, usage, REPIN, DONE. */
static void finish(server *S, request *r, int length_limited) {
    model *m = S->m;
    /* An incomplete UTF-8 sequence still held here (STOP or end-of-generation right after
     * a partial character) is dropped: a DATA frame carries exactly one token, and DONE's
     * count must match the frames (the length-limited end folds it into the last frame). */
    char tail[16];
    (void)utf8s_flush(&r->u8, tail, (int)sizeof tail);

    double t_end = now_s();
    perf_counters d = m->perf;
    d.t_edisk -= r->perf0.t_edisk;
    d.t_emm -= r->perf0.t_emm;
    d.t_attn -= r->perf0.t_attn;
    d.t_head -= r->perf0.t_head;
    d.forwards -= r->perf0.forwards;
    double wall = t_end - r->t_decode0;

    emit_hwinfo();
    out_line("PERF %llu %.3f %.3f %.3f %.3f %.3f %.3f %.3f", (unsigned long long)r->id,
             t_end - r->t_accept, d.t_edisk, 0.0, d.t_emm, d.t_attn, 0.0, d.t_head);
    emit_entropy(S, r);
    if (r->routes) emit_routes(S, r);
    out_line("GPUS 0");
    emit_tiers(S);
    emit_emap(S);
    emit_hits(S);
    out_line("PROF %.3f %d %d %.3f %.3f %.3f %.3f %.3f %ld", wall, r->n_prompt, r->emitted,
             d.t_edisk, 0.0, d.t_emm, d.t_attn, d.t_head, d.forwards);
    emit_iostat(S, r);
    save_usage(S);
    if (m->es) es_repin(m->es, on_repin, NULL);

    double tok_s = wall > 0 ? r->emitted / wall : 0.0;
    double hit = m->es ? es_hit_pct_take(m->es) : 100.0;
    out_line("DONE %llu STAT %d %.2f %.1f %.2f %d %d", (unsigned long long)r->id, r->emitted,
             tok_s, hit, rss_peak_gb(), r->n_prompt, length_limited);
    r->active = 0;
    gram_free(r->g);
    r->g = NULL;
    save_slot(S, r->slot);
    fprintf(stderr, "[API] done id=%llu slot=%d emitted=%d prompt=%d %.2f tok/s%s\n",
            (unsigned long long)r->id, r->slot, r->emitted, r->n_prompt, tok_s,
            length_limited ? " (length)" : "");
}

static void finish_all(server *S) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active) finish(S, &S->req[s], 0);
}

/* ------------------------------------------------------------------ tokens */

/* DATA for one sampled token, with the logprobs=k tail when asked. */
static void emit_token(server *S, request *r, int tok, int last) {
    int plen = 0;
    /* A sampled control token (e.g. <|im_start|>) is markup, not reply text: its DATA is empty,
     * as llama.cpp renders specials by default. */
    const char *piece = tok_is_control(S->tok, tok) ? "" : tok_piece(S->tok, tok, &plen);
    size_t cap = 3 * ((size_t)plen + 3) + 16;   /* invalid bytes may become U+FFFD */
    char stackbuf[1024];
    char *buf = cap <= sizeof stackbuf ? stackbuf : malloc(cap);
    if (!buf) return;
    int n = utf8s_push(&r->u8, piece, plen, buf, (int)cap - 8);
    if (n < 0) n = 0;
    if (last) {
        int t = utf8s_flush(&r->u8, buf + n, 8);
        if (t > 0) n += t;
    }

    if (r->logprobs > 0) {
        int ids[MAX_LOGPROBS];
        float lps[MAX_LOGPROBS];
        /* under a grammar: candidates and log-probabilities of the masked distribution */
        int k = topk_logprobs(r->logits, S->vocab, r->logprobs, r->allow, ids, lps);
        double lse = logsumexp_allowed(r->logits, S->vocab, r->allow);
        size_t hcap = 64 + (size_t)r->logprobs * 32 + (size_t)n + (r->lptext ? (size_t)(r->logprobs + 1) * 514 : 0);
        char *line = malloc(hcap);
        if (line) {
            size_t len = (size_t)snprintf(line, hcap, "DATA %llu %d %.4f %d",
                                          (unsigned long long)r->id, n,
                                          (double)r->logits[tok] - lse, k);
            for (int i = 0; i < k; i++)
                len += (size_t)snprintf(line + len, hcap - len, " %d %.4f", ids[i], (double)lps[i]);
            if (r->lptext) {                    /* the sampled token's bytes, then each candidate's */
                for (int i = -1; i < k; i++) {
                    int t = i < 0 ? tok : ids[i], tl = 0;
                    const char *tp = t >= 0 && !tok_is_control(S->tok, t) ? tok_piece(S->tok, t, &tl) : "";
                    if (tl > 256) tl = 256;
                    char hx[2 * 256 + 1];
                    hex_encode((const uint8_t *)tp, (size_t)tl, hx);
                    len += (size_t)snprintf(line + len, hcap - len, " %s", tl ? hx : "-");
                }
            }
            line[len++] = '\n';
            memcpy(line + len, buf, (size_t)n);
            out_raw_line(line, len + (size_t)n);
            free(line);
        }
    } else {
        out_data(r->id, buf, n);
    }
    if (buf != stackbuf) free(buf);

    if (S->o->serve_topk) {
        int ids[TOPK_N];
        float lps[TOPK_N];
        int k = r->allow ? topk_logprobs(r->logits, S->vocab, TOPK_N, r->allow, ids, lps)
                         : (topk_logprobs(r->logits, S->vocab, TOPK_N, NULL, ids, lps), TOPK_N);
        char line[64 + TOPK_N * (24 + 2 * 256)];
        size_t len = (size_t)snprintf(line, sizeof line, "TOPK %llu %d", (unsigned long long)r->id, k);
        for (int i = 0; i < k; i++) {
            int tl = 0;
            const char *t = ids[i] >= 0 ? tok_piece(S->tok, ids[i], &tl) : "";
            if (tl > 256) tl = 256;
            char hx[2 * 256 + 1];
            hex_encode((const uint8_t *)t, (size_t)tl, hx);
            len += (size_t)snprintf(line + len, sizeof line - len, " %.4f %s", (double)lps[i],
                                    tl ? hx : "-");
        }
        out_raw_line(line, len);
    }
    emit_live(S);
}

/* Samples from r->logits and acts on the token: end of generation, or DATA and
 * either the end of the budget or a row in the next decode step. */
static void take_token(server *S, request *r) {
    r->allow = NULL;
    if (r->g && !(r->allow = gram_mask(r->g, r->max_tokens - r->emitted))) {
        fprintf(stderr, "[API] out of memory for the grammar mask of id=%llu\n", (unsigned long long)r->id);
        finish(S, r, 0);
        return;
    }
    int tok = sample_token_k(r->logits, S->vocab, r->temperature, r->top_p, r->top_k, &r->rng, S->scratch, r->allow);
    if (tok < 0) {                       /* the grammar allows nothing: cut, as by the budget */
        finish(S, r, !gram_accepting(r->g));
        return;
    }
    if (tok_is_eog(S->tok, tok)) {
        finish(S, r, 0);
        return;
    }
    if (r->g && gram_advance(r->g, tok) != 0) {   /* cannot happen: tok was in the mask */
        fprintf(stderr, "[API] token %d left the grammar of id=%llu; ending it\n", tok, (unsigned long long)r->id);
        finish(S, r, 1);
        return;
    }
    r->emitted++;
    /* A grammar's output is complete in a final state, and complete (not cut) when the budget
     * ends in an accepting one. */
    int complete = r->g && (gram_final(r->g) || (r->emitted >= r->max_tokens && gram_accepting(r->g)));
    int last = complete || r->emitted >= r->max_tokens;
    emit_token(S, r, tok, last);
    if (last) finish(S, r, !complete);
    else r->next_tok = tok;
}

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

/* Room for n_pos positions in slot s within the KV share: when the share is full, the idle
 * slots' histories (kept for prefix reuse) are freed first, then kv_reserve's answer. */
static int kv_grow(server *S, int s, int n_pos) {
    int rc = kv_reserve(&S->kv, s, n_pos);
    for (int o = 0; rc == KV_OVER_BUDGET && o < S->o->n_slots; o++)
        if (o != s && !S->req[o].active && S->kv.slots[o].cap > 0) {
            fprintf(stderr, "[KV] slot %d's history freed for slot %d (KV share full)\n", o, s);
            kv_release(&S->kv, o);
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

/* One continuous-batching step: one row per active request. */
static void decode_step(server *S) {
    int n = 0;
    for (int s = 0; s < S->o->n_slots; s++) {
        request *r = &S->req[s];
        if (!r->active) continue;
        int pos = S->kv.slots[s].n_pos;
        const int kr = kv_grow(S, s, pos + 1);
        if (kr != 0) {
            fprintf(stderr, "[API] %s growing KV slot %d; ending id=%llu\n",
                    kr == KV_OVER_BUDGET ? "KV share of the memory budget full" : "out of memory", s,
                    (unsigned long long)r->id);
            finish(S, r, kr == KV_OVER_BUDGET);     /* the budget ends it as a length limit would */
            continue;
        }
        S->fwd[n++] = (fwd_row){ .slot = s, .pos = pos, .token = r->next_tok, .logits = r->logits,
                                 .route_counts = r->route, .n_experts = r->experts,
                                 .no_heat = !r->heat, .picks = r->routes == 2 && S->rows ? r->picks : NULL };
    }
    if (n == 0) return;
    if (model_forward(S->m, &S->kv, S->fwd, n) != 0) {
        fprintf(stderr, "[API] forward failed; ending %d active request(s)\n", n);
        for (int i = 0; i < n; i++) finish(S, &S->req[S->fwd[i].slot], 0);
        return;
    }
    /* Each forwarded token's selections go out before the DATA of the token it predicts. */
    for (int i = 0; i < n; i++)
        if (S->fwd[i].picks) emit_routestep(S, &S->req[S->fwd[i].slot]);
    /* Copy the slots first: take_token may finish a request, but never reuses S->fwd. */
    for (int i = 0; i < n; i++) take_token(S, &S->req[S->fwd[i].slot]);
}

/* ------------------------------------------------------------------ input */

/* Reads what is available (one read; blocks only if nothing is). 1 data, 0 EOF, -1 EINTR. */
static int fill(server *S) {
    if (S->in_off > 0 && (S->in_off == S->in_len || S->in_off > S->in_cap / 2)) {
        memmove(S->in, S->in + S->in_off, S->in_len - S->in_off);
        S->in_len -= S->in_off;
        S->in_off = 0;
    }
    if (S->in_cap - S->in_len < 65536) {
        size_t nc = S->in_cap * 2 + 65536;
        char *p = realloc(S->in, nc);
        if (!p) return 0;                 /* treat as EOF: nothing sane left to do */
        S->in = p;
        S->in_cap = nc;
    }
    ssize_t r = read(STDIN_FILENO, S->in + S->in_len, S->in_cap - S->in_len);
    if (r < 0) return errno == EINTR ? -1 : 0;
    S->in_len += (size_t)r;
    return r > 0;
}

/* Makes sure `need` unread bytes are buffered (blocking). 0 ok, -1 EOF (short read). */
static int need_bytes(server *S, size_t need) {
    while (S->in_len - S->in_off < need) {
        int r = fill(S);
        if (r == 0) return -1;
        if (r < 0 && sig_term) return -1;
    }
    return 0;
}

static void stop_reading(server *S) {
    S->reading = 0;
}

static void bad_request(void) { out_line("ERROR 0 BAD_REQUEST"); }

static int find_active(server *S, uint64_t id) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active && S->req[s].id == id) return s;
    return -1;
}

/* "STOP <id>" / "CANCEL <id>" */
static void cmd_stop_cancel(server *S, char *args, int cancel) {
    char *f[2];
    uint64_t id;
    if (!args || split_fields(args, f, 2) != 1 || parse_u64(f[0], &id) != 0 || id == 0) {
        bad_request();
        return;
    }
    int s = find_active(S, id);
    if (s < 0) {
        out_line("ERROR %llu NOT_FOUND", (unsigned long long)id);
        return;
    }
    request *r = &S->req[s];
    if (!cancel) {
        finish(S, r, 0);
        return;
    }
    r->active = 0;
    gram_free(r->g);
    r->g = NULL;
    save_slot(S, s);
    out_line("ERROR %llu CANCELLED", (unsigned long long)id);
    fprintf(stderr, "[API] cancelled id=%llu slot=%d after %d tokens\n", (unsigned long long)id, s,
            r->emitted);
}

typedef struct {
    uint64_t id, slot, bytes, max_tokens, gbytes, seed, experts, top_k;
    double temperature, top_p;
    int have_seed, logprobs, have_logprobs, have_experts, have_top_k, lptext, have_lptext;
    int routes, have_routes, heat, have_heat;
    int grammar;                /* grammar=1: the gbytes are a CGD1 DFA constraining sampling */
} submit_hdr;

/* Parses the SUBMIT fields. Returns 0 if valid. Independently of validity, sets
 * *consume to the payload bytes (+ grammar) to drain when both counts parsed. */
static int parse_submit(char *args, submit_hdr *h, long long *consume) {
    char *f[40];
    memset(h, 0, sizeof *h);
    h->heat = 1;
    *consume = -1;
    int nf = args ? split_fields(args, f, 40) : 0;
    if (nf < 0) {                       /* still try to find the byte counts */
        return -1;
    }
    if (nf >= 3 && parse_u64(f[2], &h->bytes) == 0 && h->bytes <= MAX_PAYLOAD) {
        *consume = (long long)h->bytes;
        if (nf >= 7 && !strchr(f[6], '=')) {
            if (parse_u64(f[6], &h->gbytes) == 0 && h->gbytes <= MAX_GRAMMAR)
                *consume += (long long)h->gbytes;
            else
                *consume = -1;
        }
    }
    if (nf < 6) return -1;
    if (parse_u64(f[0], &h->id) || h->id == 0) return -1;
    if (parse_u64(f[1], &h->slot)) return -1;
    if (parse_u64(f[2], &h->bytes) || h->bytes > MAX_PAYLOAD) return -1;
    if (parse_u64(f[3], &h->max_tokens)) return -1;
    if (parse_float(f[4], &h->temperature) || h->temperature < 0 || h->temperature > 2) return -1;
    if (parse_float(f[5], &h->top_p) || !(h->top_p > 0) || h->top_p > 1) return -1;
    int i = 6;
    if (i < nf && !strchr(f[i], '=')) {
        if (parse_u64(f[i], &h->gbytes) || h->gbytes > MAX_GRAMMAR) return -1;
        i++;
    }
    for (; i < nf; i++) {
        char *eq = strchr(f[i], '=');
        if (!eq) return -1;             /* extra positional field */
        *eq = 0;
        const char *k = f[i], *v = eq + 1;
        uint64_t val;
        if (parse_u64(v, &val)) return -1;
        if (!strcmp(k, "seed")) {
            if (h->have_seed) return -1;
            h->have_seed = 1;
            h->seed = val;
        } else if (!strcmp(k, "logprobs")) {
            if (h->have_logprobs || val > MAX_LOGPROBS) return -1;
            h->have_logprobs = 1;
            h->logprobs = (int)val;
        } else if (!strcmp(k, "experts")) {  /* range checked after the payload: a request error */
            if (h->have_experts) return -1;
            h->have_experts = 1;
            h->experts = val;
        } else if (!strcmp(k, "routes")) {
            if (h->have_routes || val > 2) return -1;
            h->have_routes = 1;
            h->routes = (int)val;
        } else if (!strcmp(k, "top_k")) {   /* 0 = no cut; >= vocab is no cut either */
            if (h->have_top_k || val > INT32_MAX) return -1;
            h->have_top_k = 1;
            h->top_k = val;
        } else if (!strcmp(k, "lptext")) {
            if (h->have_lptext || val > 1) return -1;
            h->have_lptext = 1;
            h->lptext = (int)val;
        } else if (!strcmp(k, "heat")) {
            if (h->have_heat || val > 1) return -1;
            h->have_heat = 1;
            h->heat = (int)val;
        } else if (!strcmp(k, "grammar")) {
            if (h->grammar || val != 1) return -1;
            h->grammar = 1;
        } else {
            return -1;
        }
    }
    if (h->max_tokens == 0 && h->logprobs == 0) return -1;
    if (h->grammar && h->gbytes == 0) return -1;
    return 0;
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

/* SUBMIT, in the admission order of mux-protocol.md §5.1. */
static void cmd_submit(server *S, char *args) {
    submit_hdr h;
    long long consume;
    int bad = parse_submit(args, &h, &consume);
    if (bad) {
        /* Our improvement: drain a payload whose size we know, so the stream stays in sync. */
        if (consume >= 0) {
            if (need_bytes(S, (size_t)consume + 1) != 0) {
                bad_request();
                stop_reading(S);
                return;
            }
            S->in_off += (size_t)consume;
            if (S->in[S->in_off] == '\n') S->in_off++;
        }
        bad_request();
        return;
    }
    size_t total = (size_t)(h.bytes + h.gbytes);
    if (need_bytes(S, total + 1) != 0) {       /* short read: EOF */
        stop_reading(S);
        return;
    }
    const char *payload = S->in + S->in_off;
    char trail = payload[total];
    unsigned long long id = (unsigned long long)h.id;
    if (trail != '\n') {
        out_line("ERROR %llu BAD_FRAME", id);
        fprintf(stderr, "[API] bad frame for id=%llu: no newline after the payload; stopping input\n", id);
        S->in_off += total;
        stop_reading(S);
        return;
    }
    S->in_off += total + 1;      /* payload stays valid: nothing reads stdin below */

    const int E = S->m->c.n_experts;
    if (h.slot >= (uint64_t)S->o->n_slots || memchr(payload, 0, (size_t)h.bytes) ||
        (h.have_experts && (h.experts < 1 || h.experts > (uint64_t)E))) {
        out_line("ERROR %llu BAD_REQUEST", id);
        return;
    }
    int slot = (int)h.slot;
    if (S->req[slot].active) {
        out_line("ERROR %llu SLOT_BUSY", id);
        return;
    }
    if (find_active(S, h.id) >= 0) {
        out_line("ERROR %llu DUPLICATE_ID", id);
        return;
    }
    /* Without grammar=1 the grammar bytes are accepted and ignored (colibri: drafts only). */
    gram *g = NULL;
    if (h.grammar && !(g = submit_grammar(S, id, (const uint8_t *)payload + h.bytes, (size_t)h.gbytes)))
        return;
    int ctx = S->o->ctx;
    int n = tok_encode(S->tok, payload, (size_t)h.bytes, S->ids, ctx - 1);
    if (n < 0 || n == 0 || n > ctx - 2) gram_free(g);
    if (n < 0) {
        fprintf(stderr, "[API] tokenizer out of memory for id=%llu\n", id);
        out_line("ERROR %llu BAD_REQUEST", id);
        return;
    }
    if (n > ctx - 1) n = ctx - 1;
    if (n == 0) {
        out_line("ERROR %llu EMPTY_PROMPT", id);
        return;
    }
    if (n > ctx - 2) {
        out_line("ERROR %llu CONTEXT_EXCEEDED %d %d", id, n, ctx - 2);
        fprintf(stderr, "[API] prompt of at least %d tokens does not fit CTX=%d (limit %d); "
                        "raise CTX or shorten the conversation\n", n, ctx, ctx - 2);
        return;
    }
    const int kv_fit = kv_room_idle(S, slot);
    if (n > kv_fit - 2) {                     /* the KV share, with the other slots' turns in it */
        gram_free(g);
        out_line("ERROR %llu CONTEXT_EXCEEDED %d %d", id, n, kv_fit > 2 ? kv_fit - 2 : 0);
        fprintf(stderr, "[API] prompt of %d tokens does not fit the KV share of the memory budget now "
                        "(%d positions free for slot %d); raise the budget or lower KV_SLOTS / CTX\n", n, kv_fit, slot);
        return;
    }

    request *r = &S->req[slot];
    const int experts = h.have_experts ? (int)h.experts : S->m->c.top_k;
    /* K/V rows computed with another expert count are not this turn's: recompute them all */
    int keep = experts == r->experts ? kv_common_prefix(&S->kv, slot, S->ids, n) : 0;
    if (keep >= n) keep = n - 1;            /* identical prompt: re-forward the last token */
    keep = kv_rewind(&S->kv, slot, keep);   /* sliding windows: what their kept rows allow */
    keep = model_resume(S->m, &S->kv, slot, keep);   /* a hybrid's recurrent state: exact or 0 */
    uint64_t room = (uint64_t)(ctx - n - 1);
    r->active = 1;
    r->id = h.id;
    r->slot = slot;
    r->n_prompt = n;
    r->reused = keep;
    r->max_tokens = (int)(h.max_tokens < room ? h.max_tokens : room);
    r->emitted = 0;
    r->temperature = (float)h.temperature;
    r->top_p = (float)h.top_p;
    r->logprobs = h.logprobs;
    r->lptext = h.lptext;
    r->top_k = (int)h.top_k;
    r->experts = experts;
    r->routes = h.routes;
    r->heat = h.heat;
    r->g = g;
    rng_seed(&r->rng, h.have_seed ? h.seed : h.id);
    utf8s_init(&r->u8);
    memset(r->route, 0, (size_t)S->rows * S->cols * sizeof *r->route);
    r->t_accept = now_s();
    r->perf0 = S->m->perf;
    es_io(S->m->es, &r->io0);

    out_line("ACCEPT %llu %d reused=%d", id, n, keep);
    fprintf(stderr, "[API] KV slot %d prefix %d/%d token, prefill %d\n", slot, keep, n, n - keep);

    kv_truncate(&S->kv, slot, keep);
    if (kv_grow(S, slot, n) != 0 ||
        prefill_tail(S->m, &S->kv, slot, S->ids, keep, n, r->logits, r->route, experts, !r->heat,
                     S->fwd, S->chunk) != 0) {
        fprintf(stderr, "[API] prefill failed for id=%llu (out of memory or expert read error)\n", id);
        kv_truncate(&S->kv, slot, keep);
        r->t_decode0 = now_s();
        finish(S, r, 0);
        return;
    }
    /* the windows where this prompt ends: the next stateless turn repeats the prompt and may
     * diverge right after it, past rows the windows will have dropped by then */
    kv_checkpoint(&S->kv, slot);
    r->t_decode0 = now_s();
    if (r->max_tokens == 0) {              /* max_tokens=0 with logprobs: prompt only */
        finish(S, r, 1);
        return;
    }
    take_token(S, r);
}

static void handle_line(server *S, char *line) {
    char *sp = strchr(line, ' ');
    char *args = NULL;
    if (sp) {
        *sp = 0;
        args = sp + 1;
    }
    if (!strcmp(line, "SUBMIT") && args) cmd_submit(S, args);
    else if (!strcmp(line, "STOP")) cmd_stop_cancel(S, args, 0);
    else if (!strcmp(line, "CANCEL")) cmd_stop_cancel(S, args, 1);
    else bad_request();
}

/* Runs every complete command line in the buffer. */
static void run_buffered(server *S) {
    while (S->reading && !sig_term) {
        char *start = S->in + S->in_off;
        size_t avail = S->in_len - S->in_off;
        char *nl = memchr(start, '\n', avail);
        if (!nl) {
            if (avail > MAX_LINE) {      /* refuse once, then skip to the next newline */
                if (!S->skipping) bad_request();
                S->skipping = 1;
                S->in_off = S->in_len;
            }
            return;
        }
        size_t len = (size_t)(nl - start);
        S->in_off += len + 1;
        if (S->skipping) {
            S->skipping = 0;
            continue;
        }
        if (len > MAX_LINE) {
            bad_request();
            continue;
        }
        memcpy(S->line, start, len);     /* the buffer may move while the command runs */
        S->line[len] = 0;
        if (memchr(S->line, 0, len)) bad_request();
        else handle_line(S, S->line);
    }
}

/* ------------------------------------------------------------------ setup & loop */

static int any_active(const server *S) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active) return 1;
    return 0;
}

static void json_str(char *out, size_t cap, size_t *len, const char *s) {
#define PUT(c) do { if (*len + 1 < cap) out[(*len)++] = (c); } while (0)
    PUT('"');
    const unsigned char *p = (const unsigned char *)s;
    while (p && *p) {
        unsigned c = *p;
        if (c == '"' || c == '\\') { PUT('\\'); PUT((char)c); p++; continue; }
        if (c < 0x20 || c == 0x7f) {
            char esc[8];
            const char *e = c == '\n' ? "\\n" : c == '\t' ? "\\t" : c == '\r' ? "\\r" : NULL;
            if (!e) { snprintf(esc, sizeof esc, "\\u%04x", c); e = esc; }
            while (*e) PUT(*e++);
            p++;
            continue;
        }
        if (c < 0x80) { PUT((char)c); p++; continue; }
        /* multi-byte: copy a well-formed sequence, else U+FFFD */
        int n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
        int ok = n > 0;
        for (int i = 1; ok && i < n; i++) ok = (p[i] & 0xc0) == 0x80;
        if (ok && n == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f))) ok = 0;
        if (ok && n == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f))) ok = 0;
        if (ok) { for (int i = 0; i < n; i++) PUT((char)p[i]); p += n; }
        else { const char *e = "\\ufffd"; while (*e) PUT(*e++); p++; }
    }
    PUT('"');
    out[*len] = 0;
#undef PUT
}

static void emit_model_line(server *S) {
    model *m = S->m;
    const char *tmpl = m->chat_template ? m->chat_template : "";
    size_t cap = 2048 + 6 * (strlen(tmpl) + strlen(m->name) + strlen(m->arch));
    int bos = tok_bos(S->tok), eos = tok_eos(S->tok);
    const char *bt = bos >= 0 ? tok_text(S->tok, bos) : NULL;
    const char *et = eos >= 0 ? tok_text(S->tok, eos) : NULL;
    cap += 6 * ((bt ? strlen(bt) : 0) + (et ? strlen(et) : 0));
    char *b = malloc(cap);
    if (!b) return;
    size_t len = (size_t)snprintf(b, cap, "MODEL {\"name\":");
    json_str(b, cap, &len, m->name);
    len += (size_t)snprintf(b + len, cap - len, ",\"arch\":");
    json_str(b, cap, &len, m->arch);
    len += (size_t)snprintf(b + len, cap - len,
                            ",\"n_layers\":%d,\"n_experts\":%d,\"top_k\":%d,\"experts_min\":%d,"
                            "\"experts_max\":%d,\"ctx\":%d,\"n_vocab\":%d,\"bos\":",
                            m->c.n_layers, m->c.n_experts, m->c.n_experts ? m->c.top_k : 0,
                            m->c.n_experts ? 1 : 0, m->c.n_experts, S->o->ctx, S->vocab);
    if (bt) json_str(b, cap, &len, bt);
    else len += (size_t)snprintf(b + len, cap - len, "null");
    len += (size_t)snprintf(b + len, cap - len, ",\"eos\":");
    if (et) json_str(b, cap, &len, et);
    else len += (size_t)snprintf(b + len, cap - len, "null");
    len += (size_t)snprintf(b + len, cap - len, ",\"chat_template\":");
    if (m->chat_template) json_str(b, cap, &len, m->chat_template);
    else len += (size_t)snprintf(b + len, cap - len, "null");
    len += (size_t)snprintf(b + len, cap - len, ",\"sampling\":");
    if (m->sampling.has_temp || m->sampling.has_top_p || m->sampling.has_top_k) {
        const char *sep = "{";
        if (m->sampling.has_temp) {
            len += (size_t)snprintf(b + len, cap - len, "%s\"temperature\":%.6g", sep, (double)m->sampling.temp);
            sep = ",";
        }
        if (m->sampling.has_top_p) {
            len += (size_t)snprintf(b + len, cap - len, "%s\"top_p\":%.6g", sep, (double)m->sampling.top_p);
            sep = ",";
        }
        if (m->sampling.has_top_k)
            len += (size_t)snprintf(b + len, cap - len, "%s\"top_k\":%d", sep, m->sampling.top_k);
        len += (size_t)snprintf(b + len, cap - len, "}");
    } else {
        len += (size_t)snprintf(b + len, cap - len, "null");
    }
    /* grammar: SUBMIT takes grammar=1 with a DFA of this format as its gbytes (grammar.h);
     * routes: the highest routes= level SUBMIT takes (2: per-token ROUTESTEP lines) */
    len += (size_t)snprintf(b + len, cap - len, ",\"slots\":%d,\"grammar\":\"CGD1\",\"routes\":2", S->o->n_slots);
    if (S->o->budget) {                 /* how the memory budget was split (budget.h) */
        len += (size_t)snprintf(b + len, cap - len, ",\"memory\":{");
        len += (size_t)budget_json(S->o->budget, b + len, cap - len);
        len += (size_t)snprintf(b + len, cap - len, "}");
    }
    len += (size_t)snprintf(b + len, cap - len, "}");
    out_raw_line(b, len);
    free(b);
}

static void server_free(server *S) {
    if (S->req)
        for (int s = 0; s < S->o->n_slots; s++) {
            free(S->req[s].route);
            free(S->req[s].picks);
            free(S->req[s].logits);
        }
    if (S->req)
        for (int s = 0; s < S->o->n_slots; s++) gram_free(S->req[s].g);
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
    kv_free(&S->kv);
}

/* Reads stdin and runs the commands it holds; waits for input only when idle. Input that
 * arrived meanwhile is read again, up to INPUT_ROUNDS times, before the caller's decode step:
 * a prefill takes long enough for the next SUBMITs of a burst to arrive (a web front end admits
 * its clients one after another), and they are prefilled now, as if they had come in one
 * write, instead of each waiting behind a decode step. The bound keeps a steady stream of
 * SUBMITs from starving the decode. Returns -1 when a signal interrupted the wait. */
static int read_commands(server *S, int busy) {
    for (int round = 0; round < INPUT_ROUNDS && S->reading; round++) {
        struct pollfd pfd = { .fd = STDIN_FILENO, .events = POLLIN };
        int pr = poll(&pfd, 1, busy || round > 0 ? 0 : -1);
        if (pr < 0 && errno == EINTR) return -1;
        if (pr < 0) stop_reading(S);
        if (pr <= 0) return 0;
        int fr = fill(S);
        if (fr == 0) {
            stop_reading(S);
            fprintf(stderr, "[API] stdin closed: draining %s\n", any_active(S) ? "active requests" : "(idle)");
        }
        if (fr <= 0) return 0;
        run_buffered(S);
    }
    return 0;
}

int serve_mux(model *m, const serve_opts *o) {
    server S_, *S = &S_;
    memset(S, 0, sizeof *S);
    S->m = m;
    S->o = o;
    S->tok = m->tok;
    S->vocab = m->c.vocab;
    S->rows = m->es ? es_rows(m->es) : 0;
    S->cols = m->es ? es_cols(m->es) : 0;
    S->reading = 1;

    S->chunk = o->budget ? o->budget->rows : PREFILL_CHUNK;
    int nfwd = o->n_slots > S->chunk ? o->n_slots : S->chunk;
    size_t ncells = (size_t)S->rows * S->cols;
    int ok = model_kv_init(m, &S->kv, o->n_slots, o->ctx) == 0 &&
             kv_set_f16(&S->kv, o->kv_f16) == 0;
    if (ok && o->budget) kv_set_budget(&S->kv, o->budget->kv);
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
    if (!ok) {
        fprintf(stderr, "colibri-engine: out of memory setting up %d slots\n", o->n_slots);
        server_free(S);
        return 1;
    }

    if (o->kvsave)
        for (int s = 0; s < o->n_slots; s++) {
            char path[1300];
            kv_path(S, s, path, sizeof path);
            if (kv_load(&S->kv, s, path, m->fingerprint) == 0 && S->kv.slots[s].n_pos > 0)
                fprintf(stderr, "[KV] slot %d resumed from %s: %d tokens (%s)\n", s, path, S->kv.slots[s].n_pos,
                        model_state_bytes(m) ? "no recurrent state: its next turn re-prefills" : "no re-prefill");
        }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sigemptyset(&sa.sa_mask);
    sa.sa_handler = on_sigint;          /* no SA_RESTART: poll/read return EINTR */
    sigaction(SIGINT, &sa, NULL);
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL);
    sa.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &sa, NULL);

    if (m->es) {                        /* start the windows clean */
        es_hits_take(m->es, S->hits);
        es_hit_pct_take(m->es);
    }
    out_line("\x01\x01READY\x01\x01");
    out_line("STAT 0 0.00 0.0 %.2f", rss_peak_gb());
    emit_hwinfo();
    emit_tiers(S);
    emit_emap(S);
    emit_model_line(S);
    fprintf(stderr, "[API] mux ready: %d slot(s), CTX=%d, model %s\n", o->n_slots, o->ctx, m->name);

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
        int busy = any_active(S);
        if (!S->reading && !busy) break;
        if (S->reading && read_commands(S, busy) < 0) continue;
        if (any_active(S)) decode_step(S);
    }
    save_usage(S);
    fprintf(stderr, "[API] exit\n");
    server_free(S);
    return 0;
}
