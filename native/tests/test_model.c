/* test_model.c — KV slots, the expert store and the model loader / forward.
 *
 * The expert-store tests use a small GGUF written here (no Python needed). The model
 * tests use native/tools/make_tiny_moe.py (python with numpy + gguf: $COLI_PYTHON, else
 * ../.venv/bin/python, else python3); they are skipped with a note when it cannot run. */
#include "experts.h"
#include "gguf.h"
#include "kv.h"
#include "model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int fails, checks;
#define CHECK(cond, ...)                                        \
    do {                                                        \
        checks++;                                               \
        if (!(cond)) {                                          \
            fails++;                                            \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);         \
            printf(__VA_ARGS__);                                \
            printf("\n");                                       \
        }                                                       \
    } while (0)

static char tmpdir[256];

static void tpath(char *buf, size_t cap, const char *name) { snprintf(buf, cap, "%s/%s", tmpdir, name); }

static char *slurp(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc((size_t)n + 1);
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) {
        free(b);
        b = NULL;
    }
    if (b) b[n] = 0;
    fclose(f);
    *len = (size_t)n;
    return b;
}

/* ------------------------------------------------------------------ KV */

/* The slots' byte budget: growth past it is refused (KV_OVER_BUDGET, nothing changed), a slot's
 * room is what the others leave, and a released slot gives its bytes back. */
static void test_kv_budget(void) {
    kv_cache c;
    CHECK(kv_init(&c, 2, 1000, 3, 8) == 0, "kv_init");
    const size_t pos = kv_pos_bytes(&c);
    CHECK(pos == 3 * 16 * 4 + sizeof(int), "bytes a position: %zu", pos);
    kv_set_budget(&c, 300 * pos);
    CHECK(kv_room(&c, 0) == 300, "room of an empty cache: %d", kv_room(&c, 0));
    CHECK(kv_reserve(&c, 0, 200) == 0 && c.slots[0].cap == 256 && c.used == 256 * pos, "doubling inside the budget");
    CHECK(kv_room(&c, 1) == 44, "slot 1's room beside 256 positions: %d", kv_room(&c, 1));
    CHECK(kv_reserve(&c, 1, 45) == KV_OVER_BUDGET && c.slots[1].cap == 0, "past the budget: refused, unchanged");
    CHECK(kv_reserve(&c, 1, 40) == 0 && c.slots[1].cap == 44, "doubling clamped to the room: cap %d", c.slots[1].cap);
    CHECK(kv_reserve(&c, 0, 260) == KV_OVER_BUDGET && c.slots[0].cap == 256, "slot 0 held to what slot 1 leaves");
    kv_release(&c, 1);
    CHECK(c.slots[1].cap == 0 && c.slots[1].n_pos == 0 && c.used == (size_t)c.slots[0].cap * pos, "released");
    CHECK(kv_reserve(&c, 1, 40) == 0, "the released bytes serve again");
    kv_free(&c);
}

static void test_kv(void) {
    kv_cache c;
    CHECK(kv_init(&c, 2, 100, 3, 8) == 0, "kv_init");
    CHECK(kv_reserve(&c, 0, 101) != 0, "reserve beyond ctx must fail");
    CHECK(kv_reserve(&c, 0, 20) == 0 && c.slots[0].cap >= 20 && c.slots[0].cap <= 100, "reserve 20");
    CHECK(kv_reserve(&c, 0, 100) == 0 && c.slots[0].cap == 100, "reserve to ctx: cap %d", c.slots[0].cap);
    CHECK(c.slots[1].cap == 0, "slot 1 untouched");
    for (int p = 0; p < 10; p++) {
        c.slots[0].tokens[p] = 100 + p;
        for (int l = 0; l < 3; l++)
            for (int j = 0; j < 8; j++) {
                ((float *)kv_k(&c, 0, l, p))[j] = (float)(l * 1000 + p * 10 + j);
                ((float *)kv_v(&c, 0, l, p))[j] = -(float)(l * 1000 + p * 10 + j);
            }
    }
    c.slots[0].n_pos = 10;
    int ids[12] = {100, 101, 102, 103, 999, 105};
    CHECK(kv_common_prefix(&c, 0, ids, 6) == 4, "prefix 4");
    CHECK(kv_common_prefix(&c, 0, ids, 2) == 2, "prefix limited by n");
    CHECK(kv_common_prefix(&c, 1, ids, 6) == 0, "empty slot prefix");
    for (int i = 0; i < 12; i++) ids[i] = 100 + i;
    CHECK(kv_common_prefix(&c, 0, ids, 12) == 10, "prefix limited by n_pos");

    char path[512];
    tpath(path, sizeof path, "slot0.kv");
    CHECK(kv_save(&c, 0, path, 0x1234) == 0, "kv_save");
    char tmp[520];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    CHECK(access(tmp, F_OK) != 0, "tmp file renamed away");
    kv_truncate(&c, 0, 3);
    CHECK(c.slots[0].n_pos == 3, "truncate");
    kv_truncate(&c, 0, 7);
    CHECK(c.slots[0].n_pos == 3, "truncate never grows");

    CHECK(kv_load(&c, 1, path, 0x1234) == 0, "kv_load into slot 1");
    int same = c.slots[1].n_pos == 10;
    for (int p = 0; p < 10 && same; p++) {
        same &= c.slots[1].tokens[p] == 100 + p;
        for (int l = 0; l < 3; l++)
            same &= memcmp(kv_k(&c, 1, l, p), kv_k(&c, 0, l, p), 8 * sizeof(float)) == 0 &&
                    memcmp(kv_v(&c, 1, l, p), kv_v(&c, 0, l, p), 8 * sizeof(float)) == 0;
    }
    CHECK(same, "round trip content");
    CHECK(kv_load(&c, 1, path, 0x1235) != 0 && c.slots[1].n_pos == 0, "fingerprint mismatch refused, slot empty");
    CHECK(kv_load(&c, 1, "/nonexistent/x", 0x1234) != 0, "absent file");
    kv_free(&c);

    kv_cache d;
    kv_init(&d, 1, 100, 3, 4);
    CHECK(kv_load(&d, 0, path, 0x1234) != 0 && d.slots[0].n_pos == 0, "kv_dim mismatch refused");
    kv_free(&d);
    kv_init(&d, 1, 5, 3, 8);
    CHECK(kv_load(&d, 0, path, 0x1234) != 0, "n_pos beyond ctx refused");
    kv_free(&d);
    /* truncated file */
    size_t len;
    char *b = slurp(path, &len);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len - 4, f);
    fclose(f);
    free(b);
    kv_init(&d, 1, 100, 3, 8);
    CHECK(kv_load(&d, 0, path, 0x1234) != 0 && d.slots[0].n_pos == 0, "truncated file refused");
    kv_free(&d);
}

