/* server_spec.c — speculative decoding in the serve loop: a step forwards the request's next
 * token and up to SPEC_MAX drafted ones as one batch (the weights read once for all of them),
 * keeps the drafts the model itself would have chosen, and cuts the slot back after the first
 * one it would not (model_rollback: K/V truncated, a hybrid's recurrent state from the trail).
 * Owns: the draft source, the verify step, the policy that decides per step whether to draft and
 * how many, and the SPEC line.
 *
 * Exactness: a drafting step emits y_1 .. y_K where y_k is the token the request's sampler draws
 * from row k - 1 (greedy: its argmax), and row k - 1 (k >= 2) holds the draft x_{k-1} == y_{k-1}:
 * the same tokens a plain decode would emit, each drawn from the logits of the same history with
 * the same draws of the request's RNG. A sampled turn is thus the plain run's distribution (a
 * draft is kept exactly when the model's own sample is that token), and EXACT=1 rows do not
 * depend on the batch around them, so EXACT output, greedy or seeded, is identical with
 * speculation on and off.
 *
 * Where it applies: the only active request (other active slots already share each step's
 * reads), with nothing that needs one row at a time (a grammar's mask, logprobs, per-token
 * routes).
 *
 * The draft source: SPEC_REPLAY, a recorded run's tokens (SPEC_RECORD) with a SPEC_CORRUPT
 * share replaced by other tokens: a bench's stand-in for a draft model, whose acceptance it sets.
 *
 * The policy (SPEC_POLICY=adaptive, the default) measures, it does not predict: seconds per
 * emitted token of plain steps (a moving average; a turn's first plain step, which warms the
 * caches, not counted) against drafting steps'. Under a memory budget a verify batch reads the
 * union of its rows' experts, so drafting can cost more than it gains; this is where that shows.
 * It starts with three plain steps. A try starts with a lone guess beside a plain step (the
 * draft source's cost only, no verify batch); when the step's own token matches it, drafting
 * starts with one token; while
 * drafting costs under SPEC_LOSS of a plain step's time per token and every draft was accepted,
 * it drafts one more (up to SPEC_DRAFT); when it costs more it drafts one fewer, and from one it
 * pauses for a back-off that doubles each time (SPEC_PAUSE0 .. SPEC_PAUSE_MAX plain steps), as
 * after a wrong lone guess; the next try is a lone guess again. A
 * plain step every SPEC_REFRESH drafting steps keeps the other side of the comparison current. */
#include "server_impl.h"

#include <stdlib.h>
#include <string.h>

#define SPEC_LOSS      0.98     /* drafting must cost under this share of a plain step per token */
#define SPEC_PAUSE0    32       /* a failed try costs about half a step: tried at 3, 36, 101, ... */
#define SPEC_PAUSE_MAX 512
#define SPEC_REFRESH   16
#define SPEC_EMA       0.3      /* weight of the newest step in the moving averages */

/* SPEC_REPLAY: token ids, a turn per line. 0, or -1 (unreadable, not ids, out of memory). */
static int read_replay(server *S, const char *path) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = 0, cap = 256, lines = 0, lcap = 16, c, bad = 0;
    S->replay = malloc((size_t)cap * sizeof(int));
    S->replay_line = malloc((size_t)(lcap + 1) * sizeof(int));
    if (!S->replay || !S->replay_line) bad = 1;
    S->replay_line[0] = 0;
    while (!bad && (c = fgetc(f)) != EOF) {
        if (c == '\n') {
            if (lines == lcap) {
                int *g = realloc(S->replay_line, (size_t)((lcap *= 2) + 1) * sizeof(int));
                if (!g) { bad = 1; break; }
                S->replay_line = g;
            }
            S->replay_line[++lines] = n;
        } else if (c >= '0' && c <= '9') {
            ungetc(c, f);
            int v;
            if (fscanf(f, "%d", &v) != 1) { bad = 1; break; }
            if (n == cap) {
                int *g = realloc(S->replay, (size_t)(cap *= 2) * sizeof(int));
                if (!g) { bad = 1; break; }
                S->replay = g;
            }
            S->replay[n++] = v;
        } else if (c != ' ' && c != '\t' && c != '\r') {
            bad = 1;
        }
    }
    fclose(f);
    if (!bad && (lines == 0 || S->replay_line[lines] != n)) {     /* a last line without its newline */
        int *g = realloc(S->replay_line, (size_t)(lines + 2) * sizeof(int));
        if (!g) bad = 1;
        else S->replay_line = g, S->replay_line[++lines] = n;
    }
    S->n_lines = lines;
    return bad ? -1 : 0;
}

