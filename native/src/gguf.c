/* gguf.c — read-only view of a GGUF (v2/v3) file: mmap, header, metadata, tensor infos.
 * Every byte read is bounds-checked against the file size; failures set a one-line
 * reason in g->err and return -1. The file descriptor stays open for pread users. */
#include "gguf.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#define GGUF_MAX_DEPTH 8            /* nesting limit for arrays of arrays */
#define GGUF_DEFAULT_ALIGN 32

/* ---- ggml type table ---------------------------------------------------------- */

const char *ggml_type_name(uint32_t type)
{
    static const char *names[] = {
        [0] = "F32", [1] = "F16", [2] = "Q4_0", [3] = "Q4_1", [6] = "Q5_0", [7] = "Q5_1",
        [8] = "Q8_0", [9] = "Q8_1", [10] = "Q2_K", [11] = "Q3_K", [12] = "Q4_K",
        [13] = "Q5_K", [14] = "Q6_K", [15] = "Q8_K", [16] = "IQ2_XXS", [17] = "IQ2_XS",
        [18] = "IQ3_XXS", [19] = "IQ1_S", [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S",
        [23] = "IQ4_XS", [24] = "I8", [25] = "I16", [26] = "I32", [27] = "I64", [28] = "F64",
        [29] = "IQ1_M", [30] = "BF16", [34] = "TQ1_0", [35] = "TQ2_0", [39] = "MXFP4",
    };
    if (type < sizeof names / sizeof names[0] && names[type]) return names[type];
    return "unknown";
}

int ggml_type_known(uint32_t type)
{
    return ggml_row_bytes(type, 256) != 0;
}

const char *ggml_known_types(void) { return "F32 F16 BF16 Q4_0 Q4_1 Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S IQ4_NL IQ4_XS MXFP4"; }

size_t ggml_row_bytes(uint32_t type, uint64_t n)
{
    uint64_t blk, bytes;
    switch (type) {
    case GGML_F32:  blk = 1;  bytes = 4;  break;
    case GGML_F16:  blk = 1;  bytes = 2;  break;
    case GGML_Q4_0: blk = 32; bytes = 18; break;
    case GGML_Q4_1: blk = 32; bytes = 20; break;
    case GGML_Q5_0: blk = 32; bytes = 22; break;
    case GGML_Q5_1: blk = 32; bytes = 24; break;
    case GGML_Q8_0: blk = 32; bytes = 34; break;
    case GGML_BF16: blk = 1;  bytes = 2;  break;
    case GGML_Q2_K: blk = 256; bytes = 84; break;
    case GGML_Q3_K: blk = 256; bytes = 110; break;
    case GGML_Q4_K: blk = 256; bytes = 144; break;
    case GGML_Q5_K: blk = 256; bytes = 176; break;
    case GGML_Q6_K: blk = 256; bytes = 210; break;
    case GGML_IQ4_NL: blk = 32; bytes = 18; break;
    case GGML_IQ4_XS: blk = 256; bytes = 136; break;
    case GGML_MXFP4: blk = 32; bytes = 17; break;
    case GGML_IQ1_S: blk = 256; bytes = 50; break;
    case GGML_IQ1_M: blk = 256; bytes = 56; break;
    case GGML_IQ2_XXS: blk = 256; bytes = 66; break;
    case GGML_IQ2_XS: blk = 256; bytes = 74; break;
    case GGML_IQ2_S: blk = 256; bytes = 82; break;
    case GGML_IQ3_XXS: blk = 256; bytes = 98; break;
    case GGML_IQ3_S: blk = 256; bytes = 110; break;
    default: return 0;
    }
    if (n == 0 || n % blk) return 0;
    if (n / blk > (uint64_t)SIZE_MAX / bytes) return 0;
    return (size_t)(n / blk * bytes);
}

/* ---- bounds-checked cursor ------------------------------------------------------ */

typedef struct {
    const uint8_t *p;
    uint64_t pos, size;
} cur;

static uint64_t left(const cur *c) { return c->size - c->pos; }

static int rd(cur *c, void *dst, uint64_t n)
{
    if (n > left(c)) return -1;
    memcpy(dst, c->p + c->pos, (size_t)n);
    c->pos += n;
    return 0;
}

static int rd_u32(cur *c, uint32_t *v) { return rd(c, v, 4); }
static int rd_u64(cur *c, uint64_t *v) { return rd(c, v, 8); }

static int rd_str(cur *c, gguf_str *s)
{
    uint64_t len;
    if (rd_u64(c, &len) || len > left(c)) return -1;
    s->ptr = (const char *)c->p + c->pos;
    s->len = len;
    c->pos += len;
    return 0;
}

static void seterr(gguf_file *g, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g->err, sizeof g->err, fmt, ap);
    va_end(ap);
}