/* fp16 rows: stored rounded to nearest even, read back exactly; slot files keep the type. */
static void test_kv_f16(void) {
    kv_cache c;
    CHECK(kv_init(&c, 2, 64, 2, 24) == 0 && kv_set_f16(&c, 1) == 0 && kv_elt(&c) == 2, "f16 cache");
    float k[24], v[24];
    for (int j = 0; j < 24; j++) {
        k[j] = 1.0f + (float)j / 3000.0f;               /* between fp16 neighbours */
        v[j] = -65504.0f / (float)(j + 1);
    }
    CHECK(kv_reserve(&c, 0, 3) == 0, "reserve");
    for (int p = 0; p < 3; p++) {
        kv_store(&c, 0, 1, p, k, v);
        c.slots[0].tokens[p] = 7 + p;
    }
    c.slots[0].n_pos = 3;
    int exact = 1;
    for (int j = 0; j < 24; j++) {
        const uint16_t *hk = kv_k(&c, 0, 1, 2), *hv = kv_v(&c, 0, 1, 2);
        exact &= hk[j] == f32_to_fp16(k[j]) && hv[j] == f32_to_fp16(v[j]);
    }
    CHECK(exact, "fp16 rows hold the rounded values (vector and scalar conversions agree)");
    CHECK(kv_set_f16(&c, 0) != 0, "type change refused once rows are stored");
    char path[512];
    tpath(path, sizeof path, "slot-f16.kv");
    CHECK(kv_save(&c, 0, path, 77) == 0 && kv_load(&c, 1, path, 77) == 0 && c.slots[1].n_pos == 3 &&
              memcmp(kv_k(&c, 1, 1, 2), kv_k(&c, 0, 1, 2), 48) == 0, "fp16 slot file round trip");
    kv_cache d;
    kv_init(&d, 1, 64, 2, 24);
    CHECK(kv_load(&d, 0, path, 77) != 0 && d.slots[0].n_pos == 0, "fp16 file refused by a float32 cache");
    kv_free(&d);
    kv_free(&c);
}

/* K and V rows of different widths (key_length != value_length): each row its own width, in
 * both element types; slot files round-trip, and a cache of other widths refuses them. */
static void test_kv_widths(void) {
    for (int f16 = 0; f16 <= 1; f16++) {
        kv_cache c;
        CHECK(kv_init_kv(&c, 2, 32, 2, 24, 8) == 0 && kv_set_f16(&c, f16) == 0 && c.k_dim == 24 && c.v_dim == 8,
              "kv_init_kv");
        float k[24], v[8];
        CHECK(kv_reserve(&c, 0, 5) == 0, "reserve");
        for (int p = 0; p < 5; p++) {
            for (int j = 0; j < 24; j++) k[j] = (float)(p * 100 + j);
            for (int j = 0; j < 8; j++) v[j] = -(float)(p * 100 + j);
            for (int l = 0; l < 2; l++) kv_store(&c, 0, l, p, k, v);
            c.slots[0].tokens[p] = p;
        }
        c.slots[0].n_pos = 5;
        int ok = 1;
        for (int p = 0; p < 5; p++)
            for (int j = 0; j < 24; j++) {
                const void *kr = kv_k(&c, 0, 1, p), *vr = kv_v(&c, 0, 1, p);
                float kk = f16 ? fp16_to_f32(((const uint16_t *)kr)[j]) : ((const float *)kr)[j];
                ok &= kk == (float)(p * 100 + j);
                if (j < 8) ok &= (f16 ? fp16_to_f32(((const uint16_t *)vr)[j]) : ((const float *)vr)[j]) == -(float)(p * 100 + j);
            }
        CHECK(ok, "rows of 24 K and 8 V values read back (f16 %d)", f16);
        char path[512];
        tpath(path, sizeof path, "slot-widths.kv");
        CHECK(kv_save(&c, 0, path, 5) == 0 && kv_load(&c, 1, path, 5) == 0 && c.slots[1].n_pos == 5 &&
                  memcmp(kv_v(&c, 1, 1, 4), kv_v(&c, 0, 1, 4), 8 * kv_elt(&c)) == 0 &&
                  memcmp(kv_k(&c, 1, 1, 4), kv_k(&c, 0, 1, 4), 24 * kv_elt(&c)) == 0,
              "slot file round trip with K 24 / V 8 (f16 %d)", f16);
        kv_cache d;
        kv_init_kv(&d, 1, 32, 2, 24, 16);
        kv_set_f16(&d, f16);
        CHECK(kv_load(&d, 0, path, 5) != 0 && d.slots[0].n_pos == 0, "V width mismatch refused (f16 %d)", f16);
        kv_free(&d);
        kv_init(&d, 1, 32, 2, 24);
        kv_set_f16(&d, f16);
        CHECK(kv_load(&d, 0, path, 5) != 0, "equal-width cache refuses it (f16 %d)", f16);
        kv_free(&d);
        kv_free(&c);
    }
}

/* ------------------------------------------------------------------ a tiny GGUF writer */

typedef struct {
    const char *name;
    int nd;
    uint64_t ne[3];
    float *data;  /* F32 */
} wt;

static void w_str(FILE *f, const char *s) {
    uint64_t n = strlen(s);
    fwrite(&n, 8, 1, f);
    fwrite(s, 1, n, f);
}

/* kv: string pairs only. */
static int write_gguf(const char *path, const char **kk, const char **kvv, int nkv, const wt *t, int nt) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    uint32_t ver = 3;
    uint64_t n_t = (uint64_t)nt, n_kv = (uint64_t)nkv;
    fwrite("GGUF", 1, 4, f);
    fwrite(&ver, 4, 1, f);
    fwrite(&n_t, 8, 1, f);
    fwrite(&n_kv, 8, 1, f);
    for (int i = 0; i < nkv; i++) {
        uint32_t ty = GGUF_T_STRING;
        w_str(f, kk[i]);
        fwrite(&ty, 4, 1, f);
        w_str(f, kvv[i]);
    }
    uint64_t off = 0;
    for (int i = 0; i < nt; i++) {
        w_str(f, t[i].name);
        uint32_t nd = (uint32_t)t[i].nd, ty = GGML_F32;
        fwrite(&nd, 4, 1, f);
        fwrite(t[i].ne, 8, nd, f);
        fwrite(&ty, 4, 1, f);
        fwrite(&off, 8, 1, f);
        uint64_t n = 1;
        for (int d = 0; d < t[i].nd; d++) n *= t[i].ne[d];
        off += (n * 4 + 31) / 32 * 32;
    }
    long pos = ftell(f);
    while (pos % 32) {
        fputc(0, f);
        pos++;
    }
    for (int i = 0; i < nt; i++) {
        uint64_t n = 1;
        for (int d = 0; d < t[i].nd; d++) n *= t[i].ne[d];
        fwrite(t[i].data, 4, n, f);
        for (uint64_t p = n * 4; p % 32; p++) fputc(0, f);
    }
    return fclose(f);
}

/* ------------------------------------------------------------------ expert store */

enum { XD = 8, XE = 4, XN = 4 };  /* d_model, d_expert, experts */
static const int xlayers[2] = {1, 3}; /* absolute layers of MoE rows 0, 1 (of 4) */

