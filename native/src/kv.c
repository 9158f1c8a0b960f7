/* kv.c — KV slots: lazily grown per-slot K/V buffers (sliding-window layers: a buffer of their
 * recent rows that slides), prefix bookkeeping with the windows' checkpoints, slot files.
 *
 * Slot file layout (little-endian):
 *   char magic[8] = "COLIKV01", or "COLIKV02" for a cache with rowless layers (none of their rows
 *   are in the file: a COLIKV01 file holds every layer's but the windowed ones' n_pos rows)
 *   int32 n_layers, k_dim, n_pos, f16 (0: float32 rows, 1: fp16 rows)
 *   uint64 fingerprint
 *   int32 tokens[n_pos]
 *   per layer but the rowless ones: K[n_pos][k_dim], then V[n_pos][v_dim], elements as the cache
 *   holds them (a sliding-window layer: its last window - 1 positions' rows only, what a forward
 *   continuing at n_pos reads)
 *   with sliding-window layers: int32 ckpos (-1: no checkpoint), cklo; then per windowed layer
 *   the checkpoint's K[ckpos - cklo][k_dim] and V rows (kv_rewind's fallback survives a restart)
 * (v_dim is not in the header: the exact size check below tells it, and the model's
 * fingerprint covers both widths; files of equal widths are those of before the split)
 * A COLIKV01 file of a cache with rowless layers (written before those kept none, by the same
 * model: the fingerprint) loads too, its rowless layers' rows skipped: the forward never read them.
 * Written to "<path>.tmp" then renamed over <path>. Loaded only when magic, dims,
 * element type, fingerprint and the exact file size all match, and n_pos fits the context.
 * Both drop the file's pages from the page cache when done.
 *
 * Budget: with kv_set_budget, the slots' buffers together stay within it (kv_reserve refuses
 * growth past it; the server then frees idle slots or refuses the request's context). */
#include "kv.h"
#include "quant.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

static const char KV_MAGIC[8] = {'C', 'O', 'L', 'I', 'K', 'V', '0', '1'};
static const char KV_MAGIC2[8] = {'C', 'O', 'L', 'I', 'K', 'V', '0', '2'};

static int is_win(const kv_cache *c, int l) { return c->windowed && c->windowed[l]; }
static int is_rowless(const kv_cache *c, int l) { return c->rowless && c->rowless[l]; }
/* A layer whose rows grow with the context: neither windowed nor rowless. */
static int is_full(const kv_cache *c, int l) { return !is_win(c, l) && !is_rowless(c, l); }

static int slots_empty(const kv_cache *c) {
    for (int s = 0; s < c->n_slots; s++)
        if (c->slots[s].cap > 0 || c->slots[s].wcap > 0) return 0;
    return 1;
}

int kv_init_kv(kv_cache *c, int n_slots, int ctx, int n_layers, int k_dim, int v_dim) {
    memset(c, 0, sizeof *c);
    if (n_slots < 1 || ctx < 1 || n_layers < 1 || k_dim < 1 || v_dim < 1) return -1;
    c->slots = calloc((size_t)n_slots, sizeof *c->slots);
    if (!c->slots) return -1;
    c->n_slots = n_slots;
    c->ctx = ctx;
    c->n_layers = n_layers;
    c->k_dim = k_dim;
    c->v_dim = v_dim;
    for (int s = 0; s < n_slots; s++) {
        c->slots[s].ckpos = -1;
        c->slots[s].k = calloc((size_t)n_layers, sizeof(void *));
        c->slots[s].v = calloc((size_t)n_layers, sizeof(void *));
        if (!c->slots[s].k || !c->slots[s].v) {
            kv_free(c);
            return -1;
        }
    }
    return 0;
}

int kv_set_window(kv_cache *c, int layer, int window) {
    if (layer < 0 || layer >= c->n_layers || window < 1 || (c->window && window != c->window)) return -1;
    if (!slots_empty(c) || is_rowless(c, layer)) return -1;
    if (!c->windowed && !(c->windowed = calloc((size_t)c->n_layers, 1))) return -1;
    c->windowed[layer] = 1;
    c->window = window;
    return 0;
}

int kv_set_rowless(kv_cache *c, int layer) {
    if (layer < 0 || layer >= c->n_layers || is_win(c, layer) || !slots_empty(c)) return -1;
    if (!c->rowless && !(c->rowless = calloc((size_t)c->n_layers, 1))) return -1;
    c->rowless[layer] = 1;
    return 0;
}