/* Size of one scalar value of type t; 0 for string/array/unknown. */
static uint64_t scalar_size(uint32_t t)
{
    switch (t) {
    case GGUF_T_UINT8: case GGUF_T_INT8: case GGUF_T_BOOL: return 1;
    case GGUF_T_UINT16: case GGUF_T_INT16: return 2;
    case GGUF_T_UINT32: case GGUF_T_INT32: case GGUF_T_FLOAT32: return 4;
    case GGUF_T_UINT64: case GGUF_T_INT64: case GGUF_T_FLOAT64: return 8;
    default: return 0;
    }
}

static int valid_vtype(uint32_t t) { return t <= GGUF_T_FLOAT64; }

/* Skip one value of type t at the cursor. Returns 0, or -1 with a reason in why. */
static int skip_value(cur *c, uint32_t t, int depth, const char **why)
{
    uint64_t sz = scalar_size(t);
    if (sz) {
        if (sz > left(c)) { *why = "truncated"; return -1; }
        c->pos += sz;
        return 0;
    }
    if (t == GGUF_T_STRING) {
        gguf_str s;
        if (rd_str(c, &s)) { *why = "truncated"; return -1; }
        return 0;
    }
    if (t != GGUF_T_ARRAY) { *why = "unknown value type"; return -1; }
    if (depth >= GGUF_MAX_DEPTH) { *why = "arrays nested too deeply"; return -1; }
    uint32_t et;
    uint64_t n;
    if (rd_u32(c, &et) || rd_u64(c, &n)) { *why = "truncated"; return -1; }
    if (!valid_vtype(et)) { *why = "unknown array element type"; return -1; }
    uint64_t esz = scalar_size(et);
    if (esz) {
        if (n > left(c) / esz) { *why = "truncated"; return -1; }
        c->pos += n * esz;
        return 0;
    }
    /* strings need >= 8 bytes each, arrays >= 12: a count beyond that cannot fit */
    uint64_t min = et == GGUF_T_STRING ? 8 : 12;
    if (n > left(c) / min) { *why = "truncated (array count exceeds file)"; return -1; }
    for (uint64_t i = 0; i < n; i++)
        if (skip_value(c, et, depth + 1, why)) return -1;
    return 0;
}

static int str_eq(gguf_str s, const char *z)
{
    size_t n = strlen(z);
    return s.len == n && memcmp(s.ptr, z, n) == 0;
}

/* Printable, bounded copy of a gguf string for error messages. */
static const char *sname(gguf_str s, char *buf, size_t cap)
{
    size_t n = s.len < cap - 1 ? (size_t)s.len : cap - 1;
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s.ptr[i];
        buf[i] = (ch >= 32 && ch < 127) ? (char)ch : '?';
    }
    buf[n] = 0;
    return buf;
}

static int num_at(uint32_t t, const uint8_t *p, double *f, int64_t *iv);

/* ---- open / close --------------------------------------------------------------- */

static void release(gguf_file *g)
{
    if (g->kv) {
        for (uint64_t i = 0; i < g->n_kv; i++) free(g->kv[i].str_off);
        free(g->kv);
    }
    free(g->tensors);
    if (g->map) munmap((void *)g->map, g->size);
    if (g->fd >= 0) close(g->fd);
    g->kv = NULL;
    g->tensors = NULL;
    g->map = NULL;
    g->fd = -1;
}

