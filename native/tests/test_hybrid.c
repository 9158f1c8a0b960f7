/* test_hybrid.c — a hybrid model's per-slot recurrent state (qwen35moe): the forward continues a
 * slot only from the state of exactly its history, model_resume says how much of a history a new
 * turn may keep (the live state or a checkpoint, also through the state file), and a slot that
 * restarts at position 0 computes what a fresh slot does; only the attention layers keep K/V
 * (buffers, budget share, slot files; a file of before, with every layer's rows, still loads).
 * Uses native/tools/make_tiny_qwen35moe.py (python with numpy + gguf: $COLI_PYTHON, else
 * ../.venv/bin/python, else python3); skipped with a note when it cannot run. */
#include "budget.h"
#include "kv.h"
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"

static const char *python(void) {
    const char *p = getenv("COLI_PYTHON");
    if (p && *p) return p;
    if (access("../.venv/bin/python", X_OK) == 0) return "../.venv/bin/python";
    return "python3";
}

/* Slot s: tokens ids[0..n) from position pos, logits of the last row into lg. */
static int run(model *m, kv_cache *kv, int s, int pos, const int *ids, int n, float *lg) {
    fwd_row rows[16];
    for (int i = 0; i < n; i++) rows[i] = (fwd_row){s, pos + i, ids[i], i == n - 1 ? lg : NULL, NULL, 0, 0, NULL};
    return model_forward(m, kv, rows, n);
}

/* Layers of the tool's default file that attend: every 3rd (full_attention_interval 3). */
static int attention_layers(const model *m) {
    int n = 0;
    for (int l = 0; l < m->c.n_layers; l++) n += (l + 1) % 3 == 0;
    return n;
}

/* Only the attention layers keep K/V: two slots at the whole context hold n_attention x ctx
 * rows of K and V (float32) and the token ids, and the budget's KV share counts the same. */
static void check_kv_bytes(const model *m) {
    const int ctx = 64, n_att = attention_layers(m);
    const size_t row = (size_t)m->c.n_kv_heads * (size_t)(m->c.head_dim_k + m->c.head_dim_v) * sizeof(float);
    const size_t slot = (size_t)ctx * ((size_t)n_att * row + sizeof(int));
    kv_cache kv;
    CHECK(n_att == 1 && m->c.n_layers == 4, "the tool's file: layer 2 of 4 attends");
    CHECK(model_kv_init(m, &kv, 2, ctx) == 0 && kv_reserve(&kv, 0, ctx) == 0 && kv_reserve(&kv, 1, ctx) == 0, "kv");
    CHECK(kv.used == 2 * slot, "KV of two slots %zu, expected %zu", kv.used, 2 * slot);
    CHECK(kv.slots[0].cap * kv_pos_bytes(&kv) == slot, "one slot's KV (SLOTMEM's figure)");
    CHECK(kv_layers(&kv) == n_att, "%d layers keep rows, expected %d", kv_layers(&kv), n_att);
    for (int l = 0; l < m->c.n_layers; l++)
        CHECK((kv.slots[0].k[l] != NULL) == ((l + 1) % 3 == 0), "layer %d's K buffer", l);
    kv_free(&kv);
    mem_budget b;
    char err[512];
    budget_figure(&b, 1L << 20);    /* 1 TiB: every slot's KV fits */
    CHECK(budget_split(&b, m, 2, ctx, 0, -1, err, sizeof err) == 0, "split: %s", err);
    CHECK(b.kv == 2 * slot, "budget's KV share %zu, expected %zu", b.kv, 2 * slot);
    /* drafting 3 rows keeps the trail: three states more, once for every slot */
    const size_t work = b.work;
    budget_figure(&b, 1L << 20);
    b.spec_rows = 3;
    CHECK(budget_split(&b, m, 2, ctx, 0, -1, err, sizeof err) == 0, "split: %s", err);
    CHECK(b.work == work + 3 * model_state_bytes(m), "working buffers with 3 drafted rows %zu, expected %zu + 3 x %zu",
          b.work, work, model_state_bytes(m));
}

/* Bytes of the file at path (-1: none). */
static long file_size(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fclose(f);
    return n;
}

/* Slot s of kv (n_pos > 0, float32) saved holds the attention layers' rows only and loads back;
 * a file of before (every layer's rows, "COLIKV01") loads too, the others' rows skipped; a file
 * of the new layout is refused by a cache that keeps every layer's rows. */
