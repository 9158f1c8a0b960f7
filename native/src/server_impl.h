/* server_impl.h — what the serve files share: the request and server records and the calls
 * between them. Private to server*.c; the interface of serve mode is server.h.
 * Owns: the split of serve mode into its files —
 *   server_wire.c    stdin framing and parsing of command lines (SUBMIT header, STOP, CANCEL),
 *   server_submit.c  a SUBMIT's admission, tokenizing, prefix reuse and prefill,
 *   server_report.c  the telemetry lines, token frames and the MODEL JSON,
 *   server_spec.c    speculative decode steps: drafts, the verify batch, the policy,
 *   server.c         setup, signals, the loop, decode steps and the end of a turn. */
#ifndef COLI_SERVER_IMPL_H
#define COLI_SERVER_IMPL_H
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "grammar.h"
#include "sampler.h"
#include "server.h"
#include "telemetry.h"
#include "utf8stream.h"

#define MAX_LINE      (1 << 20)     /* longer command lines are refused and skipped */
#define MAX_LOGPROBS  32

/* A request's speculative decoding (server_spec.c): the policy's measurements and the counts
 * its SPEC line reports. */
typedef struct {
    int want;                   /* drafted tokens the next drafting step tries (1..spec_draft) */
    int off;                    /* plain steps left before drafting is tried again */
    int backoff;                /* the next pause after drafting loses */
    double plain_tpt, draft_tpt;    /* moving averages of seconds per emitted token */
    int n_plain, since_plain;   /* plain steps measured; drafting steps since the last plain one */
    int probe;                  /* 1: the next try is a lone guess, checked against a plain step's token */
    int guess;                  /* that guess while its plain step runs, else -1 */
    long guesses, guesses_right;
    long steps_draft, steps_plain, drafted, accepted, emitted_draft;
    double t_draft, t_plain;
    uint64_t bytes_draft, bytes_plain;  /* expert bytes read from disk in each kind of step */
    uint64_t rng;
    const int *replay;          /* this turn's line of SPEC_REPLAY (NULL: none left) */
    int n_replay;
} spec_req;

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
    spec_req sp;
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
    float *spec_logits;         /* SPEC_MAX x vocab: the drafted rows' logits */
    int *replay;                /* SPEC_REPLAY's tokens, line after line */
    int *replay_line, n_lines;  /* where each line starts (n_lines + 1 offsets) */
    int next_line;              /* the line the next turn replays */
    FILE *record;               /* SPEC_RECORD */
} server;

/* A SUBMIT's header fields (mux-protocol.md §5.1). */
typedef struct {
    uint64_t id, slot, bytes, max_tokens, gbytes, seed, experts, top_k;
    double temperature, top_p;
    int have_seed, logprobs, have_logprobs, have_experts, have_top_k, lptext, have_lptext;
    int routes, have_routes, heat, have_heat;
    int grammar;                /* grammar=1: the gbytes are a CGD1 DFA constraining sampling */
} submit_hdr;

/* server.c */
int srv_terminating(void);                          /* SIGTERM seen */
int srv_find_active(const server *S, uint64_t id);  /* the slot running id, else -1 */
void srv_finish(server *S, request *r, int length_limited);
void srv_stop_cancel(server *S, uint64_t id, int cancel);
void srv_take_token(server *S, request *r);
/* Acts on tok, already drawn from r->logits (srv_take_token's second half: end of generation,
 * or DATA and either the end of the budget or a row in the next decode step). */
void srv_emit_token(server *S, request *r, int tok);
int srv_any_active(const server *S);

/* server_wire.c */
void wire_bad_request(void);
/* Reads stdin and runs the commands it holds (busy: never wait); -1 when a signal cut the wait. */
int wire_read_commands(server *S, int busy);
/* The payload after a valid SUBMIT header (header, then bytes + gbytes), consumed from the
 * buffer, or NULL after answering (malformed header, bad frame) or at EOF. */
const char *wire_submit_payload(server *S, char *args, submit_hdr *h);

/* server_submit.c */
void cmd_submit(server *S, const submit_hdr *h, const char *payload);
/* Room for n_pos positions in slot s, freeing idle slots' histories when the KV share is full. */
int srv_kv_grow(server *S, int s, int n_pos);

/* server_spec.c */
int spec_init(server *S);       /* 0, or -1 with the reason on stderr */
void spec_free(server *S);
void spec_start(server *S, request *r);   /* a new turn's policy state */
/* One decode step of the only active request with drafted tokens, when the policy drafts now:
 * 1 done; 0 not taken (the caller runs a plain step and reports it with spec_plain_done). */
int spec_decode(server *S, request *r);
void spec_plain_done(server *S, request *r, double seconds, uint64_t disk_bytes);
void spec_guess_check(server *S, request *r);  /* after a plain step's token: its lone guess right? */
void spec_recorded(server *S, int tok);    /* SPEC_RECORD: an emitted token */
/* The end of a turn: its SPEC line (speculation on), the end of its SPEC_RECORD line. */
void spec_turn_end(server *S, const request *r);

/* server_report.c */
void rep_hits(server *S);
void rep_emap(server *S);
void rep_tiers(server *S);
void rep_hwinfo(void);
void rep_model(server *S);
/* DATA for one sampled token (last: flush held UTF-8), TOPK, the live telemetry. */
void rep_token(server *S, request *r, int tok, int last);
/* The turn-end block before DONE: HWINFO .. IOSTAT, then REPIN. */
void rep_turn_end(server *S, const request *r, double t_end);
void rep_repin(server *S);      /* REPIN lines for the experts the store moved */
void rep_routestep(server *S, const request *r);   /* routes=2: the forwarded token's selections */
#endif
