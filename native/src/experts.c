/* experts.c — the expert store (see experts.h).
 *
 * Expert (r, e) of MoE row r is three byte slices of the stacked tensors
 * blk.N.ffn_{gate,up,down}_exps.weight: slice e = bytes [e*S, (e+1)*S) with
 * S = row_bytes(ne0) * ne1 of that tensor; in a file with one tensor per expert
 * (blk.N.ffn_{gate,up,down}.E.weight) the slice is that tensor, at its own offset.
 *
 * Tier 1 (RAM): a malloc'ed copy gate|up|down, either pinned (evicted only to give borrowed
 * memory back) or in an LRU list. Pinned + LRU bytes stay within ram_budget plus what the KV
 * share does not use now (es_borrow); the pinned set is the hottest experts (cumulative
 * selection count, ties: lower index) that fit pin_budget and ram_budget (never borrowed).
 * With ram_budget == SIZE_MAX every expert is read at creation and stays resident.
 * Tier 0 (disk): not resident; es_acquire reads it with pread into a pooled scratch
 * buffer unless the LRU can admit it (evicting least-recently-used unpinned,
 * unacquired experts), and the buffer is returned to the pool on es_release.
 * Every read drops the file pages it went through from the page cache (gguf_drop_cache):
 * the store's buffers are the experts' one copy in RAM, so a budget is the memory they take
 * (a cgroup's limit counts page cache) and at full RAM the file is not held twice.
 *
 * REPIN callback: called once per expert whose pinned state changes, with the
 * absolute layer, the expert id, the tier it had before the change (0 disk, 1 RAM)
 * and gpu = 0 (there is no device tier yet).
 *
 * Usage file: "-1 <n_layers> <n_experts>\n-2 1 <engine_id>\n" then
 * "<absolute_layer> <expert> <count>\n" per expert with a non-zero count; a zero-byte
 * file when there is no history. Written to "<path>.tmp" and renamed, under an flock on
 * "<path>.lock"; each save adds this engine's selections since its last read or write to what
 * the file holds then, so engines sharing one file (one model, several bridges) merge their
 * histories instead of the last writer's replacing the others'. */
#include "experts.h"

#include "io.h"
#include "mem.h"
#include "pool.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct {
    int layer;
    uint32_t type[3];
    int rows[3], cols[3];
    size_t row_bytes[3];
    uint64_t off[3];        /* absolute file offset of expert 0's slice */
    uint64_t *eoff;         /* NULL, or per-expert tensors: eoff[k * n_experts + e], expert e's slice */
    size_t slice[3];        /* bytes of one expert in that tensor */
    uint64_t stride[3];     /* bytes from one expert's slice to the next's: slice, or 2 x slice for
                             * the halves of a fused gate/up tensor */
    size_t held[3];         /* bytes of its copy in RAM: the packed layout's (Q4_K's is 148/144 of
                             * the file's), the page-aligned cover of a direct slice, else slice */
    uint8_t packed[3];      /* kept in the kernels' interleaved layout (quant.h qpack) */
    uint8_t direct[3];      /* kept in the file's layout and read by O_DIRECT straight into place:
                             * the copy starts at the slice's offset within its first page */
    int chunks[3];          /* read tasks of a slice: READ_CHUNK pieces of a direct one's cover, else 1 */
    int tasks;              /* chunks[0] + chunks[1] + chunks[2]: one expert's read tasks */
    size_t bytes;           /* held[0] + held[1] + held[2] */
} es_row;

typedef struct {
    uint8_t *buf;           /* resident copy (tier 1) or NULL */
    uint8_t *tmp;           /* scratch copy while acquired from disk (or read ahead) */
    int pinned;
    int in_use;             /* acquisitions not yet released */
    int prev, next;         /* LRU links (unpinned residents only), -1 = none */
    int8_t loading;         /* -1 none, else the es_reads batch (ACQ, AHEAD, AHEAD + 1) its read is in */
    uint8_t ahead;          /* read by the lookahead and not acquired since: never evicted */
} es_ent;

/* A batch of expert reads on the I/O lanes: one row's misses (ACQ) or the lookahead's guesses
 * for a coming row (AHEAD, AHEAD + 1: two, so that the guesses for layer l + 2 queue behind
 * those for l + 1 still in flight instead of waiting for them, and the disk never idles).
 * dst[k] is expert e[k]'s buffer, resident[k] whether it stays.
 * state[k]: QUEUED until a lane starts one of the expert's read tasks (STARTED: all are read)
 * or the row's acquisition finds it was a wrong guess first (CANCELLED: none is read), so a
 * wrong guess not yet begun costs no disk time in front of the misses queued after it. A wrong
 * guess found begun is STOPPED: the tasks no lane has begun are not read (skipped counts
 * their bytes), and the expert is kept only if all were read before. */
enum { ACQ = 0, AHEAD = 1, N_BATCHES = 3 };
enum { QUEUED = 0, STARTED = 1, CANCELLED = 2, STOPPED = 3 };
typedef struct {
    io_batch b;
    const struct expert_store *s;
    int active, r, n;
    int swept;                  /* AHEAD: its row's acquisition has cancelled the wrong guesses */
    unsigned seq;               /* AHEAD: issue order (the older of two is settled to reuse it) */
    int *e, *resident;          /* n */
    _Atomic int *ok;            /* 3 per expert (gate, up, down slices): 1 until a read of it fails */
    _Atomic int *state;         /* n: QUEUED, STARTED, CANCELLED, STOPPED */
    _Atomic size_t skipped;     /* bytes of STOPPED experts' slices not read */
    uint8_t **dst;
} es_reads;

struct expert_store {
    int fd;
    int dfd;                /* the file opened with O_DIRECT, or -1 (EXPERT_DIRECT=0, unsupported) */
    const uint8_t *map;     /* fallback when fd < 0 */
    size_t map_size;
    int rows, cols, n_layers_total;
    uint32_t engine_id;
    expert_opts o;
    es_row *row;
    es_ent *ent;
    uint64_t *count;        /* cumulative selections: the usage file's history and this run's */
    uint64_t *synced;       /* count as of the last usage-file read or write (merging saves) */
    uint8_t *hits;
    uint8_t *mark;          /* cols: scratch of es_acquire_begin (the experts it was asked for) */
    size_t hits_bytes;
    size_t ram_used, max_bytes;
    const size_t *kv_used;  /* es_borrow: the KV cache's bytes in use, NULL: no borrowing */
    size_t kv_share;        /* es_borrow: the KV share those bytes stay within */
    int n_resident;
    int lru_head, lru_tail; /* head = most recently used */
    uint64_t acq_all, acq_ram;
    es_io_stats io;         /* cumulative: es_io */
    uint8_t **pool;         /* free scratch buffers of max_bytes */
    int pool_n, pool_cap;
    int scratch_n;          /* scratch buffers allocated: in use and pooled */
    es_reads rd[N_BATCHES];  /* ACQ, then the lookahead's */
    unsigned ahead_seq;
};

static int queue_read(expert_store *s, es_reads *J, int which, int r, int e);
static uint8_t *reserve_resident(expert_store *s, int r, int i, uint64_t cand);
static void reads_add(expert_store *s, es_reads *J, int which, int e, uint8_t *b, int resident);
static void reads_submit(es_reads *J);
static int reads_settle(expert_store *s, es_reads *J, double *t_stall);
static void ahead_settle(expert_store *s, es_reads *J, double *t_stall);

