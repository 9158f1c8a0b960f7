/* server_report.c — what serve mode writes besides ACCEPT / ERROR.
 * Owns: the expert telemetry lines (HITS, EMAP, TIERS, their live cadence while decoding),
 * the turn-end block (HWINFO, PERF, ENTROPY, ROUTES, GPUS, PROF, IOSTAT, REPIN), the token
 * frames (DATA with its logprobs tail, TOPK), and the MODEL line's hand-written JSON. */
#include "server_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "budget.h"

#define HITS_EVERY    6             /* a HITS line every 6 decoded tokens, engine-wide */
#define LIVE_EVERY_S  1.0           /* while decoding, HITS and TIERS + EMAP at least this often: a
                                     * big model under a budget decodes ~1 token/s, and a turn-end
                                     * block alone left the atlas still for minutes */
#define TOPK_N        5

/* ------------------------------------------------------------------ expert telemetry */

static void hex_line(server *S, const char *kind, const uint8_t *bytes, size_t n) {
    hex_encode(bytes, n, S->hex);
    out_line("%s %d %d %s", kind, S->rows, S->cols, S->hex);
}

void rep_hits(server *S) {
    if (!S->m->es) { out_line("HITS 0 0 "); return; }
    es_hits_take(S->m->es, S->hits);
    hex_line(S, "HITS", S->hits, ((size_t)S->rows * S->cols + 7) / 8);
}

void rep_emap(server *S) {
    if (!S->m->es) { out_line("EMAP 0 0 "); return; }
    es_emap(S->m->es, S->emap);
    hex_line(S, "EMAP", S->emap, (size_t)S->rows * S->cols);
}

void rep_tiers(server *S) {
    int v = 0, r = 0, d = 0;
    double vgb = 0, rgb = 0;
    if (S->m->es) es_tiers(S->m->es, &v, &r, &d, &vgb, &rgb);
    out_line("TIERS %d %d %d %.2f %.2f", v, r, d, vgb, rgb);
}

/* The live telemetry of a decode step: HITS every HITS_EVERY tokens or LIVE_EVERY_S, and the
 * tiers with their heat (TIERS, EMAP) every LIVE_EVERY_S, so that pages watching the experts
 * move as tokens flow; the turn-end block still carries all of them (mux-protocol.md). */
static void rep_live(server *S) {
    const double t = now_s();
    if (++S->decoded % HITS_EVERY == 0 || t - S->t_hits >= LIVE_EVERY_S) {
        rep_hits(S);
        S->t_hits = t;
    }
    if (t - S->t_emap >= LIVE_EVERY_S) {
        rep_tiers(S);
        rep_emap(S);
        S->t_emap = t;
    }
}

void rep_hwinfo(void) {
    char hw[512];
    hw_line(hw, sizeof hw);
    out_raw_line(hw, strlen(hw));
}

/* ------------------------------------------------------------------ turn end */

