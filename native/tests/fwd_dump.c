/* fwd_dump.c — forward driver for numpy comparisons (not a unit test).
 *   fwd_dump MODEL.gguf OUT.f32 ID...   prefill the ids in one batch on slot 0 and write
 *   the float32 logits of every position (n_ids x vocab, row-major) to OUT.f32.
 *   Set FWD_DUMP_SERIAL=1 to forward one token at a time instead, FWD_DUMP_SPLIT=k to forward
 *   the first k ids, then the rest (a prompt in two chunks); EXACT=1 and KV_TYPE as
 *   colibri-engine; FWD_DUMP_EXPERT_MB=N streams the experts from disk within N MiB of RAM.
 *   FWD_DUMP_MTP=T (a file with an MTP block): also the block's logits of every position (the
 *   token after the last: T) to OUT.f32.mtp, and FWD_DUMP_DRAFT=k its k greedy guesses after T,
 *   printed on stdout.
 * Build: make -C native build/fwd_dump */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"

int main(int argc, char **argv) {
    if (argc < 4) {
        fprintf(stderr, "usage: fwd_dump MODEL.gguf OUT.f32 ID...\n");
        return 2;
    }
    model m;
    char err[256];
    expert_opts o;
    memset(&o, 0, sizeof o);
    /* FWD_DUMP_EXPERT_MB=N: the expert store's RAM budget (the rest is read from disk per use) */
    const char *emb = getenv("FWD_DUMP_EXPERT_MB");
    o.ram_budget = emb ? (size_t)atol(emb) << 20 : SIZE_MAX;
    o.exact = getenv("EXACT") && !strcmp(getenv("EXACT"), "1");
    const char *mtp = getenv("FWD_DUMP_MTP");
    o.mtp = mtp != NULL;
    if (model_load(&m, argv[1], &o, err, sizeof err) != 0) {
        fprintf(stderr, "fwd_dump: %s\n", err);
        return 1;
    }
    int n = argc - 3, V = m.c.vocab;
    kv_cache kv;
    /* the engine's KV element type: fp16 unless KV_TYPE=f32 (as colibri-engine) */
    if (model_kv_init(&m, &kv, 1, n + 8) != 0 ||
        kv_set_f16(&kv, kv_type_f16(getenv("KV_TYPE")) != 0) != 0)
        return 1;
    float *lg = malloc(sizeof(float) * (size_t)n * V);
    fwd_row *rows = calloc((size_t)n, sizeof *rows);
    if (!lg || !rows) return 1;
    for (int i = 0; i < n; i++) rows[i] = (fwd_row){0, i, atoi(argv[3 + i]), lg + (size_t)i * V, NULL, 0, 0, NULL};
    int serial = getenv("FWD_DUMP_SERIAL") && atoi(getenv("FWD_DUMP_SERIAL"));
    int split = getenv("FWD_DUMP_SPLIT") ? atoi(getenv("FWD_DUMP_SPLIT")) : 0;
    if (split <= 0 || split >= n) split = n;
    for (int i = 0; i < (serial ? n : 1); i++)
        if (model_forward(&m, &kv, serial ? rows + i : rows, serial ? 1 : split) != 0 ||
            (!serial && split < n && model_forward(&m, &kv, rows + split, n - split) != 0)) {
            fprintf(stderr, "fwd_dump: forward failed\n");
            return 1;
        }
    FILE *f = fopen(argv[2], "wb");
    if (!f || fwrite(lg, sizeof(float), (size_t)n * V, f) != (size_t)n * V || fclose(f) != 0) return 1;
    if (mtp) {
        char path[4096];
        snprintf(path, sizeof path, "%s.mtp", argv[2]);
        const int k = getenv("FWD_DUMP_DRAFT") ? atoi(getenv("FWD_DUMP_DRAFT")) : 0;
        int drafts[8];
        if (!m.c.n_mtp || model_mtp_logits(&m, &kv, 0, atoi(mtp), lg) != 0 || !(f = fopen(path, "wb")) ||
            fwrite(lg, sizeof(float), (size_t)n * V, f) != (size_t)n * V || fclose(f) != 0 || k < 0 || k > 8 ||
            kv_reserve(&kv, 0, n + k) != 0 || model_mtp_draft(&m, &kv, 0, atoi(mtp), k, drafts) != k) {
            fprintf(stderr, "fwd_dump: the MTP block's logits or drafts failed\n");
            return 1;
        }
        for (int i = 0; i < k; i++) printf("%d%c", drafts[i], i + 1 < k ? ' ' : '\n');
    }
    free(lg);
    free(rows);
    kv_free(&kv);
    model_free(&m);
    return 0;
}
