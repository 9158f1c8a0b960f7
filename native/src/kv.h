/* kv.h — KV slots: per-slot token history and per-layer K/V rows.
 * Owns: growth of slot buffers, truncate-and-extend bookkeeping, the element type of the
 * rows (float32, or fp16: half the memory; values are rounded to nearest even once, when
 * stored, and read back exactly), the on-disk slot files (KVSAVE), and the byte budget of all
 * slots together (the KV share of the engine's memory budget). A slot grows lazily so 16 slots x
 * large CTX costs memory only for what conversations actually use. */
#ifndef COLI_KV_H
#define COLI_KV_H
#include <stddef.h>
#include <stdint.h>

typedef struct {
    int *tokens;    /* history: tokens whose K/V are stored, n_pos of them */
    int n_pos;
    int cap;        /* positions allocated (tokens, layers without a window) */
    void **k;       /* [n_layers] -> cap * k_dim elements (float, or uint16_t fp16); NULL: rowless */
    void **v;       /* [n_layers] -> cap * v_dim elements */
    /* Sliding-window layers hold rows wbase .. n_pos - 1 only, row pos at index pos - wbase of
     * a wcap-row buffer (kv_reserve_from slides it when full). A checkpoint keeps the window
     * that ended at ckpos (rows cklo .. ckpos - 1; -1: none): kv_rewind restores it. */
    int wbase, wcap, ckpos, cklo;
    void **ck, **cv;    /* [n_layers] -> (window - 1) rows, windowed layers only (NULL until used) */
} kv_slot;

/* Called before the slots' buffers grow, with the bytes they will then take: a borrower of the
 * share's unused part (the expert store, experts.h es_kv_room) gives it back. */
typedef void (*kv_reclaim_fn)(void *ud, size_t used_after);

typedef struct {
    int n_slots, ctx, n_layers;
    int k_dim, v_dim;   /* K and V row widths (KV heads x key / value head width): they may differ */
    int f16;        /* elements are fp16 (kv_set_f16), else float */
    int window;     /* the windowed layers' window (keys p - window + 1 .. p); 0: none */
    uint8_t *windowed;  /* [n_layers]: 1 for a sliding-window layer; NULL: none */
    uint8_t *rowless;   /* [n_layers]: 1 for a layer that keeps no rows (a hybrid's recurrent
                         * layers: their state is the model's); NULL: none */
    size_t budget;  /* bytes all slots' buffers may take together (kv_set_budget); 0: no limit */
    size_t used;    /* bytes the slots' buffers take now (windows and checkpoints included) */
    kv_reclaim_fn reclaim;  /* kv_set_reclaim; NULL: none */
    void *reclaim_ud;
    kv_slot *slots;
} kv_cache;

/* A cache of float32 rows, K rows k_dim and V rows v_dim wide; kv_set_f16 switches it to fp16
 * before anything is stored. kv_init: both kv_dim wide. */
int kv_init_kv(kv_cache *c, int n_slots, int ctx, int n_layers, int k_dim, int v_dim);
int kv_init(kv_cache *c, int n_slots, int ctx, int n_layers, int kv_dim);
/* 0 ok, -1 when a slot already holds rows. */
int kv_set_f16(kv_cache *c, int on);
/* Layer `layer` attends over a sliding window of `window` keys and keeps only those rows (every
 * windowed layer of a cache has the same window). Before anything is stored: 0, or -1. */
int kv_set_window(kv_cache *c, int layer, int window);
/* Layer `layer` keeps no K/V rows (a recurrent layer of a hybrid): nothing is allocated, counted
 * or saved for it. Before anything is stored, not on a windowed layer: 0, or -1. */
int kv_set_rowless(kv_cache *c, int layer);
/* Layers that keep K/V rows (all but the rowless ones). */
int kv_layers(const kv_cache *c);
/* The KV_TYPE setting: 1 fp16 rows (unset, empty or "f16"), 0 float32 ("f32"), -1 anything else. */
int kv_type_f16(const char *setting);
void kv_free(kv_cache *c);
/* Make room for n_pos positions in slot s (n_pos <= ctx), for a forward whose first row is at
 * `first` (windowed layers keep rows first - window + 1 .. and may drop older ones). kv_reserve:
 * first = the slot's n_pos. 0 ok, -1 OOM, KV_OVER_BUDGET when the slots' buffers would pass the
 * cache's budget (nothing changed then). */