static double es_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void set_err(char *err, size_t errlen, const char *fmt, const char *a) {
    if (err && errlen) snprintf(err, errlen, fmt, a);
}

/* ---- LRU list ---- */
static void lru_unlink(expert_store *s, int i) {
    es_ent *x = &s->ent[i];
    if (x->prev >= 0) s->ent[x->prev].next = x->next;
    else if (s->lru_head == i) s->lru_head = x->next;
    if (x->next >= 0) s->ent[x->next].prev = x->prev;
    else if (s->lru_tail == i) s->lru_tail = x->prev;
    x->prev = x->next = -1;
}

static void lru_push_head(expert_store *s, int i) {
    es_ent *x = &s->ent[i];
    x->prev = -1;
    x->next = s->lru_head;
    if (s->lru_head >= 0) s->ent[s->lru_head].prev = i;
    s->lru_head = i;
    if (s->lru_tail < 0) s->lru_tail = i;
}

/* ---- reading ---- */
/* Bytes of one expert of row R in the file (gate + up + down slices): what reading it costs. */
static size_t file_bytes(const es_row *R) { return R->slice[0] + R->slice[1] + R->slice[2]; }

static int read_at(const expert_store *s, uint8_t *dst, size_t n, uint64_t off) {
    return gguf_read_at(s->fd, s->map, s->map_size, off, dst, n);
}

/* Matrices whose rows are a multiple of 8 are kept in the kernels' interleaved layout
 * (quant.h qpack), converted once right after the read (held[k] bytes in RAM), except MXFP4
 * experts streamed under a budget: their packing is a pure byte shuffle that the file-layout tile
 * does in registers as it runs (quant_tile_fp4.c), while packing after the read cost the lanes a pass
 * over cold memory and the first touch of the new pages, in the read's critical path. Kept in
 * the file's layout, they are read by O_DIRECT into place with no CPU pass at all. */
static int packs(const expert_store *s, const es_row *R, int k) {
    if (s->o.exact || R->rows[k] % 8 != 0 || !qpack_ok(R->type[k], R->rows[k], R->cols[k])) return 0;
    return !(R->type[k] == GGML_MXFP4 && s->o.ram_budget != SIZE_MAX && s->dfd >= 0);
}

/* Slices below this size are copied out of the landing buffer: their page-aligned cover would
 * cost more than an eighth of their size. */
#define DIRECT_MIN_SLICE ((size_t)64 << 10)
/* A direct slice is read in pieces of this size, one task each: on a VM's virtio disk 1 MiB
 * random reads ran at 2.98-3.04 GB/s on 4 and 8 lanes where whole 4.4 MB MXFP4 slices ran at
 * 2.5-2.6 on 4 and 2.0 on 8 (2026-12-07); and a wrong guess stopped mid-read holds a lane for one
 * piece, not a slice. */
#define READ_CHUNK ((uint64_t)1 << 20)
#define PAGE ((uint64_t)4096)

static uint64_t slice_off(const expert_store *s, const es_row *R, int k, int e) {
    return R->eoff ? R->eoff[(size_t)k * (size_t)s->cols + (size_t)e] : R->off[k] + (uint64_t)e * R->stride[k];
}

/* Per-thread landing buffer of reads: read there (O_DIRECT: the slice's page-aligned cover),
 * then packed into place in one pass (packing in place needed a temporary copy of the matrix
 * and a copy back) or copied. */
static _Thread_local uint8_t *rd_buf;
static _Thread_local size_t rd_cap;

/* Whole huge pages for reads from a third of one on: an O_DIRECT read into 4 KiB pages ran at
 * half the device's rate on a VM (2.0-2.4 against 4.4-4.8 GB/s with 2 MiB pages, 0.9-4.4 MB
 * reads, 1-4 lanes, 2026-12-06): the kernel pins and maps every page of the buffer for each
 * read. So rounded, a buffer stays within the expert (three slices) the memory budget counts
 * for each lane; smaller reads keep page-sized buffers. */
#define LANDING_PAGE ((size_t)2 << 20)

static uint8_t *landing(size_t n) {
    if (n > rd_cap) {
        const size_t align = n >= LANDING_PAGE / 3 ? LANDING_PAGE : 4096, cap = (n + align - 1) & ~(align - 1);
        free(rd_buf);
        rd_buf = align == 4096 ? aligned_alloc(4096, cap) : weights_alloc(cap);
        rd_cap = rd_buf ? cap : 0;
    }
    return rd_buf;
}

/* The page-aligned cover of n bytes at off, [off & ~PAGE, roundup(off + n)), by O_DIRECT into
 * the page-aligned buf; 1 when the bytes wanted arrived (the file may end inside the last
 * page), 0 when the file system refused or came up short. */
static size_t pread_pages(const expert_store *s, uint8_t *buf, uint64_t a0, uint64_t a1) {
    size_t got = 0;
    while (got < a1 - a0) {
        ssize_t k = pread(s->dfd, buf + got, (size_t)(a1 - a0) - got, (off_t)(a0 + got));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;                  /* end of file inside the last page */
        got += (size_t)k;
    }
    return got;
}

static int read_cover(const expert_store *s, uint64_t off, size_t n, uint8_t *buf) {
    const uint64_t a0 = off & ~(PAGE - 1), a1 = (off + n + PAGE - 1) & ~(PAGE - 1);
    return pread_pages(s, buf, a0, a1) >= off - a0 + n;
}

/* n bytes at off: with O_DIRECT (no page cache at all: the budget is the memory experts take,
 * no copy out of the cache, no readahead past the slice) into the landing buffer, returning
 * where the bytes start in it; else a buffered pread whose pages are dropped after. NULL on
 * error. */
static const uint8_t *read_landed(const expert_store *s, uint64_t off, size_t n) {
    if (s->dfd >= 0) {
        const uint64_t a0 = off & ~(PAGE - 1), a1 = (off + n + PAGE - 1) & ~(PAGE - 1);
        uint8_t *b = landing((size_t)(a1 - a0));
        if (!b) return NULL;
        if (read_cover(s, off, n, b)) return b + (off - a0);
        /* fall through: a file system that refuses this read takes the buffered path */
    }
    uint8_t *b = landing(n);
    if (!b || read_at(s, b, n, off) != 0) return NULL;
    gguf_drop_cache(s->fd, off, n);             /* the store's copy is the only one */
    return b;
}

/* Each row's layout in RAM for the store's mode and budget (packed, direct, held, bytes) and
 * the largest expert's bytes. */
static void rows_layout(expert_store *s) {
    s->max_bytes = 0;
    for (int r = 0; r < s->rows; r++) {
        es_row *R = &s->row[r];
        for (int k = 0; k < 3; k++) {
            R->packed[k] = (uint8_t)packs(s, R, k);
            R->direct[k] = !R->packed[k] && s->dfd >= 0 && R->slice[k] >= DIRECT_MIN_SLICE;
            R->held[k] = R->packed[k] ? qpack_bytes(R->type[k], R->rows[k], R->cols[k])
                         : R->direct[k] ? (size_t)((R->slice[k] + 2 * PAGE - 1) & ~(PAGE - 1)) : R->slice[k];
            R->chunks[k] = R->direct[k] ? (int)((R->held[k] + READ_CHUNK - 1) / READ_CHUNK) : 1;
        }
        R->tasks = R->chunks[0] + R->chunks[1] + R->chunks[2];
        /* a direct slice's region must start on a page: every region of such a row is whole pages */
        const int any_direct = R->direct[0] | R->direct[1] | R->direct[2];
        R->bytes = 0;
        for (int k = 0; k < 3; k++) {
            if (any_direct) R->held[k] = (R->held[k] + PAGE - 1) & ~(PAGE - 1);
            R->bytes += R->held[k];
        }
        if (R->bytes > s->max_bytes) s->max_bytes = R->bytes;
    }
}

