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
    int cap;        /* positions allocated */
    void **k;       /* [n_layers] -> cap * k_dim elements (float, or uint16_t fp16) */
    void **v;       /* [n_layers] -> cap * v_dim elements */
} kv_slot;

typedef struct {
    int n_slots, ctx, n_layers;
    int k_dim, v_dim;   /* K and V row widths (KV heads x key / value head width): they may differ */
    int f16;        /* elements are fp16 (kv_set_f16), else float */
    size_t budget;  /* bytes all slots' buffers may take together (kv_set_budget); 0: no limit */
    size_t used;    /* bytes the slots' buffers take now */
    kv_slot *slots;
} kv_cache;

/* A cache of float32 rows, K rows k_dim and V rows v_dim wide; kv_set_f16 switches it to fp16
 * before anything is stored. kv_init: both kv_dim wide. */
int kv_init_kv(kv_cache *c, int n_slots, int ctx, int n_layers, int k_dim, int v_dim);
int kv_init(kv_cache *c, int n_slots, int ctx, int n_layers, int kv_dim);
/* 0 ok, -1 when a slot already holds rows. */
int kv_set_f16(kv_cache *c, int on);
/* The KV_TYPE setting: 1 fp16 rows (unset, empty or "f16"), 0 float32 ("f32"), -1 anything else. */
int kv_type_f16(const char *setting);
void kv_free(kv_cache *c);
/* Make room for n_pos positions in slot s (n_pos <= ctx). 0 ok, -1 OOM, KV_OVER_BUDGET when
 * the slots' buffers would pass the cache's budget (nothing changed then). */
#define KV_OVER_BUDGET (-2)
int kv_reserve(kv_cache *c, int s, int n_pos);
/* Bytes one position takes in every layer (K and V rows and its token id). */
size_t kv_pos_bytes(const kv_cache *c);
/* The share all slots' buffers may take together (0: no limit). */
void kv_set_budget(kv_cache *c, size_t bytes);
/* Positions slot s could hold within the budget if it grew now (ctx when there is no budget). */
int kv_room(const kv_cache *c, int s);
/* Frees slot s's buffers and forgets its history (its share goes back to the others). */
void kv_release(kv_cache *c, int s);
static inline size_t kv_elt(const kv_cache *c) { return c->f16 ? 2 : 4; }
/* Row `pos` of layer `layer` of slot s: k_dim (v_dim) elements of the cache's type. */
static inline void *kv_k(kv_cache *c, int s, int layer, int pos) {
    return (char *)c->slots[s].k[layer] + (size_t)pos * (size_t)c->k_dim * kv_elt(c);
}
static inline void *kv_v(kv_cache *c, int s, int layer, int pos) {
    return (char *)c->slots[s].v[layer] + (size_t)pos * (size_t)c->v_dim * kv_elt(c);
}
/* Stores float rows k (k_dim values), v (v_dim) at (s, layer, pos), converting to fp16. */
void kv_store(kv_cache *c, int s, int layer, int pos, const float *k, const float *v);
/* Length of the common prefix of the slot history and ids[0..n). */
int kv_common_prefix(const kv_cache *c, int s, const int *ids, int n);
/* Drop positions >= n_keep. */
void kv_truncate(kv_cache *c, int s, int n_keep);

/* Slot files: header (magic, dims, model fingerprint), tokens, K/V rows. Written
 * atomically (tmp + rename). load returns 0 and fills the slot, or -1 when the file
 * is absent or does not match (then the slot is left empty). */
int kv_save(const kv_cache *c, int s, const char *path, uint64_t fingerprint);
int kv_load(kv_cache *c, int s, const char *path, uint64_t fingerprint);
#endif