int spec_init(server *S) {
    const serve_opts *o = S->o;
    if (o->spec_record && !(S->record = fopen(o->spec_record, "w"))) {
        fprintf(stderr, "colibri-engine: SPEC_RECORD %s: cannot write\n", o->spec_record);
        return -1;
    }
    if (o->spec_draft <= 0) return 0;
    if (!(S->spec_logits = malloc((size_t)SPEC_MAX * (size_t)S->vocab * sizeof(float)))) {
        fprintf(stderr, "colibri-engine: out of memory for the drafted rows' logits\n");
        return -1;
    }
    if (o->spec_replay && read_replay(S, o->spec_replay) != 0) {
        fprintf(stderr, "colibri-engine: SPEC_REPLAY %s: not a readable file of token ids, a turn per line\n",
                o->spec_replay);
        return -1;
    }
    for (int i = 0; S->replay && i < S->replay_line[S->n_lines]; i++)
        if (S->replay[i] < 0 || S->replay[i] >= S->vocab) {
            fprintf(stderr, "colibri-engine: SPEC_REPLAY %s: token %d is outside the vocabulary\n", o->spec_replay,
                    S->replay[i]);
            return -1;
        }
    return 0;
}

void spec_free(server *S) {
    free(S->spec_logits);
    free(S->replay);
    free(S->replay_line);
    if (S->record) fclose(S->record);
    S->spec_logits = NULL, S->replay = NULL, S->record = NULL;
}

void spec_recorded(server *S, int tok) {
    if (S->record) fprintf(S->record, "%d ", tok);
}

void spec_start(server *S, request *r) {
    r->sp = (spec_req){.want = 1, .off = 3, .backoff = SPEC_PAUSE0, .probe = 1, .guess = -1,
                       .rng = r->id * 0x9E3779B97F4A7C15ull + 1};
    if (S->replay && S->next_line < S->n_lines) {
        const int i = S->next_line++;
        r->sp.replay = S->replay + S->replay_line[i];
        r->sp.n_replay = S->replay_line[i + 1] - S->replay_line[i];
    }
}

static uint64_t next_rand(uint64_t *x) {     /* xorshift64* */
    *x ^= *x >> 12, *x ^= *x << 25, *x ^= *x >> 27;
    return *x * 0x2545F4914F6CDD1Dull;
}

static int only_active(const server *S, const request *r) {
    for (int s = 0; s < S->o->n_slots; s++)
        if (S->req[s].active && &S->req[s] != r) return 0;
    return 1;
}

/* Tokens to draft this step (0: a plain step). */
static int draft_count(server *S, request *r) {
    spec_req *sp = &r->sp;
    if (S->o->spec_draft <= 0 || (!sp->replay && !S->m->c.n_mtp) || r->g || r->logprobs ||
        r->routes == 2 || !only_active(S, r))
        return 0;
    int d = S->o->spec_always ? S->o->spec_draft : sp->want;
    if (!S->o->spec_always) {
        if (sp->off > 0) return sp->off--, 0;
        if (sp->since_plain >= SPEC_REFRESH) return 0;
    }
    const int left = r->max_tokens - r->emitted - 1, have = sp->replay ? sp->n_replay - r->emitted : SPEC_MAX;
    if (d > left) d = left;
    if (d > have) d = have;
    return d > 0 ? d : 0;
}