/* value of element j of expert e's tensor k in row r */
static float xval(int r, int k, int e, int j) { return (float)(r * 10000 + k * 1000 + e * 100 + j); }

static int make_expert_gguf(const char *path) {
    wt t[6];
    char names[6][64];
    float *bufs[6];
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 3; k++) {
            int i = r * 3 + k;
            static const char *kn[3] = {"gate", "up", "down"};
            snprintf(names[i], sizeof names[i], "blk.%d.ffn_%s_exps.weight", xlayers[r], kn[k]);
            t[i].name = names[i];
            t[i].nd = 3;
            t[i].ne[0] = k < 2 ? XD : XE;
            t[i].ne[1] = k < 2 ? XE : XD;
            t[i].ne[2] = XN;
            bufs[i] = malloc(sizeof(float) * XD * XE * XN);
            for (int e = 0; e < XN; e++)
                for (int j = 0; j < XD * XE; j++) bufs[i][e * XD * XE + j] = xval(r, k, e, j);
            t[i].data = bufs[i];
        }
    const char *kk[1] = {"general.architecture"}, *vv[1] = {"llama"};
    int rc = write_gguf(path, kk, vv, 1, t, 6);
    for (int i = 0; i < 6; i++) free(bufs[i]);
    return rc;
}

static int check_expert(const expert_w *w, int r, int e) {
    const qmat *m[3] = {&w->gate, &w->up, &w->down};
    for (int k = 0; k < 3; k++) {
        if (m[k]->type != GGML_F32 || m[k]->rows != (k < 2 ? XE : XD) || m[k]->cols != (k < 2 ? XD : XE)) return 0;
        const float *f = (const float *)(const void *)m[k]->data;
        for (int j = 0; j < XD * XE; j++)
            if (f[j] != xval(r, k, e, j)) return 0;
    }
    return 1;
}

static int tier_of(expert_store *s, int r, int e) {
    uint8_t map[2 * XN];
    es_emap(s, map);
    return map[r * XN + e] >> 6;
}

static int heat_of(expert_store *s, int r, int e) {
    uint8_t map[2 * XN];
    es_emap(s, map);
    return map[r * XN + e] & 63;
}

typedef struct { int n, layer[64], eid[64], old_tier[64]; } repin_log;
static void on_repin(void *ud, int layer, int eid, int old_tier, int gpu) {
    repin_log *lg = ud;
    (void)gpu;
    if (lg->n < 64) {
        lg->layer[lg->n] = layer;
        lg->eid[lg->n] = eid;
        lg->old_tier[lg->n] = old_tier;
    }
    lg->n++;
}

static expert_store *open_store(gguf_file *g, const expert_opts *o, uint32_t id) {
    const gguf_tensor *t[6];
    char nm[64];
    for (int r = 0; r < 2; r++) {
        static const char *kn[3] = {"gate", "up", "down"};
        for (int k = 0; k < 3; k++) {
            snprintf(nm, sizeof nm, "blk.%d.ffn_%s_exps.weight", xlayers[r], kn[k]);
            t[r * 3 + k] = gguf_find_tensor(g, nm);
        }
    }
    expert_layer_src src[2] = {{xlayers[0], t[0], t[1], t[2], 0, NULL}, {xlayers[1], t[3], t[4], t[5], 0, NULL}};
    char err[256] = "";
    expert_store *s = es_create(g, src, 2, XN, o, id, 4, err, sizeof err);
    if (!s) printf("es_create: %s\n", err);
    return s;
}

