/* test_hybrid.c — a hybrid model's per-slot recurrent state (qwen35moe): the forward continues a
 * slot only from the state of exactly its history, model_resume says how much of a history a new
 * turn may keep (the live state or a checkpoint, also through the state file), and a slot that
 * restarts at position 0 computes what a fresh slot does.
 * Uses native/tools/make_tiny_qwen35moe.py (python with numpy + gguf: $COLI_PYTHON, else
 * ../.venv/bin/python, else python3); skipped with a note when it cannot run. */
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
