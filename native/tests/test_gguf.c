/* test_gguf.c — writes small GGUF files itself, parses them back, and checks that
 * corrupt files (bad magic, truncation at every length, bad types, absurd counts)
 * are refused with a one-line reason and no crash. */
#include "gguf.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

/* ---- a tiny GGUF writer ----------------------------------------------------------- */

typedef struct { uint8_t *p; size_t n, cap; } buf;

static void put(buf *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = realloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}
static void u32(buf *b, uint32_t v) { put(b, &v, 4); }
static void u64(buf *b, uint64_t v) { put(b, &v, 8); }
static void str(buf *b, const char *s) { u64(b, strlen(s)); put(b, s, strlen(s)); }
static void key(buf *b, const char *k, uint32_t t) { str(b, k); u32(b, t); }
static void pad(buf *b, size_t a) { while (b->n % a) { uint8_t z = 0; put(b, &z, 1); } }

typedef struct { const char *name; uint32_t nd; uint64_t ne[4]; uint32_t type; } tdesc;

static uint64_t tbytes(const tdesc *t)
{
    uint64_t rows = 1;
    for (uint32_t d = 1; d < t->nd; d++) rows *= t->ne[d];
    return ggml_row_bytes(t->type, t->ne[0]) * rows;
}

/* Writes a file with every metadata value type, alignment `align` (0: key absent, 32),
 * and the given tensors. Tensor data byte k of tensor i is (i*31 + k) & 255.
 * Returns the buffer; *data_off gets the data section offset. */
static buf build(uint32_t version, uint64_t align, const tdesc *ts, int nt, uint64_t *data_off,
                 uint64_t *offs)
{
    buf b = {0};
    put(&b, "GGUF", 4);
    u32(&b, version);
    u64(&b, (uint64_t)nt);
    u64(&b, align ? 14 : 13);
    key(&b, "general.architecture", GGUF_T_STRING); str(&b, "llama");
    key(&b, "t.u8", GGUF_T_UINT8); { uint8_t v = 200; put(&b, &v, 1); }
    key(&b, "t.i8", GGUF_T_INT8); { int8_t v = -5; put(&b, &v, 1); }
    key(&b, "t.u16", GGUF_T_UINT16); { uint16_t v = 65000; put(&b, &v, 2); }
    key(&b, "t.i16", GGUF_T_INT16); { int16_t v = -300; put(&b, &v, 2); }
    key(&b, "llama.block_count", GGUF_T_UINT32); u32(&b, 30);
    key(&b, "t.i32", GGUF_T_INT32); u32(&b, (uint32_t)-7);
    key(&b, "llama.rope.freq_base", GGUF_T_FLOAT32); { float v = 100000.0f; put(&b, &v, 4); }
    key(&b, "t.bool", GGUF_T_BOOL); { uint8_t v = 1; put(&b, &v, 1); }
    key(&b, "t.u64", GGUF_T_UINT64); u64(&b, 1ull << 40);
    key(&b, "t.f64", GGUF_T_FLOAT64); { double v = -2.5; put(&b, &v, 8); }
    /* array of strings */
    key(&b, "tokenizer.ggml.tokens", GGUF_T_ARRAY); u32(&b, GGUF_T_STRING); u64(&b, 4);
    str(&b, "<s>"); str(&b, ""); str(&b, "hello"); str(&b, "wörld");
    /* nested: array of arrays (of int32 and of strings), must be skipped correctly */
    key(&b, "t.nested", GGUF_T_ARRAY); u32(&b, GGUF_T_ARRAY); u64(&b, 2);
    u32(&b, GGUF_T_INT32); u64(&b, 3); u32(&b, 1); u32(&b, 2); u32(&b, 3);
    u32(&b, GGUF_T_STRING); u64(&b, 2); str(&b, "a"); str(&b, "bc");
    if (align) { key(&b, "general.alignment", GGUF_T_UINT32); u32(&b, (uint32_t)align); }
    uint64_t a = align ? align : 32, off = 0;
    for (int i = 0; i < nt; i++) {
        str(&b, ts[i].name);
        u32(&b, ts[i].nd);
        for (uint32_t d = 0; d < ts[i].nd; d++) u64(&b, ts[i].ne[d]);
        u32(&b, ts[i].type);
        offs[i] = off;
        u64(&b, off);
        uint64_t nb = ts[i].type <= GGML_Q8_0 && ggml_row_bytes(ts[i].type, ts[i].ne[0])
                          ? tbytes(&ts[i]) : 64;
        off += (nb + a - 1) / a * a;
    }
    pad(&b, a);
    *data_off = b.n;
    for (int i = 0; i < nt; i++) {
        while (b.n < *data_off + offs[i]) { uint8_t z = 0; put(&b, &z, 1); }
        uint64_t nb = ggml_row_bytes(ts[i].type, ts[i].ne[0]) ? tbytes(&ts[i]) : 64;
        for (uint64_t k = 0; k < nb; k++) { uint8_t v = (uint8_t)(i * 31 + k); put(&b, &v, 1); }
    }
    return b;
}

