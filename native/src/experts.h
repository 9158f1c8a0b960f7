/* experts.h — the expert store: where each routed expert's weights live.
 * Owns: tiers (0 disk: read on use, not kept; 1 RAM: LRU under EXPERT_RAM_MB, plus
 * pinned experts within PIN_MB; 2 VRAM: reserved, empty until a GPU backend),
 * heat (cumulative selection counts, usage file), HITS bitmap, REPIN events.
 * Rows are the MoE layers in order (row != absolute layer when dense layers lead). */
#ifndef COLI_EXPERTS_H
#define COLI_EXPERTS_H
#include <stddef.h>
#include <stdint.h>
#include "gguf.h"
#include "quant.h"

typedef struct {
    size_t ram_budget;      /* bytes for LRU + pinned experts; SIZE_MAX = all fit */
    size_t pin_budget;      /* bytes of hottest experts kept pinned (PIN_MB) */
    char usage_path[1024];  /* "" = no usage file */
    int usage_save;         /* 0 = load but never write */
    int exact;              /* EXACT=1: experts stay in the file's row layout (not packed), for
                             * float-activation matmuls (quant.h qact.exact) */
    int no_lookahead;       /* EXPERT_LOOKAHEAD=0: no reads ahead of the next layer's guess */
    int hold_max;           /* experts one acquisition (or one lookahead) may hold at once from
                             * disk, and scratch copies kept for reuse (2 x this); 0: no limit */
    int mtp;                /* load the file's MTP block as a draft head (model_mtp_draft) */
} expert_opts;

typedef struct { qmat gate, up, down; } expert_w;   /* gate/up: d_exp x d_model, down: d_model x d_exp */

/* Source of one MoE layer's stacked tensors (blk.N.ffn_{gate,up,down}_exps.weight), or of its
 * one tensor per expert (older llama.cpp Mixtral files: blk.N.ffn_{gate,up,down}.E.weight). */
typedef struct {
    int layer;              /* absolute layer index */
    const gguf_tensor *gate, *up, *down;    /* stacked [*, *, n_experts]; per expert: expert 0's */
    int fused;              /* gate is blk.N.ffn_gate_up_exps [d_model, 2 x d_exp, n_experts]: each
                             * expert's gate rows, then its up rows (up is gate) */
    const gguf_tensor **per;    /* NULL (stacked), or per[k * n_experts + e]: expert e's 2-D tensor
                                 * of k = 0 gate, 1 up, 2 down (owned by the caller) */
} expert_layer_src;

typedef void (*repin_cb)(void *ud, int layer, int eid, int old_tier, int gpu);

typedef struct expert_store expert_store;

expert_store *es_create(const gguf_file *g, const expert_layer_src *rows, int n_rows,
                        int n_experts, const expert_opts *o, uint32_t engine_id,
                        int n_layers_total, char *err, size_t errlen);
void es_free(expert_store *s);

/* Weights of expert e of MoE row r. Resident experts are returned in place; others are
 * read from the file (pread) into a buffer owned by the store until es_release.
 * Updates LRU, hit/miss counters and adds read time to *t_read_s. Not thread-safe:
 * call from the forward's serial part. */
int es_acquire(expert_store *s, int r, int e, expert_w *out, double *t_read_s);
/* es_acquire for the distinct experts list[0..n) of row r, outs indexed by expert id: the
 * misses are read and packed in parallel on the pool. 0 ok; -1 on failure, then none of
 * them is held. */
int es_acquire_many(expert_store *s, int r, const int *list, int n, expert_w *outs, double *t_read_s);
/* The same in two halves, so that reads overlap compute: begin fills outs for the experts in
 * RAM (ready[k] = 1) and queues the misses on the I/O lanes (ready[k] = 0; each is held from
 * now on); finish waits for them and fills the rest (t_read_s: the wait). Between the two the
 * caller may compute with the ready ones. Finish -1: a read failed, then none is held. */