/* The slice's bytes [*lo, *hi) that chunk c of the page-aligned cover of n bytes at off holds
 * (empty past the cover's end). */
static void chunk_span(uint64_t off, size_t n, int c, uint64_t *lo, uint64_t *hi) {
    const uint64_t a0 = off & ~(PAGE - 1), c0 = a0 + (uint64_t)c * READ_CHUNK, c1 = c0 + READ_CHUNK;
    *lo = c0 > off ? c0 : off;
    *hi = c1 < off + n ? c1 : off + n;
    if (*hi < *lo) *hi = *lo;
}

/* Chunk c of a direct slice's page-aligned cover [off & ~PAGE, roundup(off + n)) by O_DIRECT
 * into the page-aligned region at, so the slice lands at at + (off & (PAGE - 1)) with no copy;
 * a file system that refuses the read gets a buffered one of the chunk's bytes into the same
 * place. 0 ok. */
static int read_direct(const expert_store *s, uint64_t off, size_t n, uint8_t *at, int c) {
    const uint64_t a0 = off & ~(PAGE - 1), a1 = (off + n + PAGE - 1) & ~(PAGE - 1);
    const uint64_t c0 = a0 + (uint64_t)c * READ_CHUNK, c1 = c0 + READ_CHUNK < a1 ? c0 + READ_CHUNK : a1;
    uint64_t lo, hi;
    chunk_span(off, n, c, &lo, &hi);
    if (hi == lo) return 0;                 /* past the slice's end: only the cover's padding */
    if (c0 + pread_pages(s, at + (c0 - a0), c0, c1) >= hi) return 0;
    if (read_at(s, at + (lo - a0), (size_t)(hi - lo), lo) != 0) return -1;
    gguf_drop_cache(s->fd, lo, (size_t)(hi - lo));
    return 0;
}

/* Reads chunk c of slice k (0 gate, 1 up, 2 down) of expert e of row r into its place in dst
 * (a slice that is not direct is one chunk). */
static int read_slice(const expert_store *s, int r, int e, int k, int c, uint8_t *dst) {
    const es_row *R = &s->row[r];
    size_t at = 0;
    for (int j = 0; j < k; j++) at += R->held[j];
    const uint64_t off = slice_off(s, R, k, e);
    if (R->direct[k]) return read_direct(s, off, R->slice[k], dst + at, c);
    const uint8_t *src = read_landed(s, off, R->slice[k]);
    if (!src) return -1;
    if (!R->packed[k]) {
        memcpy(dst + at, src, R->slice[k]);
        return 0;
    }
    qmat m = {R->type[k], R->rows[k], R->cols[k], R->row_bytes[k], src, 0};
    qpack(&m, dst + at);
    return 0;
}

static void fill_w(const expert_store *s, int r, int e, const uint8_t *base, expert_w *out) {
    const es_row *R = &s->row[r];
    qmat *m[3] = {&out->gate, &out->up, &out->down};
    size_t at = 0;
    for (int k = 0; k < 3; k++) {
        m[k]->type = R->type[k];
        m[k]->rows = R->rows[k];
        m[k]->cols = R->cols[k];
        m[k]->row_bytes = R->row_bytes[k];
        m[k]->data = base + at + (R->direct[k] ? slice_off(s, R, k, e) & (PAGE - 1) : 0);
        m[k]->packed = R->packed[k];
        at += R->held[k];
    }
}

/* The RAM the cache may fill now: its own share plus the KV share's unused part (es_borrow). */
static size_t ram_limit(const expert_store *s) {
    if (!s->kv_used || s->o.ram_budget == SIZE_MAX) return s->o.ram_budget;
    return s->o.ram_budget + (s->kv_share > *s->kv_used ? s->kv_share - *s->kv_used : 0);
}

static void evict(expert_store *s, int i) {
    if (s->ent[i].pinned) s->ent[i].pinned = 0;
    else lru_unlink(s, i);
    free(s->ent[i].buf);
    s->ent[i].buf = NULL;
    s->ram_used -= s->row[i / s->cols].bytes;
    s->n_resident--;
}

/* Evicts unpinned residents until ram_used <= limit, least frequently selected first
 * (cumulative counts: the usage file's history and this run's), the least recently used among
 * equals; acquired, loading and read-ahead experts stay. An expert is evicted only for a
 * candidate selected at least as often (`cand`), so a skewed workload's hot set survives the
 * one-off picks of cold experts, while equal counts (a fresh start, uniform routing) behave as
 * an LRU. 0 when they fit. */
static int evict_to(expert_store *s, size_t limit, uint64_t cand) {
    while (s->ram_used > limit) {
        int victim = -1;
        for (int i = s->lru_tail; i >= 0; i = s->ent[i].prev) {
            const es_ent *x = &s->ent[i];
            if (x->in_use || x->loading >= 0 || x->ahead) continue;
            if (victim < 0 || s->count[i] < s->count[victim]) victim = i;
        }
        if (victim < 0 || s->count[victim] > cand) return -1;
        evict(s, victim);
    }
    return 0;
}

/* Room for `need` more bytes within ram_limit (evict_to). 0 when they fit. */
static int make_room(expert_store *s, size_t need, uint64_t cand) {
    const size_t lim = ram_limit(s);
    if (need > lim) return -1;
    return evict_to(s, lim - need, cand);
}

/* A scratch buffer for an expert read that does not stay resident: a pooled one (the most
 * recently returned, likely still in cache), else a new one of the largest expert's size. */
static uint8_t *scratch_take(expert_store *s) {
    if (s->pool_n > 0) return s->pool[--s->pool_n];
    uint8_t *b = weights_alloc(s->max_bytes ? s->max_bytes : 1);
    s->scratch_n += b != NULL;
    return b;
}

static void scratch_free(expert_store *s, uint8_t *b) {
    free(b);
    s->scratch_n--;
}

/* A scratch buffer back to the pool (freed when the pool cannot grow, or when more than the
 * budget's 2 x hold_max exist: a long prompt's layer once held every expert it read). */
static void scratch_give(expert_store *s, uint8_t *b) {
    if (!b) return;
    if (s->o.hold_max > 0 && s->scratch_n > 2 * s->o.hold_max) {
        scratch_free(s, b);
        return;
    }
    if (s->pool_n == s->pool_cap) {
        int nc = s->pool_cap ? s->pool_cap * 2 : 4;
        uint8_t **np = realloc(s->pool, sizeof *np * (size_t)nc);
        if (!np) {
            scratch_free(s, b);
            return;
        }
        s->pool = np;
        s->pool_cap = nc;
    }
    s->pool[s->pool_n++] = b;
}

/* ---- usage file ---- */
enum { USAGE_MISSING = -2, USAGE_FOREIGN = -1, USAGE_EMPTY = 0, USAGE_OK = 1 };

/* The usage file's counts into cnt (rows x cols, zeroed here). USAGE_OK: a history of this
 * model; USAGE_EMPTY: a zero-byte file (no history yet); USAGE_MISSING: no file;
 * USAGE_FOREIGN: unreadable, another model's, or damaged (cnt is then all zero). */