static char path[256];

static void save(const void *p, size_t n)
{
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    if (n && fwrite(p, 1, n, f) != n) { perror(path); exit(2); }
    fclose(f);
}

/* Open must fail, with err containing `want` (NULL: any non-empty reason). */
static void expect_refused(const void *p, size_t n, const char *want, const char *what)
{
    gguf_file g;
    save(p, n);
    int rc = gguf_open(&g, path);
    CHECK(rc == -1, "%s: accepted", what);
    CHECK(g.err[0] && !strchr(g.err, '\n'), "%s: no one-line reason", what);
    if (want) CHECK(strstr(g.err, want) != NULL, "%s: err \"%s\" lacks \"%s\"", what, g.err, want);
    gguf_close(&g);
}

static const tdesc TS[] = {
    {"token_embd.weight", 2, {64, 3, 1, 1}, GGML_Q8_0},
    {"blk.0.attn_norm.weight", 1, {5, 1, 1, 1}, GGML_F32},
    {"blk.3.ffn_up.weight", 3, {32, 3, 2, 1}, GGML_Q4_1},
    {"t.f16", 4, {7, 2, 1, 2}, GGML_F16},
    {"t.q4_0", 2, {96, 2, 1, 1}, GGML_Q4_0},
};
#define NT ((int)(sizeof TS / sizeof TS[0]))