int kv_layers(const kv_cache *c) {
    int n = 0;
    for (int l = 0; l < c->n_layers; l++) n += !is_rowless(c, l);
    return n;
}

int kv_init(kv_cache *c, int n_slots, int ctx, int n_layers, int kv_dim) {
    return kv_init_kv(c, n_slots, ctx, n_layers, kv_dim, kv_dim);
}

int kv_set_f16(kv_cache *c, int on) {
    for (int s = 0; s < c->n_slots; s++)
        if (c->slots[s].cap > 0) return -1;
    c->f16 = on != 0;
    return 0;
}

int kv_type_f16(const char *setting) {
    if (!setting || !*setting || !strcmp(setting, "f16")) return 1;
    return !strcmp(setting, "f32") ? 0 : -1;
}

/* n floats of x as fp16 (round to nearest even) into h. */
static void store_f16(uint16_t *h, const float *x, int n) {
    int i = 0;
#ifdef __F16C__
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
#endif
    for (; i < n; i++) h[i] = f32_to_fp16(x[i]);
}

void kv_store(kv_cache *c, int s, int layer, int pos, const float *k, const float *v) {
    if (!c->f16) {
        memcpy(kv_k(c, s, layer, pos), k, sizeof(float) * (size_t)c->k_dim);
        memcpy(kv_v(c, s, layer, pos), v, sizeof(float) * (size_t)c->v_dim);
        return;
    }
    store_f16(kv_k(c, s, layer, pos), k, c->k_dim);
    store_f16(kv_v(c, s, layer, pos), v, c->v_dim);
}

void kv_free(kv_cache *c) {
    if (!c->slots) return;
    for (int s = 0; s < c->n_slots; s++) {
        kv_slot *sl = &c->slots[s];
        for (int l = 0; l < c->n_layers; l++) {
            if (sl->k) free(sl->k[l]);
            if (sl->v) free(sl->v[l]);
            if (sl->ck) free(sl->ck[l]);
            if (sl->cv) free(sl->cv[l]);
        }
        free(sl->k);
        free(sl->v);
        free(sl->ck);
        free(sl->cv);
        free(sl->tokens);
    }
    free(c->slots);
    free(c->windowed);
    free(c->rowless);
    memset(c, 0, sizeof *c);
}

/* Bytes one position takes in the layers that grow with the context (every layer but the
 * sliding-window and rowless ones) and its token id. */
size_t kv_pos_bytes(const kv_cache *c) {
    int full = 0;
    for (int l = 0; l < c->n_layers; l++) full += is_full(c, l);
    return (size_t)full * ((size_t)c->k_dim + (size_t)c->v_dim) * kv_elt(c) + sizeof(int);
}

/* Bytes one row takes in all the sliding-window layers together (their buffers and checkpoints). */
static size_t win_row_bytes(const kv_cache *c) {
    int win = 0;
    for (int l = 0; l < c->n_layers; l++) win += is_win(c, l);
    return (size_t)win * ((size_t)c->k_dim + (size_t)c->v_dim) * kv_elt(c);
}

void kv_set_budget(kv_cache *c, size_t bytes) { c->budget = bytes; }

void kv_set_reclaim(kv_cache *c, kv_reclaim_fn fn, void *ud) {
    c->reclaim = fn;
    c->reclaim_ud = ud;
}

/* The borrower gives back what the buffers are about to take, before they take it: the budget's
 * figure is only met if the share's bytes are free when KV needs them. */
static void reclaim(kv_cache *c, size_t grow) {
    if (c->reclaim && grow) c->reclaim(c->reclaim_ud, c->used + grow);
}

/* The bytes slot s's own buffers hold that grow with its context (its windows' and checkpoint's
 * bytes count with the others': they stay near two windows). */
int kv_room(const kv_cache *c, int s) {
    if (!c->budget || s < 0 || s >= c->n_slots) return c->ctx;
    const size_t others = c->used - (size_t)c->slots[s].cap * kv_pos_bytes(c);
    const size_t fit = c->budget > others ? (c->budget - others) / kv_pos_bytes(c) : 0;
    return fit < (size_t)c->ctx ? (int)fit : c->ctx;
}

/* The capacity slot s grows to for n_pos positions: doubling (fewer reallocs), but never past
 * the context nor, with a budget, past the room the budget leaves it. 0 when n_pos does not fit. */