/* Magic, version, counts; allocates the kv and tensor tables. */
static int parse_header(gguf_file *g, cur *c)
{
    if (g->size < 4 || memcmp(g->map, "GGUF", 4) != 0) {
        seterr(g, "not a GGUF file (bad magic): %s", g->path);
        return -1;
    }
    c->pos = 4;
    if (rd_u32(c, &g->version)) { seterr(g, "truncated: GGUF header"); return -1; }
    if (g->version != 2 && g->version != 3) {
        seterr(g, "unsupported GGUF version %u (supported: 2, 3)%s", g->version,
               (g->version & 0xffff) == 0 ? "; big-endian file?" : "");
        return -1;
    }
    if (rd_u64(c, &g->n_tensors) || rd_u64(c, &g->n_kv)) {
        seterr(g, "truncated: GGUF header");
        return -1;
    }
    /* each kv needs >= 12 bytes (key length + type), each tensor info >= 24 */
    if (g->n_kv > left(c) / 12) {
        seterr(g, "absurd metadata count %llu for a file of %zu bytes",
               (unsigned long long)g->n_kv, g->size);
        return -1;
    }
    if (g->n_tensors > left(c) / 24) {
        seterr(g, "absurd tensor count %llu for a file of %zu bytes",
               (unsigned long long)g->n_tensors, g->size);
        return -1;
    }
    g->kv = calloc(g->n_kv ? g->n_kv : 1, sizeof *g->kv);
    g->tensors = calloc(g->n_tensors ? g->n_tensors : 1, sizeof *g->tensors);
    if (!g->kv || !g->tensors) { seterr(g, "out of memory"); return -1; }
    g->alignment = GGUF_DEFAULT_ALIGN;
    return 0;
}

/* An array value after its element type and count: skipped, string elements indexed. */
static int parse_array(gguf_file *g, cur *c, gguf_kv *kv, const char **why)
{
    kv->data = c->p + c->pos;
    uint64_t esz = scalar_size(kv->arr_type);
    if (esz) {
        if (kv->arr_len > left(c) / esz) *why = "truncated";
        else c->pos += kv->arr_len * esz;
        return 0;
    }
    uint64_t min = kv->arr_type == GGUF_T_STRING ? 8 : 12;
    if (kv->arr_len > left(c) / min) *why = "truncated (array count exceeds file)";
    if (!*why && kv->arr_type == GGUF_T_STRING && kv->arr_len) {
        /* index string elements so lookups are O(1) */
        kv->str_off = malloc(kv->arr_len * sizeof *kv->str_off);
        if (!kv->str_off) { seterr(g, "out of memory"); return -1; }
    }
    uint64_t base = c->pos;
    for (uint64_t j = 0; !*why && j < kv->arr_len; j++) {
        if (kv->str_off) kv->str_off[j] = c->pos - base;
        skip_value(c, kv->arr_type, 1, why);
    }
    return 0;
}

/* Metadata entry #i (general.alignment is applied here). */
static int parse_kv(gguf_file *g, cur *c, uint64_t i)
{
    char nb[96];
    gguf_kv *kv = &g->kv[i];
    const char *why = NULL;
    if (rd_str(c, &kv->key) || rd_u32(c, &kv->type)) {
        seterr(g, "truncated: metadata entry #%llu", (unsigned long long)i);
        return -1;
    }
    if (!valid_vtype(kv->type)) {
        seterr(g, "metadata %s has unknown value type %u", sname(kv->key, nb, sizeof nb),
               kv->type);
        return -1;
    }
    if (kv->type == GGUF_T_ARRAY) {
        if (rd_u32(c, &kv->arr_type) || rd_u64(c, &kv->arr_len)) {
            seterr(g, "truncated: metadata %s", sname(kv->key, nb, sizeof nb));
            return -1;
        }
        if (!valid_vtype(kv->arr_type)) {
            seterr(g, "metadata %s has unknown array element type %u",
                   sname(kv->key, nb, sizeof nb), kv->arr_type);
            return -1;
        }
        if (parse_array(g, c, kv, &why) != 0) return -1;
    } else {
        kv->data = c->p + c->pos;
        skip_value(c, kv->type, 0, &why);
    }
    if (why) {
        seterr(g, "%s: metadata %s", why, sname(kv->key, nb, sizeof nb));
        return -1;
    }
    if (str_eq(kv->key, "general.alignment")) {
        double af;
        int64_t a = -1;
        if (kv->type == GGUF_T_FLOAT32 || kv->type == GGUF_T_FLOAT64 ||
            num_at(kv->type, kv->data, &af, &a))
            a = -1;
        if (a <= 0 || (a & (a - 1)) != 0 || a > (1 << 20)) {
            seterr(g, "bad general.alignment (must be a power of two)");
            return -1;
        }
        g->alignment = (uint64_t)a;
    }
    return 0;
}