static void check_kv_files(const model *m, kv_cache *kv, int s, const char *dir) {
    char path[160], old_path[160];
    const int n = kv->slots[s].n_pos, L = m->c.n_layers, att = 2;   /* the tool's attention layer */
    const size_t kr = (size_t)kv->k_dim * 4, vr = (size_t)kv->v_dim * 4;
    snprintf(path, sizeof path, "%s/slot.kv", dir);
    snprintf(old_path, sizeof old_path, "%s/old.kv", dir);
    CHECK(kv_save(kv, s, path, m->fingerprint) == 0, "slot file written");
    CHECK(file_size(path) == (long)(32 + (size_t)n * 4 + (size_t)n * (size_t)attention_layers(m) * (kr + vr)),
          "slot file of %ld bytes", file_size(path));
    kv_cache old, k2;
    CHECK(kv_init_kv(&old, 1, kv->ctx, L, kv->k_dim, kv->v_dim) == 0 && kv_reserve(&old, 0, n) == 0, "old cache");
    CHECK(model_kv_init(m, &k2, 2, kv->ctx) == 0 && kv_load(&k2, 0, path, m->fingerprint) == 0, "loaded");
    CHECK(kv_load(&old, 0, path, m->fingerprint) != 0, "a cache of every layer's rows refuses the new layout");
    memcpy(old.slots[0].tokens, kv->slots[s].tokens, sizeof(int) * (size_t)n);
    for (int l = 0; l < L; l++) {       /* the rows a cache of before held; the recurrent ones' junk */
        memset(old.slots[0].k[l], 0x5a, (size_t)n * kr);
        memset(old.slots[0].v[l], 0xa5, (size_t)n * vr);
    }
    memcpy(old.slots[0].k[att], kv->slots[s].k[att], (size_t)n * kr);
    memcpy(old.slots[0].v[att], kv->slots[s].v[att], (size_t)n * vr);
    old.slots[0].n_pos = n;
    CHECK(kv_save(&old, 0, old_path, m->fingerprint) == 0 && kv_load(&k2, 1, old_path, m->fingerprint) == 0,
          "a file of before loads");
    CHECK(kv_load(&k2, 1, old_path, m->fingerprint + 1) != 0, "another model's is refused");
    CHECK(kv_load(&k2, 1, old_path, m->fingerprint) == 0, "and again");
    for (int t = 0; t < 2; t++) {
        const kv_slot *a = &kv->slots[s], *b = &k2.slots[t];
        CHECK(b->n_pos == n && memcmp(a->tokens, b->tokens, sizeof(int) * (size_t)n) == 0, "tokens (%d)", t);
        CHECK(memcmp(a->k[att], b->k[att], (size_t)n * kr) == 0 && memcmp(a->v[att], b->v[att], (size_t)n * vr) == 0,
              "the attention layer's rows (%d)", t);
    }
    kv_free(&old);
    kv_free(&k2);
}