static void test_experts(void) {
    char path[512], upath[512];
    tpath(path, sizeof path, "experts.gguf");
    tpath(upath, sizeof upath, "usage.txt");
    CHECK(make_expert_gguf(path) == 0, "write expert gguf");
    gguf_file g;
    if (gguf_open(&g, path) != 0) {
        CHECK(0, "gguf_open: %s", g.err);
        return;
    }
    const size_t EB = 3 * XD * XE * sizeof(float);
    expert_w w;
    double tr = 0;

    /* all resident */
    expert_opts o;
    memset(&o, 0, sizeof o);
    o.ram_budget = SIZE_MAX;
    expert_store *s = open_store(&g, &o, 77);
    CHECK(s != NULL, "create all-resident");
    if (!s) return;
    CHECK(es_rows(s) == 2 && es_cols(s) == XN && es_expert_bytes(s) == EB, "dims / expert bytes %zu", es_expert_bytes(s));
    int vr, ram, disk;
    double vg, rg;
    es_tiers(s, &vr, &ram, &disk, &vg, &rg);
    CHECK(vr == 0 && ram == 8 && disk == 0 && fabs(rg - 8.0 * EB / 1e9) < 1e-12, "TIERS all RAM: %d %d %d", vr, ram, disk);
    int ok = 1;
    for (int r = 0; r < 2; r++)
        for (int e = 0; e < XN; e++) {
            ok &= es_acquire(s, r, e, &w, &tr) == 0 && check_expert(&w, r, e);
            es_release(s, r, e);
        }
    CHECK(ok, "all experts' bytes correct (resident)");
    CHECK(es_hit_pct_take(s) == 100.0, "hit 100%%");
    CHECK(es_hit_pct_take(s) == 0.0, "hit window reset");
    es_free(s);

    /* LRU with room for 2 experts */
    o.ram_budget = 2 * EB;
    s = open_store(&g, &o, 77);
    es_tiers(s, &vr, &ram, &disk, &vg, &rg);
    CHECK(ram == 0 && disk == 8, "nothing resident at start");
    ok = 1;
    for (int e = 0; e < 3; e++) {
        ok &= es_acquire(s, 0, e, &w, &tr) == 0 && check_expert(&w, 0, e);
        es_release(s, 0, e);
    }
    CHECK(ok, "bytes correct (read from disk)");
    CHECK(tier_of(s, 0, 0) == 0 && tier_of(s, 0, 1) == 1 && tier_of(s, 0, 2) == 1, "LRU evicted expert 0");
    es_acquire(s, 0, 1, &w, &tr); /* touch 1 -> 2 is now least recent */
    es_release(s, 0, 1);
    es_acquire(s, 1, 3, &w, &tr);
    CHECK(check_expert(&w, 1, 3), "row 1 expert 3 bytes");
    es_release(s, 1, 3);
    CHECK(tier_of(s, 0, 1) == 1 && tier_of(s, 0, 2) == 0 && tier_of(s, 1, 3) == 1, "LRU evicted expert 2, kept 1");
    double hp = es_hit_pct_take(s);
    CHECK(fabs(hp - 20.0) < 1e-9, "hit pct 1/5 = %.1f", hp);
    /* an acquired expert is not evicted */
    expert_w w0, w1, w2;
    es_acquire(s, 0, 0, &w0, &tr);  /* evicts (0,1), the LRU tail */
    es_acquire(s, 0, 2, &w1, &tr);  /* evicts (1,3); (0,0) is in use */
    es_acquire(s, 1, 0, &w2, &tr);  /* nothing evictable: read to scratch */
    CHECK(check_expert(&w0, 0, 0) && check_expert(&w1, 0, 2) && check_expert(&w2, 1, 0), "held experts intact");
    CHECK(tier_of(s, 0, 0) == 1 && tier_of(s, 0, 2) == 1 && tier_of(s, 1, 0) == 0, "in-use experts not evicted");
    es_release(s, 1, 0);
    es_release(s, 0, 2);
    es_release(s, 0, 0);
    es_tiers(s, &vr, &ram, &disk, &vg, &rg);
    CHECK(ram == 2 && disk == 6, "TIERS 0 2 6: %d %d", ram, disk);
    CHECK(tr >= 0.0, "read time");
    es_free(s);

    /* es_acquire_many: room for 2 of 4 misses, read on the pool; all held until released */
    o.ram_budget = 2 * EB;
    s = open_store(&g, &o, 77);
    {
        expert_w ws[XN];
        int list[4] = {0, 1, 2, 3};
        CHECK(es_acquire_many(s, 1, list, 4, ws, &tr) == 0, "acquire_many");
        ok = 1;
        for (int k = 0; k < 4; k++) ok &= check_expert(&ws[k], 1, k);
        CHECK(ok, "acquire_many: every expert's bytes correct");
        es_tiers(s, &vr, &ram, &disk, &vg, &rg);
        CHECK(ram == 2, "acquire_many: 2 resident (the budget), 2 read to scratch: %d", ram);
        int again[2] = {1, 3};
        expert_w ws2[XN];
        CHECK(es_acquire_many(s, 1, again, 2, ws2, &tr) == 0 && check_expert(&ws2[1], 1, 1) &&
                  check_expert(&ws2[3], 1, 3), "held experts acquired twice");
        es_release(s, 1, 1);
        es_release(s, 1, 3);
        for (int k = 0; k < 4; k++) es_release(s, 1, k);
        int bad[2] = {0, XN};
        CHECK(es_acquire_many(s, 0, bad, 2, ws, &tr) != 0, "acquire_many refuses a bad id");
        CHECK(es_acquire(s, 0, 0, &w, &tr) == 0 && check_expert(&w, 0, 0), "store usable after a failure");
        es_release(s, 0, 0);
        /* everything released: all of it evictable again */
        CHECK(es_acquire_many(s, 0, list, 4, ws, &tr) == 0 && check_expert(&ws[3], 0, 3) &&
                  check_expert(&ws[1], 0, 1), "second batch, other row");
        for (int k = 0; k < 4; k++) es_release(s, 0, k);
        es_tiers(s, &vr, &ram, &disk, &vg, &rg);
        CHECK(ram == 2, "budget kept: %d resident", ram);
    }
    es_free(s);

    /* budget 0: every acquisition reads from disk, nothing kept */
    o.ram_budget = 0;
    s = open_store(&g, &o, 77);
    es_acquire(s, 1, 2, &w, &tr);
    CHECK(check_expert(&w, 1, 2) && tier_of(s, 1, 2) == 0, "tier-0 read");
    es_release(s, 1, 2);
    es_acquire(s, 1, 1, &w, &tr);
    CHECK(check_expert(&w, 1, 1), "tier-0 read reusing scratch");
    es_release(s, 1, 1);
    CHECK(es_hit_pct_take(s) == 0.0, "no hits");

    /* heat, EMAP, HITS */
    for (int i = 0; i < 5; i++) es_note_selected(s, 0, 1);
    es_note_selected(s, 1, 3);
    for (int i = 0; i < 64; i++) es_note_selected(s, 1, 0);
    CHECK(heat_of(s, 0, 1) == 3 && heat_of(s, 1, 3) == 1 && heat_of(s, 1, 0) == 7 && heat_of(s, 0, 0) == 0,
          "heat = bit length");
    uint8_t hits[1];
    es_hits_take(s, hits);
    CHECK(hits[0] == ((1u << 1) | (1u << 7) | (1u << 4)), "HITS LSB-first: %02x", hits[0]);
    es_hits_take(s, hits);
    CHECK(hits[0] == 0, "HITS cleared");

    /* usage file */
    snprintf(o.usage_path, sizeof o.usage_path, "%s", upath);
    o.usage_save = 1;
    es_free(s);
    unlink(upath);
    s = open_store(&g, &o, 77);
    for (int i = 0; i < 5; i++) es_note_selected(s, 0, 1);
    es_note_selected(s, 1, 3);
    for (int i = 0; i < 64; i++) es_note_selected(s, 1, 0);
    CHECK(es_usage_save(s) == 0, "usage save");
    size_t len;
    char *txt = slurp(upath, &len);
    CHECK(txt && strcmp(txt, "-1 4 4\n-2 1 77\n1 1 5\n3 0 64\n3 3 1\n") == 0, "usage text: %s", txt ? txt : "(none)");
    free(txt);
    es_free(s);

    /* reload: heat survives; pinning by heat within pin_budget (1 expert) */
    o.ram_budget = 2 * EB;
    o.pin_budget = EB;
    s = open_store(&g, &o, 77);
    CHECK(heat_of(s, 0, 1) == 3 && heat_of(s, 1, 0) == 7 && heat_of(s, 1, 3) == 1, "heat loaded from usage");
    CHECK(tier_of(s, 1, 0) == 1 && tier_of(s, 0, 1) == 0, "hottest expert pinned at start");
    /* pinned expert survives LRU pressure */
    for (int e = 0; e < XN; e++) {
        es_acquire(s, 0, e, &w, &tr);
        es_release(s, 0, e);
    }
    CHECK(tier_of(s, 1, 0) == 1, "pinned expert never evicted");
    es_tiers(s, &vr, &ram, &disk, &vg, &rg);
    CHECK(ram == 2, "pinned + one LRU resident: %d", ram);
    /* heat shifts -> repin swaps (1,0) for (0,2) */
    for (int i = 0; i < 200; i++) es_note_selected(s, 0, 2);
    repin_log lg = {0};
    es_repin(s, on_repin, &lg);
    CHECK(lg.n == 2, "two repin events: %d", lg.n);
    if (lg.n == 2) {
        CHECK(lg.layer[0] == 3 && lg.eid[0] == 0 && lg.old_tier[0] == 1, "unpin event (layer 3, e0)");
        CHECK(lg.layer[1] == 1 && lg.eid[1] == 2, "pin event (layer 1, e2)");
    }
    CHECK(tier_of(s, 0, 2) == 1, "newly pinned expert resident");
    lg.n = 0;
    es_repin(s, on_repin, &lg);
    CHECK(lg.n == 0, "stable repin: no events");
    es_free(s);

    /* header mismatch (other engine id): ignored */
    o.usage_save = 0;
    s = open_store(&g, &o, 78);
    CHECK(heat_of(s, 1, 0) == 0, "usage with another engine id ignored");
    CHECK(es_usage_save(s) == 0, "usage_save=0: no write");
    txt = slurp(upath, &len);
    CHECK(txt && strncmp(txt, "-1 4 4\n-2 1 77\n", 15) == 0, "file untouched");
    free(txt);
    es_free(s);
    gguf_close(&g);
}