static void rep_entropy(server *S, const request *r) {
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
static void rep_routes(server *S, const request *r) {
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
void rep_routestep(server *S, const request *r) {
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
static void rep_iostat(server *S, const request *r) {
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

static void on_repin(void *ud, int layer, int eid, int old_tier, int gpu) {
    (void)ud;
    out_line("REPIN %d %d %d %d", layer, eid, old_tier, gpu);
}

/* SLOTMEM <slot> <kv_bytes> <state_bytes> <checkpoints>: what the slot holds now — its K/V rows
 * (the positions reserved), a hybrid's recurrent state with its checkpoints (0 otherwise). */
static void rep_slotmem(server *S, int s) {
    int n_ckpt = 0;
    const size_t kvb = (size_t)S->kv.slots[s].cap * kv_pos_bytes(&S->kv);
    const size_t stb = model_slot_state_bytes(S->m, s, &n_ckpt);
    out_line("SLOTMEM %d %zu %zu %d", s, kvb, stb, n_ckpt);
}

void rep_turn_end(server *S, const request *r, double t_end) {
    perf_counters d = S->m->perf;
    d.t_edisk -= r->perf0.t_edisk;
    d.t_emm -= r->perf0.t_emm;
    d.t_attn -= r->perf0.t_attn;
    d.t_head -= r->perf0.t_head;
    d.forwards -= r->perf0.forwards;
    double wall = t_end - r->t_decode0;

    rep_hwinfo();
    out_line("PERF %llu %.3f %.3f %.3f %.3f %.3f %.3f %.3f", (unsigned long long)r->id,
             t_end - r->t_accept, d.t_edisk, 0.0, d.t_emm, d.t_attn, 0.0, d.t_head);
    rep_entropy(S, r);
    if (r->routes) rep_routes(S, r);
    out_line("GPUS 0");
    rep_tiers(S);
    rep_emap(S);
    rep_hits(S);
    out_line("PROF %.3f %d %d %.3f %.3f %.3f %.3f %.3f %ld", wall, r->n_prompt, r->emitted,
             d.t_edisk, 0.0, d.t_emm, d.t_attn, d.t_head, d.forwards);
    rep_iostat(S, r);
    rep_slotmem(S, r->slot);
}


void rep_repin(server *S) {
    if (S->m->es) es_repin(S->m->es, on_repin, NULL);
}

/* ------------------------------------------------------------------ token frames */

/* hex of token t's bytes (at most 256; "-" for none or a control token) appended to line. */
static size_t put_token_hex(server *S, char *line, size_t cap, const char *prefix, int t) {
    int tl = 0;
    const char *tp = t >= 0 && !tok_is_control(S->tok, t) ? tok_piece(S->tok, t, &tl) : "";
    if (tl > 256) tl = 256;
    char hx[2 * 256 + 1];
    hex_encode((const uint8_t *)tp, (size_t)tl, hx);
    return (size_t)snprintf(line, cap, "%s%s", prefix, tl ? hx : "-");
}

/* DATA <id> <n> <logprob> <k> (<id> <lp>)*k [hex...]\n<bytes>: the logprobs=k frame. */
static void rep_data_logprobs(server *S, const request *r, int tok, const char *text, int n) {
    int ids[MAX_LOGPROBS];
    float lps[MAX_LOGPROBS];
    /* under a grammar: candidates and log-probabilities of the masked distribution */
    int k = topk_logprobs(r->logits, S->vocab, r->logprobs, r->allow, ids, lps);
    double lse = logsumexp_allowed(r->logits, S->vocab, r->allow);
    size_t hcap = 64 + (size_t)r->logprobs * 32 + (size_t)n + (r->lptext ? (size_t)(r->logprobs + 1) * 514 : 0);
    char *line = malloc(hcap);
    if (!line) return;
    size_t len = (size_t)snprintf(line, hcap, "DATA %llu %d %.4f %d", (unsigned long long)r->id, n,
                                  (double)r->logits[tok] - lse, k);
    for (int i = 0; i < k; i++)
        len += (size_t)snprintf(line + len, hcap - len, " %d %.4f", ids[i], (double)lps[i]);
    if (r->lptext)                      /* the sampled token's bytes, then each candidate's */
        for (int i = -1; i < k; i++)
            len += put_token_hex(S, line + len, hcap - len, " ", i < 0 ? tok : ids[i]);
    line[len++] = '\n';
    memcpy(line + len, text, (size_t)n);
    out_raw_line(line, len + (size_t)n);
    free(line);
}

/* TOPK <id> <k> (<lp> <hex>)*k (SERVE_TOPK=1). Control tokens show their bytes here. */
static void rep_topk(server *S, const request *r) {
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
        len += (size_t)snprintf(line + len, sizeof line - len, " %.4f %s", (double)lps[i], tl ? hx : "-");
    }
    out_raw_line(line, len);
}

void rep_token(server *S, request *r, int tok, int last) {
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
    if (r->logprobs > 0) rep_data_logprobs(S, r, tok, buf, n);
    else out_data(r->id, buf, n);
    if (buf != stackbuf) free(buf);
    if (S->o->serve_topk) rep_topk(S, r);
    rep_live(S);
}

/* ------------------------------------------------------------------ MODEL */

typedef struct {
    char *b;
    size_t cap, len;
} jbuf;

static void jb_printf(jbuf *j, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void jb_printf(jbuf *j, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(j->b + j->len, j->cap - j->len, fmt, ap);
    va_end(ap);
    if (n > 0) j->len += (size_t)n < j->cap - j->len ? (size_t)n : j->cap - j->len - 1;
}

/* The multi-byte UTF-8 sequence at p: its length when well-formed, else 0. */
static int utf8_seq(const unsigned char *p) {
    unsigned c = *p;
    int n = c >= 0xf0 && c <= 0xf4 ? 4 : c >= 0xe0 ? 3 : c >= 0xc2 && c < 0xe0 ? 2 : 0;
    for (int i = 1; i < n; i++)
        if ((p[i] & 0xc0) != 0x80) return 0;
    if (n == 3 && ((c == 0xe0 && p[1] < 0xa0) || (c == 0xed && p[1] > 0x9f))) return 0;
    if (n == 4 && ((c == 0xf0 && p[1] < 0x90) || (c == 0xf4 && p[1] > 0x8f))) return 0;
    return n;
}

static void jb_put(jbuf *j, const char *s, size_t n) {
    for (size_t i = 0; i < n && j->len + 1 < j->cap; i++) j->b[j->len++] = s[i];
    j->b[j->len] = 0;
}

/* A JSON string of s (NULL: null); ill-formed UTF-8 becomes U+FFFD. */
static void json_str(jbuf *j, const char *s) {
    if (!s) { jb_put(j, "null", 4); return; }
    jb_put(j, "\"", 1);
    for (const unsigned char *p = (const unsigned char *)s; *p;) {
        unsigned c = *p;
        char esc[8];
        int n = c < 0x80 ? 1 : utf8_seq(p);
        if (c == '"' || c == '\\') snprintf(esc, sizeof esc, "\\%c", (char)c);
        else if (c == '\n' || c == '\t' || c == '\r') snprintf(esc, sizeof esc, "\\%c", c == '\n' ? 'n' : c == '\t' ? 't' : 'r');
        else if (c < 0x20 || c == 0x7f) snprintf(esc, sizeof esc, "\\u%04x", c);
        else if (n == 0) snprintf(esc, sizeof esc, "\\ufffd");
        else { jb_put(j, (const char *)p, (size_t)n); p += n; continue; }
        jb_put(j, esc, strlen(esc));
        p++;
    }
    jb_put(j, "\"", 1);
}

/* "sampling": the file's recommended settings, or null. */
static void json_sampling(jbuf *j, const model *m) {
    if (!(m->sampling.has_temp || m->sampling.has_top_p || m->sampling.has_top_k)) {
        jb_printf(j, "null");
        return;
    }
    const char *sep = "{";
    if (m->sampling.has_temp) {
        jb_printf(j, "%s\"temperature\":%.6g", sep, (double)m->sampling.temp);
        sep = ",";
    }
    if (m->sampling.has_top_p) {
        jb_printf(j, "%s\"top_p\":%.6g", sep, (double)m->sampling.top_p);
        sep = ",";
    }
    if (m->sampling.has_top_k) jb_printf(j, "%s\"top_k\":%d", sep, m->sampling.top_k);
    jb_printf(j, "}");
}

static void json_model_body(server *S, jbuf *j, const char *bt, const char *et) {
    const model *m = S->m;
    jb_printf(j, "MODEL {\"name\":");
    json_str(j, m->name);
    jb_printf(j, ",\"arch\":");
    json_str(j, m->arch);
    jb_printf(j, ",\"n_layers\":%d,\"n_experts\":%d,\"top_k\":%d,\"experts_min\":%d,"
                 "\"experts_max\":%d,\"ctx\":%d,\"n_vocab\":%d,\"bos\":",
              m->c.n_layers, m->c.n_experts, m->c.n_experts ? m->c.top_k : 0,
              m->c.n_experts ? 1 : 0, m->c.n_experts, S->o->ctx, S->vocab);
    json_str(j, bt);
    jb_printf(j, ",\"eos\":");
    json_str(j, et);
    jb_printf(j, ",\"chat_template\":");
    json_str(j, m->chat_template);
    jb_printf(j, ",\"sampling\":");
    json_sampling(j, m);
    /* grammar: SUBMIT takes grammar=1 with a DFA of this format as its gbytes (grammar.h) */
    /* routes: the highest routes= level SUBMIT takes (2: per-token ROUTESTEP lines) */
    jb_printf(j, ",\"slots\":%d,\"grammar\":\"CGD1\",\"routes\":2", S->o->n_slots);
    /* the layers that keep K/V rows (a hybrid's attention layers) and what a position takes in them */
    jb_printf(j, ",\"kv\":{\"layers\":%d,\"pos_bytes\":%zu}", kv_layers(&S->kv), kv_pos_bytes(&S->kv));
    if (model_state_bytes(m))           /* a hybrid's per-slot state, its checkpoints (SLOTMEM: held now) */
        jb_printf(j, ",\"recurrent_state\":{\"bytes\":%zu,\"checkpoints\":%d,\"every\":%d}",
                  model_state_bytes(m), MODEL_STATE_CKPTS, S->o->ckpt_every);
    if (S->o->budget) {                 /* how the memory budget was split (budget.h) */
        jb_printf(j, ",\"memory\":{");
        j->len += (size_t)budget_json(S->o->budget, j->b + j->len, j->cap - j->len);
        jb_printf(j, "}");
    }
    jb_printf(j, "}");
}

void rep_model(server *S) {
    const model *m = S->m;
    const char *tmpl = m->chat_template ? m->chat_template : "";
    int bos = tok_bos(S->tok), eos = tok_eos(S->tok);
    const char *bt = bos >= 0 ? tok_text(S->tok, bos) : NULL;
    const char *et = eos >= 0 ? tok_text(S->tok, eos) : NULL;
    jbuf j = { .cap = 2048 + 6 * (strlen(tmpl) + strlen(m->name) + strlen(m->arch)) };
    j.cap += 6 * ((bt ? strlen(bt) : 0) + (et ? strlen(et) : 0));
    if (!(j.b = malloc(j.cap))) return;
    json_model_body(S, &j, bt, et);
    out_raw_line(j.b, j.len);
    free(j.b);
}