int main(void) {
    char dir[] = "/tmp/coli_hybrid_XXXXXX", path[128], cmd[1024];
    if (!mkdtemp(dir)) return perror("mkdtemp"), 1;
    snprintf(path, sizeof path, "%s/q35.gguf", dir);
    const char *tool = access("tools/make_tiny_qwen35moe.py", R_OK) == 0 ? "tools/make_tiny_qwen35moe.py"
                                                                         : "native/tools/make_tiny_qwen35moe.py";
    snprintf(cmd, sizeof cmd, "%s %s %s >/dev/null 2>&1", python(), tool, path);
    if (system(cmd) != 0) {
        printf("note: %s could not run (python with numpy + gguf): skipped\n", tool);
        return 0;
    }
    model m;
    char err[256];
    expert_opts o;
    memset(&o, 0, sizeof o);
    o.ram_budget = SIZE_MAX;
    o.exact = 1;
    CHECK(model_load(&m, path, &o, err, sizeof err) == 0, "load: %s", err);
    if (fails) return 1;
    kv_cache kv;
    CHECK(model_kv_init(&m, &kv, 3, 64) == 0, "kv");
    CHECK(model_state_bytes(&m) > 0, "a hybrid has a recurrent state");
    const int V = m.c.vocab, a[6] = {5, 17, 42, 99, 7, 11}, b[6] = {5, 17, 43, 99, 7, 11};
    float *l1 = malloc(sizeof(float) * (size_t)V), *l2 = malloc(sizeof(float) * (size_t)V);

    /* slot 0: 4 tokens, then 2 more; slot 1: all 6 at once: the same logits */
    CHECK(run(&m, &kv, 0, 0, a, 4, l1) == 0 && run(&m, &kv, 0, 4, a + 4, 2, l1) == 0, "slot 0 in two turns");
    CHECK(run(&m, &kv, 1, 0, a, 6, l2) == 0, "slot 1 in one");
    CHECK(memcmp(l1, l2, sizeof(float) * (size_t)V) == 0, "two forwards on the state = one forward");

    CHECK(model_resume(&m, &kv, 0, 6) == 6, "the state stands after the whole history");
    CHECK(model_resume(&m, &kv, 0, 5) == 0, "a shorter prefix cannot be kept");
    CHECK(model_resume(&m, &kv, 2, 0) == 0, "an empty slot keeps nothing");

    /* K/V truncated to 4 (as a new turn sharing 4 tokens would): the state is 6 tokens on */
    kv_truncate(&kv, 0, 4);
    CHECK(run(&m, &kv, 0, 4, a + 4, 2, l1) != 0, "continuing from a state of another history is refused");
    CHECK(kv.slots[0].n_pos == 4, "the refused rows are not in the history");
    CHECK(model_resume(&m, &kv, 1, 6) == 6, "slot 1 unaffected");

    /* another history of the same length: the hash tells them apart */
    kv_truncate(&kv, 0, 0);
    CHECK(run(&m, &kv, 0, 0, b, 6, l1) == 0, "slot 0 restarted at position 0");
    kv_truncate(&kv, 0, 0);
    CHECK(run(&m, &kv, 0, 0, a, 6, l1) == 0, "and again");
    CHECK(memcmp(l1, l2, sizeof(float) * (size_t)V) == 0, "a restarted slot computes what a fresh one does");
    kv.slots[0].tokens[2] = 43;     /* same length, other tokens: what a slot file of another turn holds */
    CHECK(model_resume(&m, &kv, 0, 6) == 0, "a history with other tokens does not match the state");
    CHECK(run(&m, &kv, 0, 6, a, 1, l1) != 0, "nor can the forward continue it");

    /* checkpoints: slot 2 keeps its state at 4, runs on to 6, then a turn sharing 5 resumes at 4
     * and continues as a fresh slot; a file round trip brings the checkpoint back */
    CHECK(run(&m, &kv, 2, 0, a, 4, l1) == 0 && model_checkpoint(&m, &kv, 2) == 0, "checkpoint at 4");
    CHECK(run(&m, &kv, 2, 4, a + 4, 2, l1) == 0, "slot 2 on to 6");
    int n_ck = 0;
    CHECK(model_slot_state_bytes(&m, 2, &n_ck) == 2 * model_state_bytes(&m) && n_ck == 1, "state + 1 checkpoint");
    CHECK(model_resume(&m, &kv, 2, 5) == 4, "a turn sharing 5 resumes from the checkpoint at 4");
    kv_truncate(&kv, 2, 4);
    CHECK(run(&m, &kv, 2, 4, a + 4, 2, l1) == 0, "and continues from it");
    CHECK(memcmp(l1, l2, sizeof(float) * (size_t)V) == 0, "as a fresh slot computes");
    snprintf(path, sizeof path, "%s/slot2.rs", dir);
    CHECK(model_state_save(&m, &kv, 2, path, 7) == 0, "state file written");
    model_forget(&m, 2);
    CHECK(model_resume(&m, &kv, 2, 5) == 0, "forgotten: nothing to resume from");
    CHECK(model_state_load(&m, &kv, 2, path, 8) != 0, "another fingerprint is refused");
    CHECK(model_state_load(&m, &kv, 2, path, 7) == 0, "state file read");
    CHECK(model_resume(&m, &kv, 2, 5) == 4, "the loaded checkpoint resumes at 4");

    check_kv_bytes(&m);
    check_kv_files(&m, &kv, 1, dir);

    free(l1);
    free(l2);
    kv_free(&kv);
    model_free(&m);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("note: could not remove %s\n", dir);
    if (fails) {
        printf("test_hybrid: %d failures\n", fails);
        return 1;
    }
    printf("test_hybrid: all passed\n");
    return 0;
}