/* The store borrows the KV share's unused part and gives it back as KV grows: its RAM plus
 * KV's bytes never pass its own share plus the KV share, and KV grows exactly as it does with
 * no borrower (a twin cache), up to the same refusal. */
static int residents(expert_store *s) {
    int v, r, d;
    double vg, rg;
    es_tiers(s, &v, &r, &d, &vg, &rg);
    return r;
}

static void grow_kv_full(expert_store *s, kv_cache *kv, size_t own, size_t share, const char *what) {
    kv_cache twin;
    kv_init(&twin, 1, 100, 1, 2);
    kv_set_budget(&twin, share);
    const int last = (int)(share / 20);     /* 1 layer x (2 + 2) floats + a token id = 20 bytes */
    int n = 1, ok = 1, fit = 1;
    for (; n <= 100; n++) {
        const int rc = kv_reserve(kv, 0, n), rc2 = kv_reserve(&twin, 0, n);
        ok &= rc == rc2 && kv->slots[0].cap == twin.slots[0].cap && kv->used == twin.used;
        if (rc != 0) break;
        fit &= (size_t)residents(s) * 3 * XD * XE * sizeof(float) + kv->used <= own + share;
    }
    CHECK(ok, "%s: KV grows as with no borrower", what);
    CHECK(fit, "%s: experts + KV within the two shares", what);
    CHECK(n == last + 1 && kv->used == (size_t)last * 20, "%s: refused where the share ends: n %d", what, n);
    kv_free(&twin);
}

static void test_expert_borrow(void) {
    char path[512];
    tpath(path, sizeof path, "borrow.gguf");
    CHECK(make_expert_gguf(path) == 0, "write expert gguf");
    gguf_file g;
    if (gguf_open(&g, path) != 0) return;
    const size_t EB = 3 * XD * XE * sizeof(float), share = 3 * EB;
    expert_w w, held;
    double tr = 0;
    expert_opts o;
    memset(&o, 0, sizeof o);
    o.ram_budget = EB;
    expert_store *s = open_store(&g, &o, 77);
    kv_cache kv;
    kv_init(&kv, 1, 100, 1, 2);
    kv_set_budget(&kv, share);
    es_borrow(s, &kv.used, share);
    kv_set_reclaim(&kv, es_kv_room, s);
    for (int e = 0; e < XN; e++) {
        es_acquire(s, 0, e, &w, &tr);
        es_release(s, 0, e);
    }
    CHECK(residents(s) == 4 && es_borrowed(s) == 3 * EB && es_borrowable(s) == share,
          "empty KV share: 4 resident on a share of 1 (%d, borrowed %zu)", residents(s), es_borrowed(s));
    CHECK(es_acquire(s, 1, 0, &held, &tr) == 0, "acquire (1,0)");
    grow_kv_full(s, &kv, EB, share, "LRU");
    CHECK(residents(s) == 1 && tier_of(s, 1, 0) == 1 && check_expert(&held, 1, 0), "the held expert stays, intact");
    es_release(s, 1, 0);
    kv_release(&kv, 0);
    es_acquire(s, 0, 2, &w, &tr);
    es_release(s, 0, 2);
    CHECK(residents(s) == 2, "KV freed: the cache borrows again (%d)", residents(s));
    kv_free(&kv);
    es_free(s);

    /* pins stay within the own share; held copies can push them out, the coldest first */
    o.ram_budget = o.pin_budget = 2 * EB;
    s = open_store(&g, &o, 77);
    for (int k = 0; k < 3; k++) es_note_selected(s, 0, 0);
    for (int k = 0; k < 2; k++) es_note_selected(s, 0, 1);
    es_repin(s, NULL, NULL);
    kv_init(&kv, 1, 100, 1, 2);
    kv_set_budget(&kv, share);
    es_borrow(s, &kv.used, share);
    kv_set_reclaim(&kv, es_kv_room, s);
    for (int e = 0; e < 3; e++) {
        es_acquire(s, 1, e, &w, &tr);
        es_release(s, 1, e);
    }
    es_acquire(s, 1, 3, &held, &tr);
    CHECK(residents(s) == 5, "2 pinned + 3 borrowed: %d", residents(s));
    grow_kv_full(s, &kv, 2 * EB, share, "pinned");
    CHECK(tier_of(s, 0, 0) == 1 && tier_of(s, 0, 1) == 0 && residents(s) == 2 && check_expert(&held, 1, 3),
          "the colder pin gave way, the hotter one and the held expert stayed");
    es_release(s, 1, 3);
    kv_free(&kv);
    es_free(s);
    gguf_close(&g);
}

/* ------------------------------------------------------------------ model */

static const char *python(void) {
    const char *p = getenv("COLI_PYTHON");
    if (p && *p) return p;
    if (access("../.venv/bin/python", X_OK) == 0) return "../.venv/bin/python";
    return "python3";
}

static int make_fixture(const char *out, const char *args) {
    const char *tool = access("tools/make_tiny_moe.py", R_OK) == 0 ? "tools/make_tiny_moe.py" : "native/tools/make_tiny_moe.py";
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s %s %s %s >/dev/null 2>&1", python(), tool, out, args);
    return system(cmd) == 0 ? 0 : -1;
}

static int argmax(const float *v, int n) {
    int b = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[b]) b = i;
    return b;
}

/* Patch a tensor-info record in a GGUF image: find the name and overwrite ne[which]. */
static int patch_ne(char *img, size_t len, const char *name, int which, uint64_t v) {
    size_t nl = strlen(name);
    for (size_t i = 8; i + nl + 24 < len; i++) {
        uint64_t l;
        memcpy(&l, img + i - 8, 8);
        if (l == nl && memcmp(img + i, name, nl) == 0) {
            memcpy(img + i + nl + 4 + 8 * (size_t)which, &v, 8);
            return 0;
        }
    }
    return -1;
}

static char *find_bytes(char *hay, size_t len, const char *needle) {
    size_t n = strlen(needle);
    for (size_t i = 0; i + n <= len; i++)
        if (memcmp(hay + i, needle, n) == 0) return hay + i;
    return NULL;
}

static int write_file(const char *path, const char *b, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    fwrite(b, 1, n, f);
    return fclose(f);
}