static void test_good(uint32_t version, uint64_t align)
{
    uint64_t doff, offs[NT];
    buf b = build(version, align, TS, NT, &doff, offs);
    save(b.p, b.n);
    gguf_file g;
    int rc = gguf_open(&g, path);
    CHECK(rc == 0, "v%u align %llu: open failed: %s", version, (unsigned long long)align, g.err);
    if (rc) { free(b.p); return; }
    CHECK(g.version == version, "version");
    CHECK(g.n_kv == (align ? 14u : 13u) && g.n_tensors == (uint64_t)NT, "counts");
    CHECK(g.alignment == (align ? align : 32), "alignment %llu", (unsigned long long)g.alignment);
    CHECK(g.data_offset == doff, "data_offset %llu want %llu", (unsigned long long)g.data_offset,
          (unsigned long long)doff);
    CHECK(g.fd >= 0, "fd kept open");
    char *s = gguf_get_string(&g, "general.architecture");
    CHECK(s && strcmp(s, "llama") == 0, "architecture %s", s ? s : "(null)");
    free(s);
    CHECK(gguf_get_string(&g, "llama.block_count") == NULL, "string of int");
    CHECK(gguf_get_int(&g, "llama.block_count", -1) == 30, "block_count");
    CHECK(gguf_get_int(&g, "t.u8", 0) == 200 && gguf_get_int(&g, "t.i8", 0) == -5, "8-bit");
    CHECK(gguf_get_int(&g, "t.u16", 0) == 65000 && gguf_get_int(&g, "t.i16", 0) == -300, "16");
    CHECK(gguf_get_int(&g, "t.i32", 0) == -7 && gguf_get_int(&g, "t.bool", 0) == 1, "i32/bool");
    CHECK(gguf_get_int(&g, "t.u64", 0) == (1ll << 40), "u64");
    CHECK(gguf_get_float(&g, "t.f64", 0) == -2.5, "f64");
    CHECK(gguf_get_float(&g, "llama.rope.freq_base", 0) == 100000.0, "f32");
    CHECK(gguf_get_float(&g, "llama.block_count", 0) == 30.0, "float of int");
    CHECK(gguf_get_int(&g, "missing", 42) == 42, "default");
    CHECK(gguf_get_int(&g, "general.architecture", 43) == 43, "int of string -> default");
    CHECK(gguf_get_int(&g, "tokenizer.ggml.tokens", 44) == 44, "int of array -> default");
    const gguf_kv *kv = gguf_find_kv(&g, "tokenizer.ggml.tokens");
    CHECK(kv && kv->type == GGUF_T_ARRAY && kv->arr_type == GGUF_T_STRING && kv->arr_len == 4,
          "tokens kv");
    const char *want[] = {"<s>", "", "hello", "wörld"};
    for (int i = 0; kv && i < 4; i++) {
        gguf_str t;
        CHECK(gguf_array_string(kv, (uint64_t)i, &t) == 0 && t.len == strlen(want[i]) &&
                  memcmp(t.ptr, want[i], t.len) == 0, "token %d", i);
    }
    gguf_str t;
    CHECK(kv && gguf_array_string(kv, 4, &t) != 0, "token out of range");
    const gguf_kv *nk = gguf_find_kv(&g, "t.nested");
    CHECK(nk && nk->arr_type == GGUF_T_ARRAY && nk->arr_len == 2, "nested kv");
    CHECK(gguf_array_string(nk, 0, &t) != 0 && gguf_array_int(nk, 0) == 0, "nested getters");
    for (int i = 0; i < NT; i++) {
        const gguf_tensor *x = gguf_find_tensor(&g, TS[i].name);
        CHECK(x != NULL, "tensor %s missing", TS[i].name);
        if (!x) continue;
        CHECK(x->type == TS[i].type && x->n_dims == TS[i].nd, "%s type/dims", TS[i].name);
        for (int d = 0; d < 4; d++)
            CHECK(x->ne[d] == (d < (int)TS[i].nd ? TS[i].ne[d] : 1), "%s ne[%d]", TS[i].name, d);
        CHECK(x->nbytes == tbytes(&TS[i]), "%s nbytes %llu", TS[i].name,
              (unsigned long long)x->nbytes);
        CHECK(x->offset == offs[i] && x->file_offset == doff + offs[i], "%s offsets", TS[i].name);
        CHECK(x->data == g.map + x->file_offset, "%s data ptr", TS[i].name);
        int ok = 1;
        for (uint64_t k = 0; k < x->nbytes; k++) ok &= x->data[k] == (uint8_t)(i * 31 + k);
        CHECK(ok, "%s data bytes", TS[i].name);
        uint8_t b0;
        CHECK(pread(g.fd, &b0, 1, (off_t)x->file_offset) == 1 && b0 == x->data[0], "pread");
    }
    CHECK(gguf_find_tensor(&g, "token_embd") == NULL, "prefix must not match");
    gguf_close(&g);
    gguf_close(&g);                                      /* double close is harmless */

    /* every truncation is refused without a crash */
    for (size_t n = 0; n < b.n; n++) {
        gguf_file h;
        save(b.p, n);
        rc = gguf_open(&h, path);
        CHECK(rc == -1 && h.err[0], "truncated to %zu bytes: accepted", n);
        if (n >= 4 && n < doff)
            CHECK(strstr(h.err, "truncated") || strstr(h.err, "absurd"),
                  "cut at %zu: \"%s\"", n, h.err);
        gguf_close(&h);
    }
    free(b.p);
}

