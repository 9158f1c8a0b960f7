/* bench_fwd.c — forward-pass timing (not a test): decode steps of B rows (B slots, one
 * row each, after a short prefill) and one prefill chunk of P rows.
 * usage: bench_fwd MODEL [B=8] [steps=32] [P=256] [ctx=16]  (ctx: prompt tokens per slot before decode)
 * Prints wall and process CPU time per step; compare CPU time on a loaded machine. */
#include "model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/resource.h>

static double now(clockid_t c) {
    struct timespec ts;
    clock_gettime(c, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int B = argc > 2 ? atoi(argv[2]) : 8, steps = argc > 3 ? atoi(argv[3]) : 32, PR = argc > 4 ? atoi(argv[4]) : 256;
    int CTX0 = argc > 5 ? atoi(argv[5]) : 16;
    model m;
    char err[512];
    if (model_load(&m, argv[1], NULL, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    int S = B > 1 ? B : 1;
    kv_cache kv;
    /* the engine's KV element type: fp16 unless KV_TYPE=f32 */
    if (model_kv_init(&m, &kv, S + 1, 4096) != 0 ||
        kv_set_f16(&kv, kv_type_f16(getenv("KV_TYPE")) != 0) != 0)
        return 1;
    float *logits = malloc(sizeof(float) * (size_t)m.c.vocab * (size_t)(B > PR ? B : PR));
    int NR = B > PR ? B : PR;
    if (NR < CTX0) NR = CTX0;
    fwd_row *rows = calloc((size_t)NR, sizeof *rows);
    /* prefill CTX0 tokens per slot */
    for (int s = 0; s < S; s++) {
        for (int i = 0; i < CTX0; i++) rows[i] = (fwd_row){s, i, (100 + (7 * i + s) % 4000) % m.c.vocab, i == CTX0 - 1 ? logits : NULL, NULL, 0, 0, NULL};
        if (model_forward(&m, &kv, rows, CTX0) != 0) return 1;
    }
    struct rusage ru0, ru1;
    getrusage(RUSAGE_THREAD, &ru0);
    perf_counters pd = m.perf;
    double w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    for (int t = 0; t < steps; t++) {
        for (int s = 0; s < B; s++)
            rows[s] = (fwd_row){s, kv.slots[s].n_pos, (200 + (t * 31 + s * 17) % 1000) % m.c.vocab, logits + (size_t)s * m.c.vocab, NULL, 0, 0, NULL};
        if (model_forward(&m, &kv, rows, B) != 0) return 1;
    }
    double w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
    getrusage(RUSAGE_THREAD, &ru1);
    printf("decode B=%d: %.2f ms/step wall (%.1f tok/s), %.2f ms CPU/step, caller preempted %.0f/s\n", B,
           (w1 - w0) * 1e3 / steps, B * steps / (w1 - w0), (c1 - c0) * 1e3 / steps,
           (ru1.ru_nivcsw - ru0.ru_nivcsw) / (w1 - w0));
    printf("  per step, wall ms: attn %.2f, experts %.2f, other dense %.2f, head %.2f\n",
           (m.perf.t_attn - pd.t_attn) * 1e3 / steps, (m.perf.t_emm - pd.t_emm) * 1e3 / steps,
           (m.perf.t_dense - pd.t_dense) * 1e3 / steps, (m.perf.t_head - pd.t_head) * 1e3 / steps);
    for (int i = 0; i < PR; i++) rows[i] = (fwd_row){S, i, (300 + (i * 13) % 2000) % m.c.vocab, i == PR - 1 ? logits : NULL, NULL, 0, 0, NULL};
    perf_counters pc0 = m.perf;
    w0 = now(CLOCK_MONOTONIC), c0 = now(CLOCK_PROCESS_CPUTIME_ID);
    if (model_forward(&m, &kv, rows, PR) != 0) return 1;
    w1 = now(CLOCK_MONOTONIC), c1 = now(CLOCK_PROCESS_CPUTIME_ID);
    printf("prefill P=%d: %.1f tok/s wall, %.1f tok/s per CPU-second (wall ms: attn %.1f, experts %.1f, "
           "other dense %.1f, head %.1f)\n", PR, PR / (w1 - w0), PR / (c1 - c0), (m.perf.t_attn - pc0.t_attn) * 1e3,
           (m.perf.t_emm - pc0.t_emm) * 1e3, (m.perf.t_dense - pc0.t_dense) * 1e3, (m.perf.t_head - pc0.t_head) * 1e3);
    model_free(&m);
    kv_free(&kv);
    free(logits);
    free(rows);
    return 0;
}