static void test_refusals(const char *moe_path) {
    char path[512], err[256];
    model m;
    size_t len;
    char *img = slurp(moe_path, &len);
    if (!img) return;
    tpath(path, sizeof path, "bad.gguf");
    char *b = malloc(len);

    memcpy(b, img, len);
    patch_ne(b, len, "blk.2.attn_k.weight", 1, 32);
    write_file(path, b, len);
    CHECK(model_load(&m, path, NULL, err, sizeof err) != 0 &&
              strcmp(err, "blk.2.attn_k.weight: expected [128, 64], got [128, 32]") == 0,
          "shape refusal: %s", err);

    memcpy(b, img, len);
    char *p = find_bytes(b, len, "blk.1.ffn_norm.weight");
    if (p) p[14] = 'X';
    write_file(path, b, len);
    CHECK(model_load(&m, path, NULL, err, sizeof err) != 0 && strcmp(err, "blk.1.ffn_norm.weight: tensor missing") == 0,
          "missing refusal: %s", err);

    memcpy(b, img, len);
    patch_ne(b, len, "blk.0.ffn_down_exps.weight", 2, 7);
    write_file(path, b, len);
    CHECK(model_load(&m, path, NULL, err, sizeof err) != 0 &&
              strcmp(err, "blk.0.ffn_down_exps.weight: expected [64, 128, 8], got [64, 128, 7]") == 0,
          "expert shape refusal: %s", err);

    memcpy(b, img, len);
    p = find_bytes(b, len, "general.architecture");
    if (p) memcpy(p + 20 + 4 + 8, "gpt2!", 5);
    write_file(path, b, len);
    CHECK(model_load(&m, path, NULL, err, sizeof err) != 0 && strcmp(err, "architecture 'gpt2!' is not supported (supported: llama, qwen3moe, olmoe, qwen2moe, granitemoe, glm4moe, gpt-oss, qwen35moe, qwen3next)") == 0,
          "arch refusal: %s", err);
    free(b);
    free(img);
    CHECK(model_load(&m, "/nonexistent.gguf", NULL, err, sizeof err) != 0 && err[0], "missing file: %s", err);
    model_free(&m);  /* after a failed load: harmless */
}

/* Greedy decode n steps from a prompt on slot s, alone or with a companion slot in the batch. */
static void test_forward(const char *path, int shexp) {
    char err[256];
    model m;
    expert_opts o;
    memset(&o, 0, sizeof o);
    o.ram_budget = SIZE_MAX;
    if (model_load(&m, path, &o, err, sizeof err) != 0) {
        CHECK(0, "model_load %s: %s", path, err);
        return;
    }
    const model_config *c = &m.c;
    CHECK(c->n_layers == 4 && c->d_model == 128 && c->n_heads == 4 && c->n_kv_heads == 2 && c->head_dim == 32,
          "config dims");
    CHECK(c->n_experts == 8 && c->top_k == 2 && c->d_expert == 64 && c->d_shexp == (shexp ? 128 : 0) &&
              c->n_moe_rows == 4,
          "config experts: %d %d %d %d", c->n_experts, c->top_k, c->d_expert, c->d_shexp);
    CHECK(c->vocab > 259 && m.tok_embd.rows == c->vocab && m.output.rows == c->vocab &&
              (m.output.data == m.tok_embd.data || m.output.packed), "vocab / tied head");
    CHECK(strncmp(m.name, "tiny-moe8x2", 11) == 0 && m.chat_template != NULL, "name %s", m.name);
    CHECK(m.fingerprint != 0, "fingerprint");

    kv_cache kv;
    kv_init(&kv, 3, 64, c->n_layers, c->n_kv_heads * c->head_dim);
    int V = c->vocab, E = c->n_experts;
    const int prompt[6] = {1, 40, 77, 300, 12, 5};
    float *lg = malloc(sizeof(float) * V * 8), *lg2 = malloc(sizeof(float) * V * 8);
    uint32_t *rc = calloc((size_t)c->n_moe_rows * E, sizeof(uint32_t));

    /* prefill slot 0 in one batch (logits on every row), slot 1 token by token */
    fwd_row rows[8];
    for (int i = 0; i < 6; i++)
        rows[i] = (fwd_row){0, i, prompt[i], lg + (size_t)i * V, rc, 0, 0, NULL};
    CHECK(model_forward(&m, &kv, rows, 6) == 0, "batched prefill");
    double maxd = 0;
    for (int i = 0; i < 6; i++) {
        fwd_row r1 = {1, i, prompt[i], lg2 + (size_t)i * V, NULL, 0, 0, NULL};
        CHECK(model_forward(&m, &kv, &r1, 1) == 0, "single-row forward");
        for (int j = 0; j < V; j++) maxd = fmax(maxd, fabs(lg[(size_t)i * V + j] - lg2[(size_t)i * V + j]));
    }
    CHECK(maxd == 0.0, "batched prefill == token-by-token: max diff %g", maxd);
    uint64_t total = 0;
    for (int i = 0; i < c->n_moe_rows * E; i++) total += rc[i];
    CHECK(total == (uint64_t)6 * c->n_moe_rows * c->top_k, "route counts %llu", (unsigned long long)total);
    CHECK(kv.slots[0].n_pos == 6 && kv.slots[0].tokens[5] == 5, "history appended");
    int bad_pos = kv.slots[0].n_pos;
    fwd_row wrong = {0, 3, 7, NULL, NULL, 0, 0, NULL};
    CHECK(model_forward(&m, &kv, &wrong, 1) != 0 && kv.slots[0].n_pos == bad_pos, "wrong pos refused");

    /* greedy decode: slot 0 alone vs slot 0 batched with slot 1 (different history) */
    int t0 = argmax(lg + 5 * V, V), alone[8], mixed[8];
    kv_cache kv2;
    kv_init(&kv2, 2, 64, c->n_layers, c->n_kv_heads * c->head_dim);
    for (int i = 0; i < 6; i++) {
        fwd_row r1 = {0, i, prompt[i], NULL, NULL, 0, 0, NULL};
        model_forward(&m, &kv2, &r1, 1);
    }
    int cur = t0;
    for (int s = 0; s < 8; s++) {
        fwd_row r1 = {0, 6 + s, cur, lg, NULL, 0, 0, NULL};
        model_forward(&m, &kv2, &r1, 1);
        alone[s] = cur = argmax(lg, V);
    }
    memcpy(lg2, lg, sizeof(float) * V);  /* last logits alone */
    cur = t0;
    int cur1 = 9;
    for (int s = 0; s < 8; s++) {
        fwd_row rr[2] = {{1, kv.slots[1].n_pos, cur1, lg + V, NULL, 0, 0, NULL}, {0, 6 + s, cur, lg, NULL, 0, 0, NULL}};
        CHECK(model_forward(&m, &kv, rr, 2) == 0, "mixed batch");
        mixed[s] = cur = argmax(lg, V);
        cur1 = argmax(lg + V, V);
    }
    CHECK(memcmp(alone, mixed, sizeof alone) == 0, "greedy tokens identical alone vs batched");
    CHECK(memcmp(lg, lg2, sizeof(float) * V) == 0, "last logits bit-identical alone vs batched");

    /* expert store with a small RAM budget gives the same logits */
    model m2;
    o.ram_budget = 3 * es_expert_bytes(m.es);
    CHECK(model_load(&m2, path, &o, err, sizeof err) == 0, "load with small budget: %s", err);
    kv_cache kv3;
    kv_init(&kv3, 1, 64, c->n_layers, c->n_kv_heads * c->head_dim);
    for (int i = 0; i < 6; i++) rows[i] = (fwd_row){0, i, prompt[i], lg2 + (size_t)i * V, NULL, 0, 0, NULL};
    model_forward(&m2, &kv3, rows, 6);
    kv_cache kv4;
    kv_init(&kv4, 1, 64, c->n_layers, c->n_kv_heads * c->head_dim);
    for (int i = 0; i < 6; i++) rows[i] = (fwd_row){0, i, prompt[i], lg + (size_t)i * V, NULL, 0, 0, NULL};
    model_forward(&m, &kv4, rows, 6);
    CHECK(memcmp(lg, lg2, sizeof(float) * V * 6) == 0, "small expert budget: same logits");
    int vr, ram, disk;
    double vg, rg;
    es_tiers(m2.es, &vr, &ram, &disk, &vg, &rg);
    CHECK(ram <= 3 && ram + disk == c->n_moe_rows * E, "TIERS under budget: %d %d", ram, disk);
    double hp = es_hit_pct_take(m2.es);
    CHECK(hp >= 0.0 && hp < 100.0, "hit pct %.1f", hp);
    CHECK(m.perf.forwards > 0 && m.perf.t_attn > 0 && m2.perf.t_edisk > 0, "perf counters");

    /* KV of a model forward survives save/load and continues identically */
    char kpath[512];
    tpath(kpath, sizeof kpath, "model.kv");
    CHECK(kv_save(&kv4, 0, kpath, m.fingerprint) == 0, "kv_save");
    CHECK(kv_load(&kv3, 0, kpath, m.fingerprint) == 0 && kv3.slots[0].n_pos == 6, "kv_load");
    fwd_row ra = {0, 6, 42, lg, NULL, 0, 0, NULL}, rb = {0, 6, 42, lg2, NULL, 0, 0, NULL};
    model_forward(&m, &kv4, &ra, 1);
    model_forward(&m, &kv3, &rb, 1);
    CHECK(memcmp(lg, lg2, sizeof(float) * V) == 0, "continuation after kv_load identical");

    kv_free(&kv);
    kv_free(&kv2);
    kv_free(&kv3);
    kv_free(&kv4);
    free(lg);
    free(lg2);
    free(rc);
    model_free(&m2);
    model_free(&m);
}