/* Tensor info #i: name, dims, type, offset. */
static int parse_tensor_info(gguf_file *g, cur *c, uint64_t i)
{
    char nb[96];
    gguf_tensor *t = &g->tensors[i];
    if (rd_str(c, &t->name) || rd_u32(c, &t->n_dims)) {
        seterr(g, "truncated: tensor info #%llu", (unsigned long long)i);
        return -1;
    }
    if (t->n_dims > 4) {
        seterr(g, "tensor %s has %u dimensions (max 4)", sname(t->name, nb, sizeof nb),
               t->n_dims);
        return -1;
    }
    for (int d = 0; d < 4; d++) t->ne[d] = 1;
    for (uint32_t d = 0; d < t->n_dims; d++)
        if (rd_u64(c, &t->ne[d])) {
            seterr(g, "truncated: tensor info %s", sname(t->name, nb, sizeof nb));
            return -1;
        }
    if (rd_u32(c, &t->type) || rd_u64(c, &t->offset)) {
        seterr(g, "truncated: tensor info %s", sname(t->name, nb, sizeof nb));
        return -1;
    }
    return 0;
}

/* Checks tensor t's type, shape, size and place in the data section at data_off. */
static int place_tensor(gguf_file *g, gguf_tensor *t, uint64_t data_off)
{
    char nb[96];
    const uint64_t a = g->alignment;
    sname(t->name, nb, sizeof nb);
    if (!ggml_type_known(t->type)) {
        seterr(g, "tensor %s has type %s (%u), supported: %s", nb, ggml_type_name(t->type), t->type,
               ggml_known_types());
        return -1;
    }
    uint64_t rows = 1;
    for (int d = 0; d < 4; d++) {
        if (t->ne[d] == 0 || t->ne[d] > ((uint64_t)1 << 40)) {
            seterr(g, "tensor %s has absurd dimension ne[%d] = %llu", nb, d,
                   (unsigned long long)t->ne[d]);
            return -1;
        }
        if (d > 0) {
            if (rows > UINT64_MAX / t->ne[d]) {
                seterr(g, "tensor %s: element count overflows", nb);
                return -1;
            }
            rows *= t->ne[d];
        }
    }
    size_t rb = ggml_row_bytes(t->type, t->ne[0]);
    if (rb == 0) {
        seterr(g, "tensor %s: row length %llu is not a multiple of the %s block size", nb,
               (unsigned long long)t->ne[0], ggml_type_name(t->type));
        return -1;
    }
    if (rows > UINT64_MAX / rb) {
        seterr(g, "tensor %s: size overflows", nb);
        return -1;
    }
    t->nbytes = rows * rb;
    if (t->offset % a) {
        seterr(g, "tensor %s: data offset %llu is not a multiple of alignment %llu", nb,
               (unsigned long long)t->offset, (unsigned long long)a);
        return -1;
    }
    if (t->offset > UINT64_MAX - data_off - t->nbytes ||
        data_off + t->offset + t->nbytes > g->size) {
        unsigned long long end = t->offset > UINT64_MAX - data_off - t->nbytes
                                     ? UINT64_MAX
                                     : (unsigned long long)(data_off + t->offset + t->nbytes);
        seterr(g, "truncated: tensor %s ends at byte %llu past file size %zu", nb, end,
               g->size);
        return -1;
    }
    t->file_offset = data_off + t->offset;
    t->data = g->map + t->file_offset;
    return 0;
}

static int parse(gguf_file *g)
{
    cur c = {g->map, 0, g->size};
    if (parse_header(g, &c) != 0) return -1;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (parse_kv(g, &c, i) != 0) return -1;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (parse_tensor_info(g, &c, i) != 0) return -1;
    const uint64_t a = g->alignment;
    g->data_offset = c.pos + (a - c.pos % a) % a;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (place_tensor(g, &g->tensors[i], g->data_offset) != 0) return -1;
    return 0;
}

int gguf_read_at(int fd, const uint8_t *map, size_t map_size, uint64_t off, void *dst, size_t n)
{
    uint8_t *d = dst;
    if (fd < 0) {
        if (!map || off + n > map_size) return -1;
        memcpy(d, map + off, n);
        return 0;
    }
    while (n > 0) {
        ssize_t got = pread(fd, d, n, (off_t)off);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) return -1;
        d += got;
        n -= (size_t)got;
        off += (uint64_t)got;
    }
    return 0;
}