static void test_bad(void)
{
    uint64_t doff, offs[NT];
    buf b = build(3, 0, TS, NT, &doff, offs);
    char msg[256];

    /* truncated data of the last tensor: exact message */
    uint64_t end = doff + offs[NT - 1] + tbytes(&TS[NT - 1]);
    snprintf(msg, sizeof msg, "truncated: tensor t.q4_0 ends at byte %llu past file size %zu",
             (unsigned long long)end, b.n - 1);
    expect_refused(b.p, b.n - 1, msg, "short data");

    uint8_t *c = malloc(b.n);
    memcpy(c, b.p, b.n);
    c[0] = 'X';
    expect_refused(c, b.n, "not a GGUF file", "bad magic");
    expect_refused("GG", 2, "not a GGUF file", "tiny file");
    expect_refused("", 0, "not a GGUF file", "empty file");

    memcpy(c, b.p, b.n);
    c[4] = 1;
    expect_refused(c, b.n, "unsupported GGUF version 1", "version 1");
    memcpy(c, b.p, b.n);
    c[4] = 0; c[7] = 3;
    expect_refused(c, b.n, "unsupported GGUF version", "big-endian version");

    memcpy(c, b.p, b.n);
    uint64_t huge = 1ull << 60;
    memcpy(c + 16, &huge, 8);
    expect_refused(c, b.n, "absurd metadata count", "n_kv huge");
    memcpy(c, b.p, b.n);
    memcpy(c + 8, &huge, 8);
    expect_refused(c, b.n, "absurd tensor count", "n_tensors huge");
    free(c);

    /* unsupported tensor type */
    tdesc t5[] = {{"blk.0.ffn_down.weight", 2, {256, 2, 1, 1}, 35}};
    uint64_t o1[1];
    buf bb = build(3, 0, t5, 1, &doff, o1);
    expect_refused(bb.p, bb.n,
                   "tensor blk.0.ffn_down.weight has type TQ2_0 (35), supported: F32 F16 BF16 Q4_0 Q4_1 "
                   "Q5_0 Q5_1 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S "
                   "IQ4_NL IQ4_XS MXFP4", "TQ2_0 tensor");
    free(bb.p);

    /* row length not a block multiple */
    tdesc tr[] = {{"w", 2, {48, 2, 1, 1}, GGML_Q8_0}};
    bb = build(3, 0, tr, 1, &doff, o1);
    expect_refused(bb.p, bb.n, "not a multiple", "ragged Q8_0 row");
    free(bb.p);

    /* n_dims 5: patch the n_dims field of a 1-tensor file */
    tdesc t1[] = {{"w", 1, {8, 1, 1, 1}, GGML_F32}};
    bb = build(3, 0, t1, 1, &doff, o1);
    for (size_t i = 0; i + 9 < bb.n; i++)
        if (memcmp(bb.p + i, "\x01\0\0\0\0\0\0\0w", 9) == 0) {   /* len 1 + "w" */
            uint32_t five = 5;
            memcpy(bb.p + i + 9, &five, 4);
            break;
        }
    expect_refused(bb.p, bb.n, "5 dimensions (max 4)", "n_dims 5");
    free(bb.p);

    /* unknown value type: patch the type of the first kv (after 24-byte header + key) */
    c = malloc(b.n);
    memcpy(c, b.p, b.n);
    uint32_t bad = 77;
    memcpy(c + 24 + 8 + strlen("general.architecture"), &bad, 4);
    expect_refused(c, b.n, "unknown value type 77", "bad value type");
    free(c);

    /* misaligned tensor offset: patch the offset of tensor 1 */
    tdesc t2[] = {{"a", 1, {8, 1, 1, 1}, GGML_F32}, {"b", 1, {8, 1, 1, 1}, GGML_F32}};
    uint64_t o2[2];
    bb = build(3, 0, t2, 2, &doff, o2);
    for (size_t i = doff; i >= 8; i--) {                /* last u64 before data = offset of b */
        uint64_t v;
        memcpy(&v, bb.p + i - 8, 8);
        if (v == o2[1]) { v += 4; memcpy(bb.p + i - 8, &v, 8); break; }
    }
    expect_refused(bb.p, bb.n, "not a multiple of alignment", "misaligned offset");
    free(bb.p);

    /* bad alignment value */
    bb = build(3, 48, t1, 1, &doff, o1);
    expect_refused(bb.p, bb.n, "general.alignment", "alignment 48");
    free(bb.p);

    /* missing file */
    gguf_file g;
    CHECK(gguf_open(&g, "/nonexistent/dir/x.gguf") == -1 && strstr(g.err, "cannot open"),
          "missing file: %s", g.err);
    gguf_close(&g);
    free(b.p);
}

int main(void)
{
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(path, sizeof path, "%s/test_gguf_%d.gguf", dir, (int)getpid());
    test_good(3, 0);
    test_good(3, 64);
    test_good(2, 0);
    test_bad();
    unlink(path);
    ggml_row_bytes(GGML_Q4_1, 31) == 0 ? (void)0 : (void)(fails++, printf("FAIL row_bytes\n"));
    if (fails) {
        printf("test_gguf: %d FAILED\n", fails);
        return 1;
    }
    printf("test_gguf: all passed\n");
    return 0;
}
