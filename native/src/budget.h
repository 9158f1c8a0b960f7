/* budget.h — the engine's one memory budget and how it is split.
 * Owns: the figure (MEM_BUDGET_MB / --mem-budget, else the cgroup's limit or MemAvailable at
 * start, less a margin), the split of it into the dense weights (measured after loading them),
 * every slot's KV at its context, the forward's working buffers (prefill chunk, decode rows,
 * the experts held while they compute) and the expert cache, which gets what is left, and the
 * refusal at start when the dense weights and one slot's KV do not fit. */
#ifndef COLI_BUDGET_H
#define COLI_BUDGET_H
#include <stddef.h>

#include "model.h"

typedef struct {
    size_t total;           /* the budget, bytes */
    size_t limit, margin;   /* auto: the figure read and what was kept back from it */
    size_t others;          /* auto, from a cgroup: what its other processes held at start (off limit) */
    char source[64];        /* where total came from: "MEM_BUDGET_MB", "cgroup", "MemAvailable" */
    size_t dense;           /* the process after loading the dense weights (resident + mapped) */
    size_t kv;              /* the slots' KV share (every slot at its context, or what fits) */
    size_t work;            /* forward buffers + the experts held at once from disk */
    size_t experts;         /* the expert cache (SIZE_MAX: every expert, read at start) */
    size_t experts_all;     /* bytes of every expert in RAM */
    int expert_override;    /* EXPERT_RAM_MB set the expert share */
    int rows;               /* prefill rows per forward: their residual stream, routing and
                             * RoPE tables are held whole, so each layer reads its experts once */
    int chunk;              /* rows the attention, dense FFN and a group of experts take at once */
    int hold;               /* experts one acquisition holds at once from disk */
    int keep;               /* rows each expert's gate/up and down inputs stay allocated for
                             * between groups (the slots: a decode step's rows) */
    int spec_rows;          /* set before the split: drafted rows a verify batch may add
                             * (SPEC_DRAFT); a hybrid keeps a recurrent state for each (the trail) */
} mem_budget;

/* The figure: mb >= 0 (MEM_BUDGET_MB / --mem-budget) as given, else read from the cgroup / the
 * machine less a margin. */
void budget_figure(mem_budget *b, long mb);
/* Splits b->total for m serving n_slots slots of ctx positions (KV of kv_f16 rows), the expert
 * share expert_mb when >= 0 (EXPERT_RAM_MB). Call after model_load with an expert budget of 0
 * (nothing read yet): the dense part is measured. 0 ok; -1 with the figures in err when the
 * dense weights, the working buffers and one slot's KV do not fit. */
int budget_split(mem_budget *b, const model *m, int n_slots, int ctx, int kv_f16, long expert_mb, char *err,
                 size_t errlen);
/* The expert share into m's store (pin_mb >= 0: PIN_MB, else the whole share). 0, -1 a read failed. */
int budget_apply(const mem_budget *b, model *m, long pin_mb);
/* The expert cache borrows kv's unused share and kv gives it back before growing (experts.h
 * es_borrow, kv.h kv_set_reclaim), unless EXPERT_RAM_MB set the expert share; b NULL undoes it
 * (before kv goes away). */
void budget_lend(const mem_budget *b, model *m, kv_cache *kv);
/* The split as JSON members ("budget_mb":…,…) into out; its length. */
int budget_json(const mem_budget *b, char *out, size_t cap);
#endif
