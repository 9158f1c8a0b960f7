/* kv.h — KV slots: per-slot token history and per-layer K/V rows.
 * Owns: growth of slot buffers, truncate-and-extend bookkeeping, and the
 * on-disk slot files (KVSAVE). A slot grows lazily so 16 slots x large CTX
 * costs memory only for what conversations actually use. */
#ifndef COLI_KV_H
#define COLI_KV_H
#include <stdint.h>

typedef struct {
    int *tokens;    /* history: tokens whose K/V are stored, n_pos of them */
    int n_pos;
    int cap;        /* positions allocated */
    float **k;      /* [n_layers] -> cap * kv_dim */
    float **v;
} kv_slot;

typedef struct {
    int n_slots, ctx, n_layers, kv_dim;
    kv_slot *slots;
} kv_cache;

int kv_init(kv_cache *c, int n_slots, int ctx, int n_layers, int kv_dim);
void kv_free(kv_cache *c);
/* Make room for n_pos positions in slot s (n_pos <= ctx). 0 ok, -1 OOM. */
int kv_reserve(kv_cache *c, int s, int n_pos);
static inline float *kv_k(kv_cache *c, int s, int layer, int pos) {
    return c->slots[s].k[layer] + (long)pos * c->kv_dim;
}
static inline float *kv_v(kv_cache *c, int s, int layer, int pos) {
    return c->slots[s].v[layer] + (long)pos * c->kv_dim;
}
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
