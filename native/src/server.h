/* server.h — the mux serve protocol (colibri-compatible, SERVE=1 SERVE_BATCH=1).
 * Owns: reading commands from stdin (poll between decode steps), SUBMIT validation
 * and admission, per-slot prefix reuse and serial prefill, continuously batched
 * decode, per-turn telemetry, KV slot (and recurrent state) persistence and shutdown (EOF, BAD_FRAME,
 * SIGINT, SIGTERM). Wire format: native/README.md and shared/reference/mux-protocol.md. */
#ifndef COLI_SERVER_H
#define COLI_SERVER_H
#include <stdint.h>
#include "budget.h"
#include "kv.h"
#include "model.h"

#define SPEC_MAX 4      /* drafted tokens a step at most (SPEC_DRAFT) */

typedef struct {
    int n_slots;            /* KV_SLOTS, 1..64 */
    int ctx;                /* per-slot context (CTX) */
    int kv_f16;             /* KV_TYPE: 1 fp16 rows (default), 0 float32 */
    int kvsave;             /* 1: load slot files at start, save at DONE and CANCEL */
    char kv_base[1200];     /* slot s lives in "<kv_base>.<s>" */
    int serve_topk;         /* SERVE_TOPK=1: a TOPK line after each DATA */
    int usage_save;         /* 0: never write the usage file */
    int ckpt_every;         /* STATE_CKPT_EVERY: a hybrid's prefill checkpoints its recurrent state
                             * every this many positions (and every turn at its end) */
    const mem_budget *budget;   /* the split: the KV share, the prefill chunk (MODEL reports it) */
    /* Speculative decoding (server_spec.c): up to spec_draft drafted tokens a step (0: off);
     * spec_replay: the draft source, a recorded run's tokens (SPEC_REPLAY) with a spec_corrupt
     * share replaced (a bench's stand-in for a draft model with a set acceptance); spec_always:
     * draft every step at spec_draft (SPEC_POLICY=always, to measure the verify path alone);
     * spec_record: write each emitted token's id to this file (SPEC_RECORD). */
    int spec_draft, spec_always;
    double spec_corrupt;
    const char *spec_replay, *spec_record;
} serve_opts;

/* Runs the protocol until EOF / BAD_FRAME / SIGTERM; returns the process exit code. */
int serve_mux(model *m, const serve_opts *o);

/* Forwards ids[from..n) of slot s (whose history must hold exactly `from` positions)
 * in chunks of `chunk` rows with n_experts routed experts per token (0: the model's);
 * logits of the last row go to `logits` (vocab floats); no_heat: fwd_row.no_heat.
 * rows: scratch of at least `chunk` entries. 0 ok, -1 on OOM / forward failure. */
int prefill_tail(model *m, kv_cache *kv, int s, const int *ids, int from, int n,
                 float *logits, uint32_t *route_counts, int n_experts, int no_heat, fwd_row *rows,
                 int chunk);
#endif