#define KV_OVER_BUDGET (-2)
int kv_reserve_from(kv_cache *c, int s, int first, int n_pos);
int kv_reserve(kv_cache *c, int s, int n_pos);
/* Bytes one position takes in the layers that grow with the context (all but the sliding-window
 * and rowless ones: K and V rows) and its token id. */
size_t kv_pos_bytes(const kv_cache *c);
/* The share all slots' buffers may take together (0: no limit). */
void kv_set_budget(kv_cache *c, size_t bytes);
/* fn(ud, bytes) before every growth of the buffers (NULL: none). Growth happens only in
 * kv_reserve / kv_reserve_from / kv_checkpoint / kv_load, which run between forwards (model.h
 * model_forward reserves its rows before its layers run), never while experts are acquired. */
void kv_set_reclaim(kv_cache *c, kv_reclaim_fn fn, void *ud);
/* Positions slot s could hold within the budget if it grew now (ctx when there is no budget). */
int kv_room(const kv_cache *c, int s);
/* Frees slot s's buffers and forgets its history (its share goes back to the others). */
void kv_release(kv_cache *c, int s);
static inline size_t kv_elt(const kv_cache *c) { return c->f16 ? 2 : 4; }
/* The buffer row of position pos in layer `layer` of slot s. */
static inline size_t kv_row(const kv_cache *c, int s, int layer, int pos) {
    return (size_t)(c->windowed && c->windowed[layer] ? pos - c->slots[s].wbase : pos);
}
/* Row `pos` of layer `layer` of slot s: k_dim (v_dim) elements of the cache's type (a windowed
 * layer: pos must be one of the rows it holds). */
static inline void *kv_k(kv_cache *c, int s, int layer, int pos) {
    return (char *)c->slots[s].k[layer] + kv_row(c, s, layer, pos) * (size_t)c->k_dim * kv_elt(c);
}
static inline void *kv_v(kv_cache *c, int s, int layer, int pos) {
    return (char *)c->slots[s].v[layer] + kv_row(c, s, layer, pos) * (size_t)c->v_dim * kv_elt(c);
}
/* Stores float rows k (k_dim values), v (v_dim) at (s, layer, pos), converting to fp16. */
void kv_store(kv_cache *c, int s, int layer, int pos, const float *k, const float *v);
/* Length of the common prefix of the slot history and ids[0..n). */
int kv_common_prefix(const kv_cache *c, int s, const int *ids, int n);
/* Drop positions >= n_keep (kv_rewind's, when the cache has windowed layers). */
void kv_truncate(kv_cache *c, int s, int n_keep);
/* Keep the first `keep` positions of slot s for a forward that continues at keep: the largest
 * n <= keep whose rows the next forward can read. keep itself when the windowed layers still
 * hold keys keep - window + 1 .. keep - 1 (always without windows); else the slot's checkpoint
 * position when it is <= keep (its window restored); else 0. Positions n .. keep - 1 are then
 * to be computed again (the same tokens: the same rows). Returns n, the slot's new n_pos. */
int kv_rewind(kv_cache *c, int s, int keep);
/* Snapshot of the windowed layers' last window - 1 rows at the slot's n_pos (where a prompt
 * ends: the next stateless turn shares the prompt and diverges after it), for kv_rewind.
 * 0, or -1 out of memory (no checkpoint then). */
int kv_checkpoint(kv_cache *c, int s);

/* Slot files: header (magic, dims, model fingerprint), tokens, K/V rows (a windowed layer's
 * last window - 1 rows; none for a rowless layer). Written
 * atomically (tmp + rename). load returns 0 and fills the slot, or -1 when the file
 * is absent or does not match (then the slot is left empty). */
int kv_save(const kv_cache *c, int s, const char *path, uint64_t fingerprint);
int kv_load(kv_cache *c, int s, const char *path, uint64_t fingerprint);
#endif