static int usage_read(const expert_store *s, uint64_t *cnt) {
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    memset(cnt, 0, n * sizeof *cnt);
    FILE *f = fopen(s->o.usage_path, "r");
    if (!f) return errno == ENOENT ? USAGE_MISSING : USAGE_FOREIGN;
    int *layer_row = malloc(sizeof(int) * (size_t)(s->n_layers_total + 1));
    if (!layer_row) {
        fclose(f);
        return USAGE_FOREIGN;
    }
    for (int l = 0; l <= s->n_layers_total; l++) layer_row[l] = -1;
    for (int r = 0; r < s->rows; r++)
        if (s->row[r].layer >= 0 && s->row[r].layer <= s->n_layers_total) layer_row[s->row[r].layer] = r;
    long long a, b;
    unsigned long long c;
    int recs = 0, ok = 1;
    while (ok && fscanf(f, "%lld %lld %llu", &a, &b, &c) == 3) {
        if (recs == 0) {
            if (a != -1 || b != s->n_layers_total || (long long)c != s->cols) ok = 0;
        } else if (recs == 1) {
            if (a != -2 || b != 1 || c != (unsigned long long)s->engine_id) ok = 0;
        } else if (a >= 0 && a <= s->n_layers_total && layer_row[a] >= 0 && b >= 0 && b < s->cols) {
            cnt[(size_t)layer_row[a] * (size_t)s->cols + (size_t)b] += c;
        }
        recs++;
    }
    if (ok && recs == 1) ok = 0;  /* a header without its engine line */
    if (ok && !feof(f)) ok = 0;   /* trailing garbage */
    free(layer_row);
    fclose(f);
    if (!ok) memset(cnt, 0, n * sizeof *cnt);
    return !ok ? USAGE_FOREIGN : recs == 0 ? USAGE_EMPTY : USAGE_OK;
}

static void usage_load(expert_store *s) {
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    const int rc = usage_read(s, s->count);
    if (rc == USAGE_FOREIGN)
        fprintf(stderr, "[usage] %s: header does not match this model (or unreadable); ignored\n",
                s->o.usage_path);
    memcpy(s->synced, s->count, n * sizeof *s->count);
}

/* Two engines on one model file (two bridges on one host) share its usage file by default.
 * Their saves take turns through an flock on <usage>.lock, so each rename puts one whole
 * snapshot in place (two writers of one .tmp interleaved their bytes, and the next load
 * threw the history away). The kernel drops a dead writer's lock, and a crash leaves at most
 * the .tmp that the next save overwrites. A lock held for USAGE_LOCK_WAIT_MS skips this
 * save: the history is best effort, a turn's end must never hang on it. */
#define USAGE_LOCK_WAIT_MS 200
static int usage_lock(const char *usage_path) {
    char lock[1100];
    snprintf(lock, sizeof lock, "%s.lock", usage_path);
    int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return -1;
    for (int waited = 0; flock(fd, LOCK_EX | LOCK_NB) != 0; waited += 5) {
        if (errno != EWOULDBLOCK || waited >= USAGE_LOCK_WAIT_MS) {
            close(fd);
            return -2;
        }
        nanosleep(&(struct timespec){.tv_nsec = 5000000}, NULL);
    }
    return fd;
}

/* What a save writes (under the lock): the file's counts plus this engine's selections since
 * it last read or wrote the file (count - synced), so the other engines' selections since
 * then are kept, not overwritten by this one's view (the last writer used to win). With no
 * usable file, this engine's own counts. */
static void usage_merged(const expert_store *s, uint64_t *out) {
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    const int rc = usage_read(s, out);
    for (size_t i = 0; i < n; i++)
        out[i] = rc >= USAGE_EMPTY ? out[i] + (s->count[i] - s->synced[i]) : s->count[i];
}

static int usage_write(const expert_store *s, const uint64_t *cnt) {
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    int any = 0;
    for (size_t i = 0; i < n; i++) any |= cnt[i] != 0;
    char tmp[1100];
    snprintf(tmp, sizeof tmp, "%s.tmp", s->o.usage_path);
    FILE *f = fopen(tmp, "w");
    if (!f) return -1;
    int rc = 0;
    if (any) {
        if (fprintf(f, "-1 %d %d\n-2 1 %u\n", s->n_layers_total, s->cols, (unsigned)s->engine_id) < 0) rc = -1;
        for (size_t i = 0; i < n && rc == 0; i++)
            if (cnt[i] &&
                fprintf(f, "%d %d %llu\n", s->row[i / (size_t)s->cols].layer, (int)(i % (size_t)s->cols),
                        (unsigned long long)cnt[i]) < 0)
                rc = -1;
    }
    if (fflush(f) != 0) rc = -1;
    if (fclose(f) != 0) rc = -1;
    if (rc == 0 && rename(tmp, s->o.usage_path) != 0) rc = -1;
    if (rc != 0) unlink(tmp);
    return rc;
}

/* A successful save also takes the merged counts in: this engine's heat and pinning then see
 * the other engines' history too. */
int es_usage_save(expert_store *s) {
    if (!s || !s->o.usage_path[0] || !s->o.usage_save) return 0;
    struct stat st;
    if (stat(s->o.usage_path, &st) == 0 && !S_ISREG(st.st_mode))
        return 0;   /* USAGE_FILE=/dev/null and the like: a rename would replace the device */
    const size_t n = (size_t)s->rows * (size_t)s->cols;
    const int lock = usage_lock(s->o.usage_path);
    if (lock == -2) return ES_USAGE_BUSY;
    uint64_t *merged = malloc((n ? n : 1) * sizeof *merged);
    int rc = -1;
    if (merged) {
        usage_merged(s, merged);
        rc = usage_write(s, merged);
        if (rc == 0) {
            memcpy(s->count, merged, n * sizeof *merged);
            memcpy(s->synced, merged, n * sizeof *merged);
        }
        free(merged);
    }
    if (lock >= 0) close(lock);  /* releases the flock */
    return rc;
}

/* ---- pinning ---- */
/* Order of expert indices by count descending, ties lower index first. */
static void heat_order(const expert_store *s, int *idx, int n) {
    for (int i = 0; i < n; i++) idx[i] = i;
    /* insertion sort would be O(n^2) for 20k experts; use a simple merge sort */
    int *tmp = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!tmp) return;  /* leaves index order: a valid if suboptimal pin order */
    for (int w = 1; w < n; w *= 2) {
        for (int lo = 0; lo < n; lo += 2 * w) {
            int mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n;
            int a = lo, b = mid, k = lo;
            while (a < mid && b < hi) {
                uint64_t ca = s->count[idx[a]], cb = s->count[idx[b]];
                if (ca > cb || (ca == cb && idx[a] < idx[b])) tmp[k++] = idx[a++];
                else tmp[k++] = idx[b++];
            }
            while (a < mid) tmp[k++] = idx[a++];
            while (b < hi) tmp[k++] = idx[b++];
        }
        memcpy(idx, tmp, sizeof(int) * (size_t)n);
    }
    free(tmp);
}