static int grown_cap(const kv_cache *c, int s, int n_pos) {
    const kv_slot *sl = &c->slots[s];
    long cap = sl->cap > 0 ? sl->cap : 16;
    while (cap < n_pos) cap *= 2;
    if (cap > c->ctx) cap = c->ctx;
    const int room = kv_room(c, s);
    if (cap > room) cap = room;
    return cap >= n_pos ? (int)cap : 0;
}

/* The windowed layers' buffers hold rows wbase .. wbase + wcap - 1: when n_pos does not fit, the
 * rows older than the forward's first key (first - window + 1) are dropped by sliding the rest
 * to the front, then the buffers grow if that is not room enough (to at least two windows, so a
 * slide moves window - 1 rows once every window or more decoded tokens; within the budget). */
static int reserve_window(kv_cache *c, kv_slot *sl, int first, int n_pos) {
    if (n_pos - sl->wbase <= sl->wcap) return 0;
    const size_t kr = (size_t)c->k_dim * kv_elt(c), vr = (size_t)c->v_dim * kv_elt(c);
    int need = first - (c->window - 1);
    if (need > sl->n_pos) need = sl->n_pos;
    if (need > sl->wbase) {
        const int end = sl->n_pos < sl->wbase + sl->wcap ? sl->n_pos : sl->wbase + sl->wcap;
        const size_t off = (size_t)(need - sl->wbase), rows = end > need ? (size_t)(end - need) : 0;
        for (int l = 0; l < c->n_layers; l++)
            if (is_win(c, l) && rows) {
                memmove(sl->k[l], (char *)sl->k[l] + off * kr, rows * kr);
                memmove(sl->v[l], (char *)sl->v[l] + off * vr, rows * vr);
            }
        sl->wbase = need;
        if (n_pos - sl->wbase <= sl->wcap) return 0;
    }
    long cap = 2L * sl->wcap;
    if (cap < 2L * c->window) cap = 2L * c->window;
    if (cap < n_pos - sl->wbase) cap = n_pos - sl->wbase;
    if (cap > c->ctx) cap = c->ctx;
    const size_t grow = (size_t)(cap - sl->wcap) * win_row_bytes(c);
    if (c->budget && c->used + grow > c->budget) {
        cap = n_pos - sl->wbase;        /* no spare room: just what this forward needs */
        if (c->used + (size_t)(cap - sl->wcap) * win_row_bytes(c) > c->budget) return KV_OVER_BUDGET;
    }
    reclaim(c, (size_t)(cap - sl->wcap) * win_row_bytes(c));
    for (int l = 0; l < c->n_layers; l++) {
        if (!is_win(c, l)) continue;
        void *k = realloc(sl->k[l], (size_t)cap * kr);
        if (!k) return -1;
        sl->k[l] = k;
        void *v = realloc(sl->v[l], (size_t)cap * vr);
        if (!v) return -1;
        sl->v[l] = v;
    }
    c->used += (size_t)(cap - sl->wcap) * win_row_bytes(c);
    sl->wcap = (int)cap;
    return 0;
}

int kv_reserve_from(kv_cache *c, int s, int first, int n_pos) {
    if (s < 0 || s >= c->n_slots || n_pos < 0 || n_pos > c->ctx) return -1;
    kv_slot *sl = &c->slots[s];
    if (c->windowed) {
        const int rw = reserve_window(c, sl, first, n_pos);
        if (rw != 0) return rw;
    }
    if (n_pos <= sl->cap) return 0;
    const int cap = grown_cap(c, s, n_pos);
    if (cap == 0) return KV_OVER_BUDGET;
    reclaim(c, (size_t)(cap - sl->cap) * kv_pos_bytes(c));
    /* Each realloc that succeeds is kept (its pointer updated); cap only moves once
     * every buffer has the new size, so a failure leaves a consistent slot. */
    int *t = realloc(sl->tokens, (size_t)cap * sizeof(int));
    if (!t) return -1;
    sl->tokens = t;
    size_t kb = (size_t)cap * (size_t)c->k_dim * kv_elt(c), vb = (size_t)cap * (size_t)c->v_dim * kv_elt(c);
    for (int l = 0; l < c->n_layers; l++) {
        if (!is_full(c, l)) continue;
        void *k = realloc(sl->k[l], kb);
        if (!k) return -1;
        sl->k[l] = k;
        void *v = realloc(sl->v[l], vb);
        if (!v) return -1;
        sl->v[l] = v;
    }
    c->used += (size_t)(cap - sl->cap) * kv_pos_bytes(c);
    sl->cap = cap;
    return 0;
}