#define HEAD_AHEAD ((size_t)16 << 20)
#define HEAD_PIECE ((uint64_t)128 << 10)

void gguf_drop_cache(int fd, uint64_t off, size_t n)
{
    if (fd < 0 || n == 0) return;
    const uint64_t a0 = off & ~(uint64_t)4095, a1 = (off + n + 4095) & ~(uint64_t)4095;
    (void)posix_fadvise(fd, (off_t)a0, (off_t)(a1 - a0), POSIX_FADV_DONTNEED);
}

void gguf_will_need(int fd, uint64_t off, size_t n)
{
    if (fd < 0 || n == 0) return;
    const uint64_t a0 = off & ~(uint64_t)4095, a1 = (off + n + 4095) & ~(uint64_t)4095;
    /* in 128 KB pieces: the kernel reads at most its readahead size (read_ahead_kb, 128 KB by
     * default) of one request and leaves the rest */
    for (uint64_t a = a0; a < a1; a += HEAD_PIECE)
        (void)posix_fadvise(fd, (off_t)a, (off_t)(a1 - a < HEAD_PIECE ? a1 - a : HEAD_PIECE), POSIX_FADV_WILLNEED);
}

/* Every page of [0, n) landed: a pread waits for a page still being read (one byte a page, the
 * pages are in the cache by now), so none of the header's reads lands after the load's drops. */
static void settle(const gguf_file *g, size_t n)
{
    char c;
    for (size_t off = 0; off < n; off += 4096)
        if (pread(g->fd, &c, 1, (off_t)off) < 0) break;
}

int gguf_open(gguf_file *g, const char *path)
{
    memset(g, 0, sizeof *g);
    g->fd = -1;
    snprintf(g->path, sizeof g->path, "%s", path ? path : "");
    if (!path) { seterr(g, "no path given"); return -1; }

    g->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (g->fd < 0) {
        seterr(g, "cannot open %s: %s", path, strerror(errno));
        return -1;
    }
    struct stat st;
    if (fstat(g->fd, &st) != 0) {
        seterr(g, "cannot stat %s: %s", path, strerror(errno));
        release(g);
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        seterr(g, "not a regular file: %s", path);
        release(g);
        return -1;
    }
    if (st.st_size < 4) {
        seterr(g, "not a GGUF file (%lld bytes): %s", (long long)st.st_size, path);
        release(g);
        return -1;
    }
    g->size = (size_t)st.st_size;
    void *m = mmap(NULL, g->size, PROT_READ, MAP_PRIVATE, g->fd, 0);
    if (m == MAP_FAILED) {
        seterr(g, "cannot mmap %s: %s", path, strerror(errno));
        g->size = 0;
        release(g);
        return -1;
    }
    g->map = m;
    /* No readahead on this file, through the mapping or pread: every read is of exactly the
     * bytes asked for and done when the call returns (a fault or pread waits for its pages).
     * The kernel's readahead (up to read_ahead_kb, 8 MB on some disks) around a dense tensor
     * ran on after the load's last page-cache drop and left up to 3.4 MB of the file's experts
     * in the page cache, charged to the engine's cgroup outside its budget. Big reads that
     * want throughput ask for their range with WILLNEED (model_load.c pack_slabs); so does the
     * header, its first 16 MB (the parse walks the tokenizer's arrays), waited for after it. */
    (void)madvise(m, g->size, MADV_RANDOM);
    (void)posix_fadvise(g->fd, 0, 0, POSIX_FADV_RANDOM);
    const size_t head = g->size < HEAD_AHEAD ? g->size : HEAD_AHEAD;
    gguf_will_need(g->fd, 0, head);
    const int rc = parse(g);
    settle(g, head);
    if (rc != 0) {
        release(g);
        g->n_kv = g->n_tensors = 0;
        g->size = 0;
        return -1;
    }
    return 0;
}

void gguf_close(gguf_file *g)
{
    if (!g) return;
    release(g);
    g->n_kv = g->n_tensors = 0;
    g->size = 0;
}

/* ---- lookups --------------------------------------------------------------------- */

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key)
{
    if (!g || !g->kv || !key) return NULL;
    for (uint64_t i = 0; i < g->n_kv; i++)
        if (g->kv[i].key.ptr && str_eq(g->kv[i].key, key)) {
            g->kv[i].seen = 1;
            return &g->kv[i];
        }
    return NULL;
}