/* Per-row expert counts (SUBMIT experts=N): in one batch, rows of different slots with
 * different counts each get the logits of that slot run alone with its count, and the
 * engine-wide TOPK setting gives the same logits as the row's count. */
static void test_row_experts(const char *path) {
    char err[256];
    model m, mk;
    expert_opts o;
    memset(&o, 0, sizeof o);
    o.ram_budget = SIZE_MAX;
    if (model_load(&m, path, &o, err, sizeof err) != 0) {
        CHECK(0, "model_load %s: %s", path, err);
        return;
    }
    const model_config *c = &m.c;
    const int V = c->vocab, E = c->n_experts, NS = 4, NT = 5;
    const int counts[4] = {0, 1, 5, 8};          /* 0: the model's top_k (2) */
    const int prompt[5] = {1, 40, 77, 300, 12};
    float *alone = malloc(sizeof(float) * V * NS * NT), *batch = malloc(sizeof(float) * V * NS * NT);
    uint32_t *rc = calloc((size_t)c->n_moe_rows * E * NS, sizeof(uint32_t));
    fwd_row rows[4 * 5];
    kv_cache kv;
    for (int s = 0; s < NS; s++) {               /* each slot alone, its own kv */
        kv_init(&kv, 1, 16, c->n_layers, c->n_kv_heads * c->head_dim);
        for (int i = 0; i < NT; i++)
            rows[i] = (fwd_row){0, i, prompt[i], alone + (size_t)(s * NT + i) * V, NULL, counts[s], 0, NULL};
        CHECK(model_forward(&m, &kv, rows, NT) == 0, "forward alone, experts=%d", counts[s]);
        kv_free(&kv);
    }
    /* all slots in one batch, rows interleaved across slots */
    kv_init(&kv, NS, 16, c->n_layers, c->n_kv_heads * c->head_dim);
    int n = 0;
    for (int i = 0; i < NT; i++)
        for (int s = 0; s < NS; s++)
            rows[n++] = (fwd_row){s, i, prompt[i], batch + (size_t)(s * NT + i) * V,
                                  rc + (size_t)s * c->n_moe_rows * E, counts[s], 0, NULL};
    CHECK(model_forward(&m, &kv, rows, n) == 0, "mixed-count batch");
    CHECK(memcmp(alone, batch, sizeof(float) * V * NS * NT) == 0, "each row as its slot alone (bit-identical)");
    for (int s = 0; s < NS; s++) {
        uint64_t total = 0;
        for (int i = 0; i < c->n_moe_rows * E; i++) total += rc[(size_t)s * c->n_moe_rows * E + i];
        int k = counts[s] ? counts[s] : c->top_k;
        CHECK(total == (uint64_t)NT * c->n_moe_rows * k, "route counts of experts=%d: %llu", k,
              (unsigned long long)total);
    }
    CHECK(memcmp(alone, alone + (size_t)3 * NT * V, sizeof(float) * V * NT) != 0, "experts=8 differs from top-2");
    CHECK(model_fingerprint_k(&m, c->top_k) == m.fingerprint && model_fingerprint_k(&m, 5) != m.fingerprint &&
              model_fingerprint_k(&m, 5) != model_fingerprint_k(&m, 8), "fingerprint per expert count");
    /* TOPK=5 for the whole engine == experts=5 on this row */
    setenv("TOPK", "5", 1);
    int ok = model_load(&mk, path, &o, err, sizeof err) == 0;
    unsetenv("TOPK");
    CHECK(ok && mk.c.top_k == 5, "load with TOPK=5: %s", err);
    if (ok) {
        kv_free(&kv);
        kv_init(&kv, 1, 16, c->n_layers, c->n_kv_heads * c->head_dim);
        for (int i = 0; i < NT; i++) rows[i] = (fwd_row){0, i, prompt[i], batch + (size_t)i * V, NULL, 0, 0, NULL};
        CHECK(model_forward(&mk, &kv, rows, NT) == 0, "forward TOPK=5");
        CHECK(memcmp(batch, alone + (size_t)2 * NT * V, sizeof(float) * V * NT) == 0, "TOPK=5 == experts=5");
        model_free(&mk);
    }
    kv_free(&kv);
    free(alone);
    free(batch);
    free(rc);
    model_free(&m);
}

static void test_dense(const char *path) {
    char err[256];
    model m;
    if (model_load(&m, path, NULL, err, sizeof err) != 0) {
        CHECK(0, "dense load: %s", err);
        return;
    }
    CHECK(m.c.n_experts == 0 && m.c.n_moe_rows == 0 && es_rows(m.es) == 0, "dense config");
    kv_cache kv;
    kv_init(&kv, 1, 16, m.c.n_layers, m.c.n_kv_heads * m.c.head_dim);
    float *lg = malloc(sizeof(float) * m.c.vocab);
    fwd_row r[3] = {{0, 0, 1, NULL, NULL, 0, 0, NULL}, {0, 1, 50, NULL, NULL, 0, 0, NULL}, {0, 2, 60, lg, NULL, 0, 0, NULL}};
    CHECK(model_forward(&m, &kv, r, 3) == 0, "dense forward");
    int finite = 1;
    for (int i = 0; i < m.c.vocab; i++) finite &= isfinite(lg[i]);
    CHECK(finite, "dense logits finite");
    free(lg);
    kv_free(&kv);
    model_free(&m);
}