/* x[0..d): the replayed tokens after the r->emitted already sent, a spec_corrupt share replaced. */
static void draft(server *S, request *r, int *x, int d) {
    for (int i = 0; i < d; i++) {
        int t = r->sp.replay[r->emitted + i];
        if ((double)(next_rand(&r->sp.rng) >> 11) * 0x1.0p-53 < S->o->spec_corrupt)
            t = (int)((t + 1 + next_rand(&r->sp.rng) % (uint64_t)(S->vocab - 1)) % (uint64_t)S->vocab);
        x[i] = t;
    }
}

static const float *row_logits(const server *S, const request *r, int i) {
    return i == 0 ? r->logits : S->spec_logits + (size_t)(i - 1) * S->vocab;
}

/* How many of y_1 .. y_{d+1} the step emits (into y): up to the first that differs from its
 * draft, ends the turn (end of generation, the budget) or is the one after the last draft. Each
 * y_k is drawn from row k's logits with the request's sampler and RNG, as a plain step would
 * draw it, and only those K draws are made: a sampled turn keeps a draft exactly when the
 * model's own sample is that token, and emits the plain run's samples (the same tokens for the
 * same seed in EXACT mode). *acc: drafts kept; *eog: the last of them ends generation (it is not
 * sent). */
static int tokens_to_take(server *S, request *r, const int *x, int d, int *y, int *acc, int *eog) {
    *acc = 0;
    for (int k = 1; k <= d + 1; k++) {
        y[k - 1] = sample_token_k(row_logits(S, r, k - 1), S->vocab, r->temperature, r->top_p, r->top_k, &r->rng,
                                  S->scratch, NULL);
        *eog = tok_is_eog(S->tok, y[k - 1]);
        if (k == d + 1) break;
        *acc += y[k - 1] == x[k];
        if (y[k - 1] != x[k] || *eog || r->emitted + k >= r->max_tokens) return k;
    }
    return d + 1;
}

static double ema(double avg, double x, int first) { return first ? x : (1.0 - SPEC_EMA) * avg + SPEC_EMA * x; }

static void pause_drafting(spec_req *sp) {
    sp->off = sp->backoff, sp->probe = 1;
    sp->backoff = sp->backoff * 2 > SPEC_PAUSE_MAX ? SPEC_PAUSE_MAX : sp->backoff * 2;
}

static void policy_after_draft(server *S, spec_req *sp, double per_tok, int acc, int d) {
    if (S->o->spec_always || sp->n_plain == 0) return;
    const int first = sp->draft_tpt <= 0.0;
    sp->draft_tpt = ema(sp->draft_tpt, per_tok, first);
    if (sp->draft_tpt > SPEC_LOSS * sp->plain_tpt) {
        sp->draft_tpt = 0.0;        /* the next count is measured afresh */
        if (sp->want > 1) {
            sp->want--;
            return;
        }
        pause_drafting(sp);
        return;
    }
    sp->backoff = SPEC_PAUSE0;
    if (acc == d && sp->want < S->o->spec_draft && sp->want < SPEC_MAX) {
        sp->want++;
        sp->draft_tpt = 0.0;
    }
}

void spec_plain_done(server *S, request *r, double seconds, uint64_t disk_bytes) {
    spec_req *sp = &r->sp;
    if (S->o->spec_draft <= 0) return;
    sp->steps_plain++, sp->t_plain += seconds, sp->bytes_plain += disk_bytes, sp->since_plain = 0;
    /* not measured: the turn's first (the caches still warming), one that also made a guess */
    if (sp->steps_plain == 1 || sp->guess >= 0) return;
    sp->plain_tpt = ema(sp->plain_tpt, seconds, sp->n_plain == 0);
    sp->n_plain++;
}

void spec_guess_check(server *S, request *r) {
    spec_req *sp = &r->sp;
    (void)S;
    if (sp->guess < 0) return;
    const int right = r->active && r->next_tok == sp->guess;
    sp->guess = -1, sp->guesses_right += right;
    if (!right) pause_drafting(sp);
    else sp->probe = 0, sp->want = 1, sp->draft_tpt = 0.0;
}