const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name)
{
    if (!g || !g->tensors || !name) return NULL;
    for (uint64_t i = 0; i < g->n_tensors; i++)
        if (str_eq(g->tensors[i].name, name)) {
            g->tensors[i].seen = 1;
            return &g->tensors[i];
        }
    return NULL;
}

/* Read a numeric scalar of type t at p; returns 0 if ok. */
static int num_at(uint32_t t, const uint8_t *p, double *f, int64_t *iv)
{
    union { uint8_t u8; int8_t i8; uint16_t u16; int16_t i16; uint32_t u32; int32_t i32;
            float f32; uint64_t u64; int64_t i64; double f64; } v;
    uint64_t sz = scalar_size(t);
    if (!sz || !p) return -1;
    memcpy(&v, p, (size_t)sz);
    switch (t) {
    case GGUF_T_UINT8:  *iv = v.u8;  *f = v.u8;  break;
    case GGUF_T_BOOL:   *iv = v.u8 != 0; *f = v.u8 != 0; break;
    case GGUF_T_INT8:   *iv = v.i8;  *f = v.i8;  break;
    case GGUF_T_UINT16: *iv = v.u16; *f = v.u16; break;
    case GGUF_T_INT16:  *iv = v.i16; *f = v.i16; break;
    case GGUF_T_UINT32: *iv = v.u32; *f = v.u32; break;
    case GGUF_T_INT32:  *iv = v.i32; *f = v.i32; break;
    case GGUF_T_UINT64: *iv = v.u64 > INT64_MAX ? INT64_MAX : (int64_t)v.u64; *f = (double)v.u64; break;
    case GGUF_T_INT64:  *iv = v.i64; *f = (double)v.i64; break;
    case GGUF_T_FLOAT32: case GGUF_T_FLOAT64: {
        double d = t == GGUF_T_FLOAT32 ? v.f32 : v.f64;
        *f = d;
        if (d != d) *iv = 0;
        else if (d >= 9.2e18) *iv = INT64_MAX;
        else if (d <= -9.2e18) *iv = INT64_MIN;
        else *iv = (int64_t)d;
        break;
    }
    default: return -1;
    }
    return 0;
}

int64_t gguf_get_int(const gguf_file *g, const char *key, int64_t def)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    double f;
    int64_t iv;
    if (!kv || num_at(kv->type, kv->data, &f, &iv)) return def;
    return iv;
}

double gguf_get_float(const gguf_file *g, const char *key, double def)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    double f;
    int64_t iv;
    if (!kv || num_at(kv->type, kv->data, &f, &iv)) return def;
    return f;
}

char *gguf_get_string(const gguf_file *g, const char *key)
{
    const gguf_kv *kv = gguf_find_kv(g, key);
    if (!kv || kv->type != GGUF_T_STRING) return NULL;
    uint64_t len;
    memcpy(&len, kv->data, 8);
    if (len >= SIZE_MAX) return NULL;
    char *s = malloc((size_t)len + 1);
    if (!s) return NULL;
    memcpy(s, kv->data + 8, (size_t)len);
    s[len] = 0;
    return s;
}

int gguf_array_string(const gguf_kv *kv, uint64_t i, gguf_str *out)
{
    if (!kv || kv->type != GGUF_T_ARRAY || kv->arr_type != GGUF_T_STRING || i >= kv->arr_len ||
        !kv->str_off)
        return -1;
    const uint8_t *p = kv->data + kv->str_off[i];
    memcpy(&out->len, p, 8);
    out->ptr = (const char *)p + 8;
    return 0;
}

static int arr_num(const gguf_kv *kv, uint64_t i, double *f, int64_t *iv)
{
    if (!kv || kv->type != GGUF_T_ARRAY || i >= kv->arr_len) return -1;
    uint64_t sz = scalar_size(kv->arr_type);
    if (!sz) return -1;
    return num_at(kv->arr_type, kv->data + i * sz, f, iv);
}

double gguf_array_float(const gguf_kv *kv, uint64_t i)
{
    double f;
    int64_t iv;
    return arr_num(kv, i, &f, &iv) ? 0.0 : f;
}

int64_t gguf_array_int(const gguf_kv *kv, uint64_t i)
{
    double f;
    int64_t iv;
    return arr_num(kv, i, &f, &iv) ? 0 : iv;
}