/* want[i] = 1 for the experts that should be pinned now. */
static void wanted_pins(const expert_store *s, uint8_t *want) {
    int n = s->rows * s->cols;
    memset(want, 0, (size_t)n);
    size_t budget = s->o.pin_budget < s->o.ram_budget ? s->o.pin_budget : s->o.ram_budget;   /* never borrowed */
    int *idx = malloc(sizeof(int) * (size_t)(n ? n : 1));
    if (!idx) return;
    heat_order(s, idx, n);
    size_t used = 0;
    for (int k = 0; k < n; k++) {
        int i = idx[k];
        if (s->count[i] == 0) break;
        size_t b = s->row[i / s->cols].bytes;
        if (used + b > budget) continue;
        used += b;
        want[i] = 1;
    }
    free(idx);
}

void es_repin(expert_store *s, repin_cb cb, void *ud) {
    if (!s || s->rows == 0) return;
    /* every expert in RAM: a pin moves nothing, so there is no tier change to report (at full
     * RAM each first-routed expert was reported as re-pinned: thousands of lines at 48 x 128) */
    if (s->o.ram_budget == SIZE_MAX) cb = NULL;
    reads_settle(s, &s->rd[ACQ], NULL);     /* reads in flight settle first (a pin is never in the LRU) */
    for (int k = AHEAD; k < N_BATCHES; k++) ahead_settle(s, &s->rd[k], NULL);
    int n = s->rows * s->cols;
    uint8_t *want = malloc((size_t)n);
    if (!want) return;
    wanted_pins(s, want);
    /* Unpin first: those become ordinary LRU residents (still tier 1). */
    for (int i = 0; i < n; i++) {
        es_ent *x = &s->ent[i];
        if (x->pinned && !want[i]) {
            x->pinned = 0;
            lru_push_head(s, i);
            if (cb) cb(ud, s->row[i / s->cols].layer, i % s->cols, 1, 0);
        }
    }
    /* Then pin, a row at a time: the residents at once, the others read on the I/O lanes (a
     * turn's end pins up to the whole budget: read one by one it held DONE back for seconds). */
    for (int r = 0; r < s->rows; r++) {
        es_reads *J = &s->rd[ACQ];
        J->r = r;
        for (int e = 0; e < s->cols; e++) {
            const int i = r * s->cols + e;
            es_ent *x = &s->ent[i];
            if (x->pinned || !want[i]) continue;
            if (x->buf) {
                lru_unlink(s, i);
                x->pinned = 1;
                if (cb) cb(ud, s->row[r].layer, e, 1, 0);
                continue;
            }
            uint8_t *b = x->tmp ? NULL : reserve_resident(s, r, i, UINT64_MAX);
            if (b) reads_add(s, J, ACQ, e, b, 1);
        }
        const int n_read = J->n;
        int read_e[n_read > 0 ? n_read : 1];
        memcpy(read_e, J->e, sizeof(int) * (size_t)n_read);
        reads_submit(J);
        reads_settle(s, J, NULL);
        for (int k = 0; k < n_read; k++) {
            const int i = r * s->cols + read_e[k];
            if (!s->ent[i].buf) continue;       /* its read failed */
            lru_unlink(s, i);
            s->ent[i].pinned = 1;
            if (cb) cb(ud, s->row[r].layer, read_e[k], 0, 0);
        }
    }
    free(want);
}

/* ---- create / free ---- */
/* Everything resident, read a row at a time on the I/O lanes (a file of tens of GB loads at
 * the disk's parallel rate, not one pread at a time). 0 ok, -1 a read failed. */
static int load_all(expert_store *s) {
    for (int r = 0; r < s->rows; r++) {
        es_reads *J = &s->rd[ACQ];
        J->r = r;
        int bad = 0;
        for (int e = 0; e < s->cols && !bad; e++)
            if (!s->ent[r * s->cols + e].buf) bad = queue_read(s, J, ACQ, r, e) != 0;
        reads_submit(J);
        bad += reads_settle(s, J, NULL);
        if (bad) return -1;
    }
    s->io = (es_io_stats){0};           /* loading is not a turn's I/O */
    return 0;
}

int es_set_budget(expert_store *s, size_t ram_budget, size_t pin_budget, int hold_max) {
    if (!s) return 0;
    s->o.ram_budget = ram_budget;
    s->o.pin_budget = pin_budget;
    s->o.hold_max = hold_max;
    if (s->n_resident == 0 && s->scratch_n == 0) rows_layout(s);   /* the layout follows the budget */
    while (s->pool_n > 0 && hold_max > 0 && s->scratch_n > 2 * hold_max) scratch_free(s, s->pool[--s->pool_n]);
    if (ram_budget == SIZE_MAX && load_all(s) != 0) return -1;
    es_repin(s, NULL, NULL);
    return 0;
}

void es_borrow(expert_store *s, const size_t *kv_used, size_t kv_share) {
    if (!s) return;
    s->kv_used = kv_used;
    s->kv_share = kv_used ? kv_share : 0;
}

size_t es_borrowable(const expert_store *s) {
    return s && s->kv_used && s->o.ram_budget != SIZE_MAX ? s->kv_share : 0;
}

size_t es_borrowed(const expert_store *s) {
    return s && s->o.ram_budget != SIZE_MAX && s->ram_used > s->o.ram_budget ? s->ram_used - s->o.ram_budget : 0;
}

/* The pinned expert selected least often (ties: the higher index, the last in heat order)
 * that nothing holds; -1 none. */
static int coldest_pin(const expert_store *s) {
    int v = -1;
    for (int i = 0; i < s->rows * s->cols; i++) {
        const es_ent *x = &s->ent[i];
        if (!x->pinned || !x->buf || x->in_use || x->loading >= 0 || x->ahead) continue;
        if (v < 0 || s->count[i] <= s->count[v]) v = i;
    }
    return v;
}

/* Called only between forwards (kv.h kv_set_reclaim), when no expert is acquired: the
 * read-ahead batch of the next forward's first row may still be in flight, and is settled and
 * retired (its guesses become ordinary residents) only when evicting the others was not enough.
 * In-use and loading experts are never freed here, whenever it is called. Pins stay within
 * ram_budget, so with nothing held the LRU alone gives everything borrowed back. */
void es_kv_room(void *store, size_t kv_after) {
    expert_store *s = store;
    if (!s || !s->kv_used || s->o.ram_budget == SIZE_MAX) return;
    const size_t cap = s->o.ram_budget + s->kv_share;
    const size_t lim = cap > kv_after ? cap - kv_after : 0;
    if (evict_to(s, lim, UINT64_MAX) == 0) return;
    int settled = 0;
    for (int k = AHEAD; k < N_BATCHES; k++) {
        settled |= s->rd[k].active;
        ahead_settle(s, &s->rd[k], NULL);
    }
    if (settled && evict_to(s, lim, UINT64_MAX) == 0) return;
    for (int v; s->ram_used > lim && (v = coldest_pin(s)) >= 0;) evict(s, v);
}

int es_hold_max(const expert_store *s) {
    return s && s->o.hold_max > 0 && s->o.hold_max < s->cols ? s->o.hold_max : s ? s->cols : 0;
}

size_t es_all_bytes(const expert_store *s) {
    size_t b = 0;
    for (int r = 0; s && r < s->rows; r++) b += s->row[r].bytes * (size_t)s->cols;
    return b;
}