/* A lone guess of the token the coming plain step will sample (a try's first step). */
static void guess(server *S, request *r) {
    int g;
    if (r->sp.replay) draft(S, r, &g, 1);
    else if (model_mtp_draft(S->m, &S->kv, r->slot, r->next_tok, 1, &g) != 1) return;
    r->sp.guess = g, r->sp.guesses++;
}

int spec_decode(server *S, request *r) {
    int d = draft_count(S, r);
    const int s = r->slot, p = S->kv.slots[r->slot].n_pos;
    if (d > 0 && r->sp.probe && !S->o->spec_always) {
        guess(S, r);
        return 0;
    }
    if (d == 0 || srv_kv_grow(S, s, p + 1 + d) != 0) return 0;
    es_io_stats io0 = {0}, io1 = {0};
    if (S->m->es) es_io(S->m->es, &io0);
    const double t0 = now_s();     /* the drafting's own cost counts in the step */
    int x[SPEC_MAX + 1];
    x[0] = r->next_tok;
    if (r->sp.replay) draft(S, r, x + 1, d);
    else if ((d = model_mtp_draft(S->m, &S->kv, s, r->next_tok, d, x + 1)) <= 0) {
        if (d < 0) fprintf(stderr, "[API] the MTP block failed to draft for slot %d; a plain step\n", s);
        return 0;
    }
    if (model_trail(S->m, s, d, S->o->n_slots) != 0) return 0;
    for (int i = 0; i <= d; i++)
        S->fwd[i] = (fwd_row){ .slot = s, .pos = p + i, .token = x[i], .logits = (float *)row_logits(S, r, i),
                               .route_counts = r->route, .n_experts = r->experts, .no_heat = !r->heat };
    if (model_forward(S->m, &S->kv, S->fwd, d + 1) != 0) {
        fprintf(stderr, "[API] forward failed; ending id=%llu\n", (unsigned long long)r->id);
        srv_finish(S, r, 0);
        return 1;
    }
    int acc, eog, y[SPEC_MAX + 1];
    const int K = tokens_to_take(S, r, x, d, y, &acc, &eog);
    if (model_rollback(S->m, &S->kv, s, p + K) != p + K) {     /* cannot happen: the trail covers it */
        fprintf(stderr, "[API] slot %d could not be cut back after a verify batch; ending id=%llu\n", s,
                (unsigned long long)r->id);
        srv_finish(S, r, 0);
        return 1;
    }
    /* counted before the tokens go out: the last may end the turn, and its SPEC line with it */
    const double dt = now_s() - t0;
    if (S->m->es) es_io(S->m->es, &io1);
    spec_req *sp = &r->sp;
    const int sent = K - eog;
    sp->steps_draft++, sp->drafted += d, sp->accepted += acc, sp->emitted_draft += sent, sp->t_draft += dt;
    sp->bytes_draft += io1.disk_bytes - io0.disk_bytes, sp->since_plain++;
    policy_after_draft(S, sp, dt / K, acc, d);
    for (int k = 1; k <= K && r->active; k++) {
        if (k > 1) memcpy(r->logits, row_logits(S, r, k - 1), (size_t)S->vocab * sizeof(float));   /* for TOPK */
        srv_emit_token(S, r, y[k - 1]);
    }
    return 1;
}

void spec_turn_end(server *S, const request *r) {
    const spec_req *sp = &r->sp;
    if (S->record) {
        fputc('\n', S->record);
        fflush(S->record);
    }
    if (S->o->spec_draft <= 0) return;
    const long ep = sp->steps_plain, ed = sp->emitted_draft;
    out_line("SPEC %llu %ld %ld %ld %ld %.2f %ld %.2f %.2f %.2f %ld %ld", (unsigned long long)r->id, sp->steps_draft,
             sp->drafted, sp->accepted, ed, ed ? 1e3 * sp->t_draft / (double)ed : 0.0, ep,
             ep ? 1e3 * sp->t_plain / (double)ep : 0.0, ed ? (double)sp->bytes_draft / 1e6 / (double)ed : 0.0,
             ep ? (double)sp->bytes_plain / 1e6 / (double)ep : 0.0, sp->guesses, sp->guesses_right);
}