int es_acquire_begin(expert_store *s, int r, const int *list, int n, expert_w *outs, int *ready);
int es_acquire_finish(expert_store *s, int r, const int *list, int n, expert_w *outs, int *ready, double *t_read_s);
void es_release(expert_store *s, int r, int e);
/* Lookahead: starts reading row r's experts list[0..n) that are not in RAM (the guess of the
 * next layer's selection), into the budget when it admits them, else into scratch copies that
 * serve row r's next acquisition only. Returns at once. */
void es_read_ahead(expert_store *s, int r, const int *list, int n);

/* Cumulative I/O counters of the store (a turn's figures are differences). */
typedef struct {
    uint64_t disk_bytes;    /* expert bytes read from the file */
    uint64_t ideal_bytes;   /* bytes of every acquisition: what reading with nothing cached costs */
    uint64_t hits, acquisitions;
    double stall_s;         /* time the forward waited for reads */
    uint64_t ahead_issued, ahead_used;  /* lookahead reads issued / acquired before retired */
} es_io_stats;
void es_io(const expert_store *s, es_io_stats *out);
/* Non-zero when misses read from disk (a RAM budget) and the lookahead is on. */
int es_lookahead(const expert_store *s);

/* Routing bookkeeping: heat count +1 and HITS bit set. */
void es_note_selected(expert_store *s, int r, int e);
/* The same; heat == 0 sets the HITS bit only (SUBMIT heat=0: the cumulative counts behind
 * EMAP heat, the usage file and pinning stay as they were). */
void es_note(expert_store *s, int r, int e, int heat);

int es_rows(const expert_store *s);
int es_cols(const expert_store *s);
void es_emap(const expert_store *s, uint8_t *out);       /* rows*cols bytes: tier<<6 | heat */
void es_hits_take(expert_store *s, uint8_t *bits);       /* ceil(rows*cols/8) bytes LSB-first; clears */
void es_tiers(const expert_store *s, int *vram, int *ram, int *disk, double *vram_gb, double *ram_gb);
/* Cache hit percentage since the last call (then resets the window). */
double es_hit_pct_take(expert_store *s);
/* Recompute the pinned set from heat within pin_budget; calls cb for each change. */
void es_repin(expert_store *s, repin_cb cb, void *ud);
/* Usage file (.coli_usage format, atomic tmp+rename, one writer at a time through an flock
 * on <usage>.lock): writes the file's counts plus this engine's selections since its last
 * read or write, and takes the sum as its own counts. 0 ok, ES_USAGE_BUSY: another engine held the lock too long (skipped),
 * -1 an I/O error. */
#define ES_USAGE_BUSY 1
int es_usage_save(expert_store *s);
size_t es_expert_bytes(const expert_store *s);           /* bytes of one expert (gate+up+down) */
size_t es_all_bytes(const expert_store *s);              /* bytes of every expert in RAM */
/* The budgets set after creation (the memory budget's split, once the rest is measured):
 * ram_budget SIZE_MAX reads every expert now; otherwise the hottest are pinned within
 * pin_budget. Scratch copies beyond 2 x hold_max are freed. 0 ok, -1 a read failed. */
int es_set_budget(expert_store *s, size_t ram_budget, size_t pin_budget, int hold_max);
/* Borrowing: the cache may also fill the KV share's unused part (kv_share - *kv_used, read at
 * each admission), and gives it back through es_kv_room before the KV buffers grow. kv_used
 * NULL: its own budget only (also before the KV cache goes away). No effect at SIZE_MAX. */
void es_borrow(expert_store *s, const size_t *kv_used, size_t kv_share);
/* The KV cache is about to use kv_after bytes (a kv_reclaim_fn, store as ud): evicts residents
 * until ram_used + kv_after <= ram_budget + kv_share; unpinned ones first, then pinned ones,
 * least selected first; never an acquired or loading one. Between forwards only. */
void es_kv_room(void *store, size_t kv_after);
size_t es_borrowable(const expert_store *s);    /* the most it may borrow (the KV share; 0: none) */
size_t es_borrowed(const expert_store *s);      /* bytes it holds beyond ram_budget now */
/* experts an acquisition may ask for at once (hold_max; the row's width when unlimited) */
int es_hold_max(const expert_store *s);
#endif