expert_store *es_create(const gguf_file *g, const expert_layer_src *rows, int n_rows,
                        int n_experts, const expert_opts *o, uint32_t engine_id,
                        int n_layers_total, char *err, size_t errlen) {
    if (n_rows < 0 || n_experts < 0 || (n_rows > 0 && n_experts < 1)) {
        set_err(err, errlen, "expert store: bad dimensions%s", "");
        return NULL;
    }
    expert_store *s = calloc(1, sizeof *s);
    if (!s) goto oom;
    s->fd = g ? g->fd : -1;
    s->dfd = -1;
    const char *dv = getenv("EXPERT_DIRECT");
    if (g && g->fd >= 0 && !(dv && !strcmp(dv, "0"))) s->dfd = open(g->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
    s->map = g ? g->map : NULL;
    s->map_size = g ? g->size : 0;
    s->rows = n_rows;
    s->cols = n_experts;
    s->n_layers_total = n_layers_total;
    s->engine_id = engine_id;
    if (o) s->o = *o;
    else s->o.ram_budget = SIZE_MAX;
    s->o.usage_path[sizeof s->o.usage_path - 1] = 0;
    s->lru_head = s->lru_tail = -1;
    size_t n = (size_t)n_rows * (size_t)n_experts;
    s->row = calloc((size_t)(n_rows ? n_rows : 1), sizeof *s->row);
    s->ent = calloc(n ? n : 1, sizeof *s->ent);
    s->count = calloc(n ? n : 1, sizeof *s->count);
    s->synced = calloc(n ? n : 1, sizeof *s->synced);
    s->hits_bytes = (n + 7) / 8;
    s->hits = calloc(s->hits_bytes ? s->hits_bytes : 1, 1);
    s->mark = calloc((size_t)(n_experts > 0 ? n_experts : 1), 1);
    if (!s->row || !s->ent || !s->count || !s->synced || !s->hits || !s->mark) goto oom;
    for (size_t i = 0; i < n; i++) {
        s->ent[i].prev = s->ent[i].next = -1;
        s->ent[i].loading = -1;
    }
    for (int k = 0; k < N_BATCHES; k++) {
        es_reads *J = &s->rd[k];
        const size_t m = (size_t)(n_experts > 0 ? n_experts : 1);
        J->s = s;
        J->e = calloc(m, sizeof *J->e);
        J->resident = calloc(m, sizeof *J->resident);
        J->ok = calloc(3 * m, sizeof *J->ok);
        J->dst = calloc(m, sizeof *J->dst);
        J->state = calloc(m, sizeof *J->state);
        if (!J->e || !J->resident || !J->ok || !J->dst || !J->state) goto oom;
    }

    for (int r = 0; r < n_rows; r++) {
        es_row *R = &s->row[r];
        const gguf_tensor *t[3] = {rows[r].gate, rows[r].up, rows[r].down};
        const gguf_tensor *const *per = rows[r].per;
        R->layer = rows[r].layer;
        if (per && !(R->eoff = malloc(sizeof *R->eoff * 3 * (size_t)n_experts))) goto oom;
        for (int k = 0; k < 3; k++) {
            if (!t[k] || (per ? t[k]->n_dims > 2 : t[k]->n_dims != 3 || t[k]->ne[2] != (uint64_t)n_experts)) {
                if (err && errlen)
                    snprintf(err, errlen, "blk.%d: expert tensor %d is missing or not [*, *, %d]", R->layer, k,
                             n_experts);
                es_free(s);
                return NULL;
            }
            const int half = rows[r].fused && k < 2;    /* gate or up: half of each expert's rows */
            R->type[k] = t[k]->type;
            R->cols[k] = (int)t[k]->ne[0];
            R->rows[k] = (int)(t[k]->ne[1] >> half);
            R->row_bytes[k] = ggml_row_bytes(t[k]->type, t[k]->ne[0]);
            R->slice[k] = R->row_bytes[k] * (size_t)R->rows[k];
            R->stride[k] = (uint64_t)R->slice[k] << half;
            R->off[k] = t[k]->file_offset + (k == 1 && half ? R->slice[k] : 0);
            for (int e = 0; per && e < n_experts; e++) {   /* every expert's tensor like expert 0's */
                const gguf_tensor *x = per[(size_t)k * (size_t)n_experts + (size_t)e];
                if (!x || x->type != t[k]->type || x->n_dims > 2 || x->ne[0] != t[k]->ne[0] || x->ne[1] != t[k]->ne[1] ||
                    x->file_offset + R->slice[k] > (g ? g->size : 0)) {
                    if (err && errlen)
                        snprintf(err, errlen, "%.*s: missing, outside the file, or not of expert 0's type and shape",
                                 x ? (int)x->name.len : 1, x ? x->name.ptr : "?");
                    es_free(s);
                    return NULL;
                }
                R->eoff[(size_t)k * (size_t)n_experts + (size_t)e] = x->file_offset;
            }
            if (R->row_bytes[k] == 0 ||
                (!per && R->off[k] + R->stride[k] * (uint64_t)(n_experts - 1) + R->slice[k] > (g ? g->size : 0))) {
                if (err && errlen)
                    snprintf(err, errlen, "%.*s: unsupported type or data outside the file", (int)t[k]->name.len,
                             t[k]->name.ptr);
                es_free(s);
                return NULL;
            }
        }
    }
    rows_layout(s);

    if (s->o.usage_path[0] && n > 0) usage_load(s);

    if (s->o.ram_budget == SIZE_MAX && load_all(s) != 0) {
        set_err(err, errlen, "expert store: cannot read experts from %s", g ? g->path : "?");
        es_free(s);
        return NULL;
    }
    es_repin(s, NULL, NULL);
    return s;
oom:
    set_err(err, errlen, "expert store: out of memory%s", "");
    es_free(s);
    return NULL;
}

void es_free(expert_store *s) {
    if (!s) return;
    for (int k = 0; k < N_BATCHES; k++) {
        if (s->rd[k].active && s->ent) reads_settle(s, &s->rd[k], NULL);
        free(s->rd[k].e);
        free(s->rd[k].resident);
        free(s->rd[k].ok);
        free(s->rd[k].dst);
        free((void *)s->rd[k].state);
    }
    if (s->dfd >= 0) close(s->dfd);
    size_t n = (size_t)s->rows * (size_t)s->cols;
    if (s->ent)
        for (size_t i = 0; i < n; i++) {
            free(s->ent[i].buf);
            free(s->ent[i].tmp);
        }
    for (int i = 0; i < s->pool_n; i++) free(s->pool[i]);
    free(s->pool);
    for (int r = 0; s->row && r < s->rows; r++) free(s->row[r].eoff);
    free(s->row);
    free(s->ent);
    free(s->count);
    free(s->synced);
    free(s->hits);
    free(s->mark);
    free(s);
}

/* ---- acquire / release ---- */

/* Task t of a batch: one chunk of one slice of its (t / R->tasks)-th expert, in file order (so
 * the lanes read the first expert's slices together and it is ready first, and a wrong guess
 * stopped mid-read wastes at most a chunk per lane). Pread and packing only: all cache
 * bookkeeping stays on the caller. */
static void read_task(void *vctx, int t) {
    es_reads *J = vctx;
    const es_row *R = &J->s->row[J->r];
    const int x = t / R->tasks;
    int k = 0, c = t % R->tasks;
    while (c >= R->chunks[k]) c -= R->chunks[k++];
    int st = QUEUED;
    if (!atomic_compare_exchange_strong(&J->state[x], &st, STARTED) && (st == CANCELLED || st == STOPPED)) {
        atomic_store(&J->ok[3 * x + k], 0);
        if (st == STOPPED) {
            uint64_t lo = 0, hi = R->slice[k];
            if (R->direct[k]) chunk_span(slice_off(J->s, R, k, J->e[x]), R->slice[k], c, &lo, &hi);
            atomic_fetch_add(&J->skipped, (size_t)(hi - lo));
        }
        return;
    }
    if (read_slice(J->s, J->r, J->e[x], k, c, J->dst[x]) != 0) atomic_store(&J->ok[3 * x + k], 0);
}

/* Expert e of row r goes into batch J: a resident buffer when the budget admits it (make_room),
 * else a scratch buffer. The entry is marked loading; -1 out of memory. */
/* A resident buffer for expert i of row r when the budget admits it for a candidate selected
 * cand times (make_room); counted at once, so later make_room calls see it. NULL otherwise. */
static uint8_t *reserve_resident(expert_store *s, int r, int i, uint64_t cand) {
    const size_t bytes = s->row[r].bytes;
    uint8_t *b = NULL;
    if (make_room(s, bytes, cand) != 0 || !(b = weights_alloc(bytes ? bytes : 1))) return NULL;
    s->ram_used += bytes;
    s->n_resident++;
    s->ent[i].buf = b;
    return b;
}

/* Expert e of J's row into batch J, read into b (resident or a scratch copy): marked loading. */
static void reads_add(expert_store *s, es_reads *J, int which, int e, uint8_t *b, int resident) {
    const es_row *R = &s->row[J->r];
    s->ent[J->r * s->cols + e].loading = (int8_t)which;
    atomic_store(&J->state[J->n], QUEUED);
    for (int k = 0; k < 3; k++) atomic_store(&J->ok[3 * J->n + k], 1);
    J->e[J->n] = e;
    J->resident[J->n] = resident;
    J->dst[J->n++] = b;
    s->io.disk_bytes += file_bytes(R);
}

/* Expert e of row r (J's row) goes into batch J: a resident buffer when the budget admits it,
 * else a scratch buffer. -1 out of memory. */
static int queue_read(expert_store *s, es_reads *J, int which, int r, int e) {
    const int i = r * s->cols + e;
    uint8_t *b = reserve_resident(s, r, i, s->count[i]);
    const int res = b != NULL;
    if (!b) {
        if (!(b = scratch_take(s))) return -1;
        s->ent[i].tmp = b;
    }
    reads_add(s, J, which, e, b, res);
    return 0;
}

static void reads_submit(es_reads *J) {
    if (J->n == 0) return;
    J->active = 1;
    io_submit(&J->b, read_task, J, J->s->row[J->r].tasks * J->n);
}

/* Waits for batch J and settles it: each read either becomes usable (a resident joins the
 * LRU) or, failed, gives its buffer back. Returns the number of failed reads. */
static int reads_settle(expert_store *s, es_reads *J, double *t_stall) {
    if (!J->active) return 0;
    double t0 = es_now();
    io_wait(&J->b);
    s->io.stall_s += es_now() - t0;
    if (t_stall) *t_stall += es_now() - t0;
    int bad = 0;
    for (int k = 0; k < J->n; k++) {
        const int i = J->r * s->cols + J->e[k];
        es_ent *x = &s->ent[i];
        const int st = atomic_load(&J->state[k]);
        const int read = J->ok[3 * k] && J->ok[3 * k + 1] && J->ok[3 * k + 2];
        const int cancelled = st == CANCELLED || (st == STOPPED && !read);
        const int ok = !cancelled && read;
        x->loading = -1;
        if (ok && J->resident[k]) {
            lru_push_head(s, i);
        } else if (J->resident[k]) {
            free(x->buf);
            x->buf = NULL;
            s->ram_used -= s->row[J->r].bytes;
            s->n_resident--;
        } else if (cancelled) {
            scratch_give(s, x->tmp);
            x->tmp = NULL;
        } else if (!ok) {
            scratch_free(s, x->tmp);
            x->tmp = NULL;
        }
        if (!ok) x->ahead = 0;
        bad += !ok && !cancelled;
    }
    s->io.disk_bytes -= atomic_exchange(&J->skipped, 0);
    J->active = 0;
    J->swept = 0;
    J->n = 0;
    return bad;
}

/* Settles lookahead batch J (when active); then its scratch copies that nobody acquired go
 * back to the pool (the guess was wrong) and its residents lose their protection either way. */
static void ahead_settle(expert_store *s, es_reads *J, double *t_stall) {
    if (!J->active) return;
    const int n = J->n, r = J->r;      /* reads_settle empties the batch, not its lists */
    reads_settle(s, J, t_stall);
    for (int k = 0; k < n; k++) {
        es_ent *x = &s->ent[r * s->cols + J->e[k]];
        x->ahead = 0;
        if (x->tmp && x->in_use == 0) {
            x->in_use = 1;
            es_release(s, r, J->e[k]);
        }
    }
}

/* The lookahead's guesses for row r that the acquisition of list does not ask for: cancelled
 * when no lane has begun them, else stopped (the slices not begun are skipped), so the misses
 * queued behind them are read first and no disk time goes to them (their bytes come off
 * disk_bytes; a stopped one's at its settle). A batch swept before (its row acquired again,
 * e.g. by a prefill after the last layer's guesses) is settled first: a guess it cancelled may
 * be asked for now, and is then read as a miss. */
static void ahead_sweep(expert_store *s, int r, const int *list, int n) {
    for (int k = 0; k < n; k++) s->mark[list[k]] = 1;
    const es_row *R = &s->row[r];
    for (int b = AHEAD; b < N_BATCHES; b++) {
        es_reads *A = &s->rd[b];
        if (!A->active || A->r != r) continue;
        if (A->swept) {
            ahead_settle(s, A, NULL);
            continue;
        }
        for (int k = 0; k < A->n; k++) {
            int st = QUEUED;
            if (s->mark[A->e[k]] || s->ent[r * s->cols + A->e[k]].in_use) continue;
            if (atomic_compare_exchange_strong(&A->state[k], &st, CANCELLED))
                s->io.disk_bytes -= file_bytes(R);
            else if (st == STARTED)
                atomic_compare_exchange_strong(&A->state[k], &st, STOPPED);
        }
        A->swept = 1;
    }
    for (int k = 0; k < n; k++) s->mark[list[k]] = 0;
}

/* outs indexed by expert id, or by position in list when by_pos (es_acquire's one expert) */
#define OUT_OF(k) (by_pos ? &outs[k] : &outs[list[k]])

static int acquire_begin(expert_store *s, int r, const int *list, int n, expert_w *outs, int *ready, int by_pos) {
    if (!s || r < 0 || r >= s->rows || n < 0 || n > s->cols) return -1;
    es_reads *J = &s->rd[ACQ];
    if (J->active) reads_settle(s, J, NULL);    /* a finish that never came: settle it now */
    J->r = r;
    for (int k = 0; k < n; k++) {
        ready[k] = 0;
        if (list[k] < 0 || list[k] >= s->cols) {
            for (int q = 0; q < k; q++) es_release(s, r, list[q]);
            reads_submit(J);
            reads_settle(s, J, NULL);
            return -1;
        }
    }
    ahead_sweep(s, r, list, n);
    for (int k = 0; k < n; k++) {
        const int e = list[k], i = r * s->cols + e;
        es_ent *x = &s->ent[i];
        s->acq_all++;
        s->io.acquisitions++;
        s->io.ideal_bytes += file_bytes(&s->row[r]);
        if (x->ahead && (x->buf || x->tmp)) s->io.ahead_used++;
        x->ahead = 0;
        if (x->loading < 0 && (x->buf || x->tmp)) {     /* in RAM, or read for another holder */
            if (x->buf) {
                s->acq_ram++;
                s->io.hits++;
                if (!x->pinned) {
                    lru_unlink(s, i);
                    lru_push_head(s, i);
                }
            }
            x->in_use++;
            fill_w(s, r, list[k], x->buf ? x->buf : x->tmp, OUT_OF(k));
            ready[k] = 1;
            continue;
        }
        if (x->loading < 0 && queue_read(s, J, ACQ, r, e) != 0) {
            for (int q = 0; q < k; q++) es_release(s, r, list[q]);
            reads_submit(J);
            reads_settle(s, J, NULL);
            return -1;
        }
        x->in_use++;                    /* loading: in this batch or the lookahead's */
    }
    reads_submit(J);
    return 0;
}

static int acquire_finish(expert_store *s, int r, const int *list, int n, expert_w *outs, int *ready, double *t_read_s,
                          int by_pos) {
    int pending = 0;
    for (int k = 0; k < n; k++) pending |= !ready[k];
    if (!pending) return 0;
    double stall = 0.0;
    /* a lookahead batch is waited for only when it holds one of these: a prefill streams its
     * next group of experts there while this group computes */
    int bad = reads_settle(s, &s->rd[ACQ], &stall);
    for (int k = 0; k < n; k++) {
        const int b = s->ent[r * s->cols + list[k]].loading;
        if (!ready[k] && b >= AHEAD) ahead_settle(s, &s->rd[b], &stall);
    }
    if (t_read_s) *t_read_s += stall;
    int rc = 0;
    for (int k = 0; k < n; k++) {
        if (ready[k]) continue;
        es_ent *x = &s->ent[r * s->cols + list[k]];
        if (x->buf || x->tmp) {
            fill_w(s, r, list[k], x->buf ? x->buf : x->tmp, OUT_OF(k));
            ready[k] = 1;
        } else {
            rc = -1;                    /* its read failed */
        }
    }
    (void)bad;
    if (rc != 0)                        /* nothing this call took stays held after a failure */
        for (int k = 0; k < n; k++) {
            es_ent *x = &s->ent[r * s->cols + list[k]];
            if (x->in_use > 0) es_release(s, r, list[k]);
        }
    return rc;
}

#undef OUT_OF

int es_acquire_begin(expert_store *s, int r, const int *list, int n, expert_w *outs, int *ready) {
    return acquire_begin(s, r, list, n, outs, ready, 0);
}

int es_acquire_finish(expert_store *s, int r, const int *list, int n, expert_w *outs, int *ready, double *t_read_s) {
    return acquire_finish(s, r, list, n, outs, ready, t_read_s, 0);
}

int es_acquire(expert_store *s, int r, int e, expert_w *out, double *t_read_s) {
    int ready = 0;
    if (acquire_begin(s, r, &e, 1, out, &ready, 1) != 0) return -1;
    return acquire_finish(s, r, &e, 1, out, &ready, t_read_s, 1);
}

int es_acquire_many(expert_store *s, int r, const int *list, int n, expert_w *outs, double *t_read_s) {
    if (n < 0 || (s && n > s->cols)) return -1;
    int ready[n > 0 ? n : 1];
    if (es_acquire_begin(s, r, list, n, outs, ready) != 0) return -1;
    return es_acquire_finish(s, r, list, n, outs, ready, t_read_s);
}

void es_read_ahead(expert_store *s, int r, const int *list, int n) {
    if (!s || r < 0 || r >= s->rows || n <= 0) return;
    /* a free lookahead batch, else the older one: read by now, or soon */
    es_reads *J = &s->rd[AHEAD], *O = &s->rd[AHEAD + 1];
    if (J->active && (!O->active || O->seq < J->seq)) J = O, O = &s->rd[AHEAD];
    ahead_settle(s, J, NULL);
    J->r = r;
    J->seq = ++s->ahead_seq;
    /* the two batches together stay within what an acquisition may hold */
    const int room = s->o.hold_max > 0 ? s->o.hold_max - (O->active ? O->n : 0) : n;
    if (n > room) n = room;
    for (int k = 0; k < n; k++) {
        if (list[k] < 0 || list[k] >= s->cols) continue;
        es_ent *x = &s->ent[r * s->cols + list[k]];
        if (x->buf || x->tmp || x->loading >= 0) continue;
        if (queue_read(s, J, (int)(J - s->rd), r, list[k]) != 0) break;
        x->ahead = 1;
        s->io.ahead_issued++;
    }
    reads_submit(J);
}

int es_lookahead(const expert_store *s) { return s && s->o.ram_budget != SIZE_MAX && !s->o.no_lookahead; }

void es_io(const expert_store *s, es_io_stats *out) {
    if (s) *out = s->io;
    else memset(out, 0, sizeof *out);
}

void es_release(expert_store *s, int r, int e) {
    if (!s || r < 0 || r >= s->rows || e < 0 || e >= s->cols) return;
    es_ent *x = &s->ent[r * s->cols + e];
    if (x->in_use > 0) x->in_use--;
    if (x->in_use == 0 && x->tmp) {
        scratch_give(s, x->tmp);
        x->tmp = NULL;
    }
}

/* ---- bookkeeping and telemetry ---- */
void es_note(expert_store *s, int r, int e, int heat) {
    if (!s || r < 0 || r >= s->rows || e < 0 || e >= s->cols) return;
    size_t i = (size_t)r * (size_t)s->cols + (size_t)e;
    if (heat) s->count[i]++;
    s->hits[i >> 3] |= (uint8_t)(1u << (i & 7));
}

void es_note_selected(expert_store *s, int r, int e) { es_note(s, r, e, 1); }

int es_rows(const expert_store *s) { return s ? s->rows : 0; }
int es_cols(const expert_store *s) { return s ? s->cols : 0; }

static int bit_length(uint64_t v) {
    int b = 0;
    while (v) {
        b++;
        v >>= 1;
    }
    return b > 63 ? 63 : b;
}

void es_emap(const expert_store *s, uint8_t *out) {
    if (!s) return;
    size_t n = (size_t)s->rows * (size_t)s->cols;
    for (size_t i = 0; i < n; i++) {
        int tier = s->ent[i].buf ? 1 : 0;
        out[i] = (uint8_t)((tier << 6) | bit_length(s->count[i]));
    }
}

void es_hits_take(expert_store *s, uint8_t *bits) {
    if (!s) return;
    memcpy(bits, s->hits, s->hits_bytes);
    memset(s->hits, 0, s->hits_bytes);
}

void es_tiers(const expert_store *s, int *vram, int *ram, int *disk, double *vram_gb, double *ram_gb) {
    int total = s ? s->rows * s->cols : 0, res = s ? s->n_resident : 0;
    if (vram) *vram = 0;
    if (ram) *ram = res;
    if (disk) *disk = total - res;
    if (vram_gb) *vram_gb = 0.0;
    if (ram_gb) *ram_gb = s ? (double)s->ram_used / 1e9 : 0.0;
}

double es_hit_pct_take(expert_store *s) {
    if (!s) return 0.0;
    double pct = s->acq_all ? 100.0 * (double)s->acq_ram / (double)s->acq_all : 0.0;
    s->acq_all = s->acq_ram = 0;
    return pct;
}

size_t es_expert_bytes(const expert_store *s) { return s ? s->max_bytes : 0; }