/* Sliding-window layers keep only their recent rows (a buffer that slides), the rows a forward
 * reads survive, rewinds keep what the window allows or fall back to the checkpoint or to 0, and
 * slot files carry the window. Layers 0 and 2 windowed (5 keys), layer 1 full. */
static float kvval(int l, int p, int j) { return (float)(l * 100000 + p * 10 + j); }
static void kv_fill(kv_cache *c, int s, int from, int to) {   /* positions from .. to - 1, one at a time */
    float k[4], v[4];
    for (int p = from; p < to; p++) {
        CHECK(kv_reserve(c, s, p + 1) == 0, "reserve %d", p + 1);
        for (int l = 0; l < 3; l++) {
            for (int j = 0; j < 4; j++) k[j] = kvval(l, p, j), v[j] = -kvval(l, p, j);
            kv_store(c, s, l, p, k, v);
        }
        c->slots[s].tokens[p] = p;
        c->slots[s].n_pos = p + 1;
    }
}
static int kv_rows_ok(kv_cache *c, int s, int l, int from, int to) {
    int ok = 1;
    for (int p = from; p < to; p++)
        for (int j = 0; j < 4; j++)
            ok &= ((float *)kv_k(c, s, l, p))[j] == kvval(l, p, j) && ((float *)kv_v(c, s, l, p))[j] == -kvval(l, p, j);
    return ok;
}
static void test_kv_window(void) {
    kv_cache c;
    CHECK(kv_init(&c, 2, 400, 3, 4) == 0 && kv_set_window(&c, 0, 5) == 0 && kv_set_window(&c, 2, 5) == 0, "windowed cache");
    CHECK(kv_set_window(&c, 1, 6) != 0, "a second window size refused");
    kv_fill(&c, 0, 0, 100);
    CHECK(kv_rows_ok(&c, 0, 0, 96, 100) && kv_rows_ok(&c, 0, 2, 96, 100) && kv_rows_ok(&c, 0, 1, 0, 100),
          "decode: the windows' last 4 rows and every full-layer row");
    CHECK(c.slots[0].wcap == 10 && c.slots[0].wbase > 0, "windowed rows in two windows' room (cap %d)", c.slots[0].wcap);
    /* a 30-row batch from 100: its first row reads keys 96 .. 100 */
    CHECK(kv_reserve_from(&c, 0, 100, 130) == 0, "batch reserve");
    CHECK(kv_rows_ok(&c, 0, 0, 96, 100) && c.slots[0].wbase <= 96 && c.slots[0].wcap >= 34,
          "the batch's oldest key kept through the slide (wbase %d)", c.slots[0].wbase);
    kv_fill(&c, 0, 100, 130);
    CHECK(kv_rows_ok(&c, 0, 0, 96, 130) && kv_rows_ok(&c, 0, 2, 96, 130), "batch rows");
    CHECK(kv_rewind(&c, 0, 120) == 120 && c.slots[0].n_pos == 120, "rewind within the kept rows");
    CHECK(kv_rewind(&c, 0, 50) == 0 && c.slots[0].n_pos == 0, "rewind past the window, no checkpoint: from 0");
    kv_fill(&c, 0, 0, 60);
    CHECK(kv_checkpoint(&c, 0) == 0 && c.slots[0].ckpos == 60, "checkpoint at 60");
    kv_fill(&c, 0, 60, 100);
    CHECK(kv_rewind(&c, 0, 70) == 60 && kv_rows_ok(&c, 0, 0, 56, 60) && kv_rows_ok(&c, 0, 2, 56, 60) &&
              kv_rows_ok(&c, 0, 1, 0, 60), "rewind to 70: the checkpoint's window at 60 restored");
    kv_fill(&c, 0, 60, 100);
    CHECK(kv_rows_ok(&c, 0, 0, 96, 100), "decode again after the restore");
    CHECK(kv_rewind(&c, 0, 59) == 0, "before the checkpoint, past the window: from 0");
    kv_fill(&c, 0, 0, 100);
    char path[512];
    tpath(path, sizeof path, "slot-win.kv");
    CHECK(kv_save(&c, 0, path, 5) == 0 && kv_load(&c, 1, path, 5) == 0 && c.slots[1].n_pos == 100, "slot file");
    CHECK(kv_rows_ok(&c, 1, 0, 96, 100) && kv_rows_ok(&c, 1, 2, 96, 100) && kv_rows_ok(&c, 1, 1, 0, 100) &&
              c.slots[1].tokens[99] == 99, "the loaded slot holds the windows and the full layer");
    kv_fill(&c, 1, 100, 120);
    CHECK(kv_rows_ok(&c, 1, 0, 116, 120), "decode on the loaded slot");
    struct stat st;
    CHECK(stat(path, &st) == 0 && st.st_size == 8 + 16 + 8 + 400 + (100 + 4 + 4) * 32 + 8,
          "file size: windows' rows only, no checkpoint");
    /* a checkpoint at 90 saved with the slot at 100 and restored after the load */
    kv_rewind(&c, 0, 0);
    kv_fill(&c, 0, 0, 90);
    CHECK(kv_checkpoint(&c, 0) == 0, "checkpoint at 90");
    kv_fill(&c, 0, 90, 100);
    CHECK(kv_save(&c, 0, path, 5) == 0 && kv_load(&c, 1, path, 5) == 0 && c.slots[1].ckpos == 90, "saved with it");
    CHECK(stat(path, &st) == 0 && st.st_size == 8 + 16 + 8 + 400 + (100 + 4 + 4) * 32 + 8 + 2 * 4 * 32,
          "file size with the checkpoint's rows");
    CHECK(kv_rewind(&c, 1, 91) == 90 && kv_rows_ok(&c, 1, 0, 86, 90) && kv_rows_ok(&c, 1, 2, 86, 90),
          "the loaded slot rewinds to its checkpoint");
    kv_free(&c);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_model.XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    test_kv();
    test_kv_budget();
    test_kv_f16();
    test_kv_widths();
    test_kv_window();
    test_experts();
    test_expert_borrow();

    char moe[512], moesh[512], dense[512];
    tpath(moe, sizeof moe, "moe.gguf");
    tpath(moesh, sizeof moesh, "moe_sh.gguf");
    tpath(dense, sizeof dense, "dense.gguf");
    if (make_fixture(moe, "") == 0 && make_fixture(moesh, "--shared-expert") == 0 && make_fixture(dense, "--dense") == 0) {
        test_refusals(moe);
        test_forward(moe, 0);
        test_forward(moesh, 1);
        test_row_experts(moesh);
        test_dense(dense);
    } else {
        printf("note: make_tiny_moe.py could not run (%s); model tests skipped\n", python());
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmpdir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", tmpdir);
    printf("test_model: %d checks, %d failures\n", checks, fails);
    return fails ? 1 : 0;
}