int kv_reserve(kv_cache *c, int s, int n_pos) {
    if (s < 0 || s >= c->n_slots) return -1;
    return kv_reserve_from(c, s, c->slots[s].n_pos, n_pos);
}

void kv_release(kv_cache *c, int s) {
    if (s < 0 || s >= c->n_slots) return;
    kv_slot *sl = &c->slots[s];
    for (int l = 0; l < c->n_layers; l++) {
        free(sl->k[l]);
        free(sl->v[l]);
        sl->k[l] = sl->v[l] = NULL;
        if (sl->ck) free(sl->ck[l]), sl->ck[l] = NULL;
        if (sl->cv) free(sl->cv[l]), sl->cv[l] = NULL;
    }
    free(sl->tokens);
    sl->tokens = NULL;
    c->used -= (size_t)sl->cap * kv_pos_bytes(c) + (size_t)sl->wcap * win_row_bytes(c);
    if (sl->ck) c->used -= (size_t)(c->window > 1 ? c->window - 1 : 1) * win_row_bytes(c);
    free(sl->ck);
    free(sl->cv);
    sl->ck = sl->cv = NULL;
    sl->cap = sl->n_pos = sl->wcap = sl->wbase = 0;
    sl->ckpos = -1;
}

int kv_common_prefix(const kv_cache *c, int s, const int *ids, int n) {
    if (s < 0 || s >= c->n_slots) return 0;
    const kv_slot *sl = &c->slots[s];
    int m = sl->n_pos < n ? sl->n_pos : n;
    int i = 0;
    while (i < m && sl->tokens[i] == ids[i]) i++;
    return i;
}

void kv_truncate(kv_cache *c, int s, int n_keep) { (void)kv_rewind(c, s, n_keep); }

/* The slot's checkpoint buffers (window - 1 rows per windowed layer), allocated once. 0 or -1. */
static int ck_alloc(kv_cache *c, kv_slot *sl) {
    const size_t rows = (size_t)(c->window > 1 ? c->window - 1 : 1);
    if (!sl->ck) reclaim(c, rows * win_row_bytes(c));
    if (!sl->ck) c->used += rows * win_row_bytes(c);     /* kv_release gives it back */
    if ((!sl->ck && !(sl->ck = calloc((size_t)c->n_layers, sizeof(void *)))) ||
        (!sl->cv && !(sl->cv = calloc((size_t)c->n_layers, sizeof(void *)))))
        return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (!is_win(c, l)) continue;
        if (!sl->ck[l] && !(sl->ck[l] = malloc(rows * (size_t)c->k_dim * kv_elt(c)))) return -1;
        if (!sl->cv[l] && !(sl->cv[l] = malloc(rows * (size_t)c->v_dim * kv_elt(c)))) return -1;
    }
    return 0;
}

int kv_checkpoint(kv_cache *c, int s) {
    if (s < 0 || s >= c->n_slots || !c->windowed) return 0;
    kv_slot *sl = &c->slots[s];
    const size_t kr = (size_t)c->k_dim * kv_elt(c), vr = (size_t)c->v_dim * kv_elt(c);
    const int lo = sl->n_pos - (c->window - 1) > sl->wbase ? sl->n_pos - (c->window - 1) : sl->wbase;
    sl->ckpos = -1;
    if (ck_alloc(c, sl) != 0) return -1;
    for (int l = 0; l < c->n_layers; l++) {
        if (!is_win(c, l)) continue;
        if (sl->n_pos > lo) {
            memcpy(sl->ck[l], kv_k(c, s, l, lo), (size_t)(sl->n_pos - lo) * kr);
            memcpy(sl->cv[l], kv_v(c, s, l, lo), (size_t)(sl->n_pos - lo) * vr);
        }
    }
    sl->cklo = lo;
    sl->ckpos = sl->n_pos;
    return 0;
}

int kv_rewind(kv_cache *c, int s, int keep) {
    if (s < 0 || s >= c->n_slots) return 0;
    kv_slot *sl = &c->slots[s];
    if (keep < 0) keep = 0;
    if (keep > sl->n_pos) keep = sl->n_pos;
    const int lo = keep - (c->window - 1) > 0 ? keep - (c->window - 1) : 0;    /* the next forward's oldest key */
    if (!c->windowed || lo >= sl->wbase || keep == sl->n_pos) {
        if (keep < sl->ckpos) sl->ckpos = -1;      /* the tokens after keep will change */
        return sl->n_pos = keep;
    }
    if (sl->ckpos >= 0 && sl->ckpos <= keep) {      /* the window at the checkpoint, restored */
        const size_t kr = (size_t)c->k_dim * kv_elt(c), vr = (size_t)c->v_dim * kv_elt(c);
        const size_t rows = (size_t)(sl->ckpos - sl->cklo);
        sl->wbase = sl->cklo;
        for (int l = 0; l < c->n_layers; l++)
            if (is_win(c, l) && rows) {
                memcpy(sl->k[l], sl->ck[l], rows * kr);
                memcpy(sl->v[l], sl->cv[l], rows * vr);
            }
        return sl->n_pos = sl->ckpos;
    }
    sl->wbase = 0;
    sl->ckpos = -1;
    return sl->n_pos = 0;
}

/* The first position a windowed layer's rows are saved from: the last window - 1 of n_pos. */
static int win_lo(const kv_cache *c, int n_pos) {
    return c->windowed && n_pos > c->window - 1 ? n_pos - (c->window - 1) : 0;
}

/* The file's pages out of the page cache (written back by then, or only read): a cgroup's limit
 * counts page cache, and the slot's rows are already in its buffers. */
static void drop_pages(FILE *f) { posix_fadvise(fileno(f), 0, 0, POSIX_FADV_DONTNEED); }

static int write_all(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }
static int read_all(FILE *f, void *p, size_t n) { return n == 0 || fread(p, 1, n, f) == n ? 0 : -1; }

int kv_save(const kv_cache *c, int s, const char *path, uint64_t fingerprint) {
    if (s < 0 || s >= c->n_slots || !path || !*path) return -1;
    const kv_slot *sl = &c->slots[s];
    size_t plen = strlen(path);
    char *tmp = malloc(plen + 5);
    if (!tmp) return -1;
    memcpy(tmp, path, plen);
    memcpy(tmp + plen, ".tmp", 5);
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        free(tmp);
        return -1;
    }
    int32_t hdr[4] = {c->n_layers, c->k_dim, sl->n_pos, c->f16};
    int rc = write_all(f, c->rowless ? KV_MAGIC2 : KV_MAGIC, sizeof KV_MAGIC);
    rc |= write_all(f, hdr, sizeof hdr);
    rc |= write_all(f, &fingerprint, sizeof fingerprint);
    rc |= write_all(f, sl->tokens, (size_t)sl->n_pos * sizeof(int32_t));
    const int lo = win_lo(c, sl->n_pos);
    const size_t kr = (size_t)c->k_dim * kv_elt(c), vr = (size_t)c->v_dim * kv_elt(c);
    for (int l = 0; l < c->n_layers && rc == 0; l++) {
        const int from = is_win(c, l) ? lo : 0;
        if (!is_rowless(c, l) && sl->n_pos > from) {
            rc |= write_all(f, kv_k((kv_cache *)c, s, l, from), (size_t)(sl->n_pos - from) * kr);
            rc |= write_all(f, kv_v((kv_cache *)c, s, l, from), (size_t)(sl->n_pos - from) * vr);
        }
    }
    if (c->windowed) {          /* the windows' checkpoint: its position, first row, rows */
        const int32_t ck[2] = {sl->ckpos, sl->ckpos >= 0 ? sl->cklo : 0};
        rc |= write_all(f, ck, sizeof ck);
        for (int l = 0; l < c->n_layers && rc == 0 && ck[0] > ck[1]; l++)
            if (is_win(c, l)) {
                rc |= write_all(f, sl->ck[l], (size_t)(ck[0] - ck[1]) * kr);
                rc |= write_all(f, sl->cv[l], (size_t)(ck[0] - ck[1]) * vr);
            }
    }
    if (fflush(f) != 0) rc = -1;
    if (rc == 0 && fsync(fileno(f)) != 0) rc = -1;
    if (rc == 0) drop_pages(f);
    if (fclose(f) != 0) rc = -1;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1;
    if (rc != 0) unlink(tmp);
    free(tmp);
    return rc;
}

/* Rows of layer l a file of n positions holds (from: its first; legacy: a COLIKV01 file of a
 * cache with rowless layers, which holds their n rows too). */
static int file_rows(const kv_cache *c, int l, int n, int lo, int legacy, int *from) {
    *from = is_win(c, l) ? lo : 0;
    if (is_rowless(c, l)) return legacy ? n : 0;
    return n - *from;
}

/* The layers' rows of a file of n positions into slot s (the file at its first row). 0 or -1. */
static int read_rows(kv_cache *c, int s, FILE *f, int n, int lo, int legacy) {
    const size_t kr = (size_t)c->k_dim * kv_elt(c), vr = (size_t)c->v_dim * kv_elt(c);
    for (int l = 0; l < c->n_layers; l++) {
        int from;
        const int rows = file_rows(c, l, n, lo, legacy, &from);
        if (rows <= 0) continue;
        if (is_rowless(c, l)) {     /* a legacy file's rows of a layer that keeps none: skipped */
            if (fseek(f, (long)((size_t)rows * (kr + vr)), SEEK_CUR) != 0) return -1;
        } else if (read_all(f, kv_k(c, s, l, from), (size_t)rows * kr) || read_all(f, kv_v(c, s, l, from), (size_t)rows * vr))
            return -1;
    }
    return 0;
}

int kv_load(kv_cache *c, int s, const char *path, uint64_t fingerprint) {
    if (s < 0 || s >= c->n_slots || !path || !*path) return -1;
    kv_slot *sl = &c->slots[s];
    sl->n_pos = 0;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    char magic[8];
    int32_t hdr[4];
    uint64_t fp;
    int rc = -1;
    if (read_all(f, magic, 8)) goto out;
    const int legacy = c->rowless && !memcmp(magic, KV_MAGIC, 8);
    if (!legacy && memcmp(magic, c->rowless ? KV_MAGIC2 : KV_MAGIC, 8) != 0) goto out;
    if (read_all(f, hdr, sizeof hdr) || read_all(f, &fp, sizeof fp)) goto out;
    if (hdr[0] != c->n_layers || hdr[1] != c->k_dim || hdr[3] != c->f16 || fp != fingerprint) goto out;
    int n = hdr[2];
    if (n < 0 || n > c->ctx) goto out;
    /* Exact size check before touching the slot. */
    const int lo = win_lo(c, n);
    const size_t kr = (size_t)c->k_dim * kv_elt(c), vr = (size_t)c->v_dim * kv_elt(c);
    long want = (long)(8 + sizeof hdr + sizeof fp) + (long)n * 4;
    int n_win = 0, from;
    for (int l = 0; l < c->n_layers; l++) {
        want += (long)((size_t)file_rows(c, l, n, lo, legacy, &from) * (kr + vr));
        n_win += is_win(c, l);
    }
    int32_t ck[2] = {-1, 0};
    if (c->windowed) {          /* the checkpoint's trailer: (ckpos, cklo), then its rows */
        if (fseek(f, want, SEEK_SET) != 0 || read_all(f, ck, sizeof ck)) goto out;
        if (ck[0] < -1 || ck[0] > n || (ck[0] >= 0 && (ck[1] < 0 || ck[1] > ck[0] || ck[0] - ck[1] > c->window - 1)))
            goto out;
        want += (long)sizeof ck + (ck[0] > ck[1] ? (long)((size_t)(ck[0] - ck[1]) * (kr + vr) * (size_t)n_win) : 0);
    }
    if (fseek(f, 0, SEEK_END) != 0 || ftell(f) != want) goto out;
    if (fseek(f, (long)(8 + sizeof hdr + sizeof fp), SEEK_SET) != 0) goto out;
    sl->wbase = lo;     /* the windowed rows read below are lo .. n - 1 */
    sl->ckpos = -1;
    if (kv_reserve_from(c, s, n, n) != 0) goto out;
    if (read_all(f, sl->tokens, (size_t)n * sizeof(int32_t)) || read_rows(c, s, f, n, lo, legacy)) goto out;
    if (ck[0] >= 0) {
        if (ck_alloc(c, sl) != 0 || fseek(f, (long)sizeof ck, SEEK_CUR) != 0) goto out;
        for (int l = 0; l < c->n_layers && ck[0] > ck[1]; l++)
            if (is_win(c, l) && (read_all(f, sl->ck[l], (size_t)(ck[0] - ck[1]) * kr) ||
                                 read_all(f, sl->cv[l], (size_t)(ck[0] - ck[1]) * vr)))
                goto out;
        sl->ckpos = ck[0];
        sl->cklo = ck[1];
    }
    sl->n_pos = n;
    rc = 0;
out:
    drop_pages(f);
    fclose(f);
    return rc;
}
