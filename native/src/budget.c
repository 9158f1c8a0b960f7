/* budget.c — the memory budget (budget.h).
 *
 * The figure, when none is given: the smallest memory limit of the process's cgroup and its
 * ancestors (v1 memory.limit_in_bytes of the memory controller's hierarchy, v2 memory.max;
 * the path from /proc/self/cgroup) less the anonymous memory the other processes in that cgroup
 * hold at start (v1 total_rss, v2 anon, less this process's resident set), or MemAvailable at start (plus what the process already
 * holds) when that is smaller or there is no limit; less a margin of 5 % of it, at least
 * 16 MiB and at most 1 GiB, for what the split cannot see (other processes in the cgroup, the
 * kernel's own charges, allocator slack).
 *
 * The split, in this order: the dense weights and the process (measured: resident memory after
 * loading with no expert read, plus the dense bytes still used in place from the file mapping,
 * which become page cache as they are touched; of an untied token embedding, only the rows
 * tokens touch); the working buffers (the prefill chunk's rows,
 * the per-slot logits and routing counts, attention scratch, the experts held at once from disk
 * and the I/O lanes' landing buffers); every slot's KV at its context (or what is left, which
 * then bounds the contexts requests get); the expert cache, what remains. The cache also
 * borrows the KV share's unused part (KV grows lazily), and gives it back as KV grows
 * (budget_lend). */
#include "budget.h"

#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "experts.h"
#include "io.h"
#include "model_impl.h"
#include "pool.h"

#define MIB ((size_t)1 << 20)
#define NO_LIMIT ((uint64_t)1 << 60)     /* cgroup v1 writes ~2^63 for "no limit" */

static int read_u64(const char *path, uint64_t *v) {
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    char buf[64] = {0};
    int ok = fgets(buf, sizeof buf, f) != NULL;
    fclose(f);
    if (!ok) return -1;
    if (!strncmp(buf, "max", 3)) {
        *v = UINT64_MAX;
        return 0;
    }
    char *end;
    unsigned long long x = strtoull(buf, &end, 10);
    if (end == buf) return -1;
    *v = x;
    return 0;
}

/* The value of `key` in a cgroup's memory.stat (0 when absent). */
static uint64_t stat_u64(const char *dir, const char *key) {
    char p[1300], line[256];
    snprintf(p, sizeof p, "%s/memory.stat", dir);
    FILE *f = fopen(p, "r");
    if (!f) return 0;
    const size_t kl = strlen(key);
    unsigned long long v = 0;
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ' ') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* The limiting cgroup: its limit and the anonymous memory charged to it (its whole subtree). */
typedef struct { uint64_t limit, anon; } cg_limit;

/* The smallest `file` limit from base/path up to base (a cgroup's ancestors limit it too), with
 * that cgroup's anonymous memory (memory.stat `anon_key`). */
static cg_limit limit_up(const char *base, const char *path, const char *file, const char *anon_key) {
    char dir[1024], d[1100], p[1200];
    snprintf(dir, sizeof dir, "%s", path);
    cg_limit best = {UINT64_MAX, 0};
    uint64_t v;
    for (;;) {
        snprintf(d, sizeof d, "%s%s", base, dir);
        snprintf(p, sizeof p, "%s/%s", d, file);
        if (read_u64(p, &v) == 0 && v < best.limit) best = (cg_limit){v, stat_u64(d, anon_key)};
        char *slash = strrchr(dir, '/');
        if (!slash || !dir[0]) break;
        *slash = 0;
    }
    return best;
}

/* The memory limit of this process's cgroup (limit UINT64_MAX when none). */
static cg_limit cgroup_limit(void) {
    cg_limit best = {UINT64_MAX, 0};
    FILE *f = fopen("/proc/self/cgroup", "r");
    if (!f) return best;
    char line[1200];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *c1 = strchr(line, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2) continue;
        *c1 = *c2 = 0;
        const char *ctrl = c1 + 1, *path = !strcmp(c2 + 1, "/") ? "" : c2 + 1;
        cg_limit v = {UINT64_MAX, 0};
        if (strstr(ctrl, "memory")) v = limit_up("/sys/fs/cgroup/memory", path, "memory.limit_in_bytes", "total_rss");
        else if (!strcmp(line, "0") && !ctrl[0]) {
            v = limit_up("/sys/fs/cgroup", path, "memory.max", "anon");
            cg_limit u = limit_up("/sys/fs/cgroup/unified", path, "memory.max", "anon");
            if (u.limit < v.limit) v = u;
        }
        if (v.limit < best.limit) best = v;
    }
    fclose(f);
    if (best.limit >= NO_LIMIT) best.limit = UINT64_MAX;
    return best;
}

static uint64_t meminfo_kb(const char *key) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long v = 0;
    const size_t kl = strlen(key);
    while (fgets(line, sizeof line, f))
        if (!strncmp(line, key, kl) && line[kl] == ':') {
            v = strtoull(line + kl + 1, NULL, 10);
            break;
        }
    fclose(f);
    return v;
}

/* Resident bytes of this process now. */
static size_t rss_now(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long long size = 0, res = 0;
    if (f) {
        if (fscanf(f, "%llu %llu", &size, &res) != 2) res = 0;
        fclose(f);
    }
    return (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
}

void budget_figure(mem_budget *b, long mb) {
    memset(b, 0, sizeof *b);
    /* allocations of 256 KiB and more are mapped apart and unmapped on free: what the expert
     * cache, the KV or the scratch give back leaves the process (glibc's default raises this
     * threshold as large blocks are freed, and the heap keeps them) */
    mallopt(M_MMAP_THRESHOLD, 256 * 1024);
    if (mb >= 0) {
        b->total = (size_t)mb * MIB;
        snprintf(b->source, sizeof b->source, "MEM_BUDGET_MB");
        return;
    }
    const cg_limit cgl = cgroup_limit();
    const size_t own = rss_now();
    /* the other processes of a limited cgroup (a whole site run inside one: web, bridge, worker)
     * hold their anonymous memory in it; what they hold at start is theirs, not ours */
    const uint64_t others = cgl.limit != UINT64_MAX && cgl.anon > own ? cgl.anon - own : 0;
    const uint64_t cg = cgl.limit != UINT64_MAX && cgl.limit > others ? cgl.limit - others : cgl.limit;
    const uint64_t avail = meminfo_kb("MemAvailable") * 1024 + own;
    b->limit = (size_t)(cg < avail ? cg : avail);
    b->others = cg < avail ? (size_t)others : 0;
    snprintf(b->source, sizeof b->source, "%s", cg < avail ? "cgroup" : "MemAvailable");
    size_t margin = b->limit / 20;
    if (margin < 16 * MIB) margin = 16 * MIB;
    if (margin > 1024 * MIB) margin = 1024 * MIB;
    b->margin = margin;
    b->total = b->limit > margin ? b->limit - margin : 0;
}

/* What an untied token-embedding table used in place takes: it is read a row per token, so only
 * the pages of the tokens seen become page cache (two pages a row at most), clean file pages the
 * kernel reclaims before a cgroup's limit bites. Counted as 8,192 distinct tokens' pages, not the
 * table's size: gpt-oss-20b's is 615 MB, a third of what 4 GB leave the expert cache. */
#define EMBD_ROWS_COUNTED 8192

/* Bytes of m's matrices used in place from the file mapping (not packed into owned copies). */
static size_t mapped_dense(const model *m) {
    const uint8_t *lo = m->g.map, *hi = lo + m->g.size;
    size_t sum = 0;
    const qmat *io[2] = {&m->tok_embd, &m->output};
    for (int i = 0; i < 2; i++) {
        if (i == 1 && m->output.data == m->tok_embd.data) break;
        if (!(io[i]->data >= lo && io[i]->data < hi)) continue;
        size_t bytes = (size_t)io[i]->rows * io[i]->row_bytes;
        const int per_token = i == 0 && m->output.data != m->tok_embd.data;
        const size_t touched = (size_t)EMBD_ROWS_COUNTED * 2 * 4096;
        if (per_token && !m->exact && bytes > touched) bytes = touched;
        sum += bytes;
    }
    for (int l = 0; l < m->c.n_layers; l++) {
        const layer_w *L = &m->layers[l];
        const qmat *ms[] = {&L->q, &L->k, &L->v, &L->o, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                            &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->ssm_qkv, &L->ssm_z,
                            &L->ssm_beta, &L->ssm_alpha, &L->ssm_out};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (ms[i]->rows > 0 && ms[i]->data >= lo && ms[i]->data < hi) sum += (size_t)ms[i]->rows * ms[i]->row_bytes;
    }
    return sum;
}

/* Forward buffers of one prefill row (model_impl.h's scratch in floats; the quantized
 * activations, ~1.25 bytes a value, of the layer input, each routed expert's gathered input
 * and its down input), with a quarter for what the estimate does not itemize. The dense FFN's
 * width counts only where a layer has one. */
static size_t row_bytes(const model_config *c) {
    const size_t d = (size_t)c->d_model, K = (size_t)(c->n_experts ? c->top_k : 0), X = (size_t)c->d_expert;
    const size_t ff = c->n_moe_rows < c->n_layers ? (size_t)c->d_ff : 0, S = (size_t)c->d_shexp;
    const size_t fl = 4 * d + (size_t)c->n_heads * ((size_t)c->head_dim_k + (size_t)c->head_dim_v) +
                      (size_t)c->n_kv_heads * ((size_t)c->head_dim_k + (size_t)c->head_dim_v) + (size_t)c->rope_dim +
                      (size_t)c->n_experts + 4 * K + K * (X + d) + 2 * ff + S + d;
    /* a hybrid's recurrent layers (conv channels, z, output, beta, alpha) and gated attention (q|gate, gate) */
    const size_t vd = (size_t)c->ssm_v_heads * (size_t)c->ssm_head;
    const size_t gdn = c->ssm_v_heads ? 2 * (size_t)c->ssm_k_heads * (size_t)c->ssm_head + 3 * vd + 2 * (size_t)c->ssm_v_heads +
                                            3 * (size_t)c->n_heads * (size_t)c->head_dim_k : 0;
    const size_t q8 = (d + K * (d + X) + ff + S) * 5 / 4;
    return ((fl + gdn) * 4 + q8) * 5 / 4;
}

/* What a forward holds for each of all its rows: the residual stream, the branch input and
 * output, RoPE tables, router logits and selections, the shared expert's output, the layer
 * input's quantized copy (with a quarter of slack). */
static size_t whole_row_bytes(const model_config *c) {
    const size_t d = (size_t)c->d_model, K = (size_t)(c->n_experts ? c->top_k : 0);
    const size_t S = c->d_shexp ? (size_t)c->d_shexp + d : 0;
    const size_t fl = 3 * d + (size_t)c->rope_dim + (size_t)c->n_experts + 4 * K + S;
    return (fl * 4 + d * 5 / 4) * 5 / 4;
}

/* A quantized activation buffer of cap values: the floats, the int8 copy and four per-block
 * figures (qact_prepare), six aligned allocations. */
static size_t qact_bytes(size_t cap) {
    if (cap < 64) cap = 64;
    return cap * 4 + cap + 4 * (cap / 32 + 1) * 4 + 6 * 80;
}

/* What every expert keeps between groups: its gate/up input of keep rows x d_model and its down
 * input of keep rows x d_expert (moe.c trim_inputs frees bigger ones after each group; a
 * group's own, up to a chunk's pairs, are counted in row_bytes). */
static size_t kept_bytes(const model_config *c, int keep) {
    if (!c->n_experts) return 0;
    const size_t k = (size_t)(keep > 0 ? keep : 1);
    return (size_t)c->n_experts * (qact_bytes(k * (size_t)c->d_model) + qact_bytes(k * (size_t)c->d_expert));
}

/* The working buffers: `rows`-row prefills run `chunk` rows at a time, n_slots decoding rows,
 * hold experts at once from disk. */
static size_t work_bytes(const model *m, int n_slots, int ctx, int rows_all, int chunk, int hold, int spec_rows) {
    const model_config *c = &m->c;
    const size_t rows = (size_t)(chunk > n_slots ? chunk : n_slots);
    const size_t per_slot = (size_t)c->vocab * 8 + (size_t)c->n_moe_rows * (size_t)c->n_experts * 4 +
                            model_state_bytes(m) * (1 + RS_CKPTS);   /* a hybrid's state, its checkpoints */
    const size_t once = (size_t)c->vocab * 8 + (size_t)ctx * 8 + (size_t)pool_threads() * ATT_G * (size_t)ctx * 4;
    const size_t held = (size_t)(2 * hold + io_lanes() + 1) * es_expert_bytes(m->es);
    const size_t trail = (size_t)spec_rows * model_state_bytes(m);     /* one, whichever slot drafts */
    return rows * row_bytes(c) + (size_t)rows_all * whole_row_bytes(c) + (size_t)n_slots * per_slot + once + held +
           kept_bytes(c, n_slots) + trail;
}

/* Prefill rows per forward: the largest power of two up to 8,192 and the context whose whole-row
 * buffers take at most a sixteenth of the budget, at least the chunk. A layer of a forward reads
 * each expert its rows select once, so a prompt of that many tokens reads each once a layer. */
static int pick_rows(const model *m, size_t total, int ctx, int chunk) {
    int r = 8192;
    while (r > chunk && ((size_t)r * whole_row_bytes(&m->c) > total / 16 || r > ctx)) r /= 2;
    return r;
}

/* Rows a block of the forward takes at once: the largest power of two up to 1,024 whose
 * buffers take at most a sixteenth of the budget, at least 32. */
static int pick_chunk(const model *m, size_t total, int ctx) {
    int ch = 1024;
    while (ch > 32 && ((size_t)ch * row_bytes(&m->c) > total / 16 || ch > ctx)) ch /= 2;
    return ch;
}

/* Experts one acquisition holds at once from disk: every slot's decode selections (up to the
 * lookahead's four rows), at least two tokens' worth; the next group is read while one computes. */
static int pick_hold(const model_config *c, int n_slots) {
    const int K = c->top_k > 0 ? c->top_k : 1, rows = n_slots < 4 ? n_slots : 4;
    const int h = K * (rows > 2 ? rows : 2);
    return h < c->n_experts ? h : c->n_experts;
}

static double mb(size_t x) { return (double)x / (double)MIB; }

static int refuse(const mem_budget *b, size_t one_kv, int ctx, char *err, size_t errlen) {
    snprintf(err, errlen,
             "memory budget %.0f MB (%s) is too small: the dense weights and the process take %.0f MB, the "
             "working buffers %.0f MB and one slot's KV at CTX=%d %.0f MB (%.0f MB together); raise "
             "MEM_BUDGET_MB or the memory limit, or lower CTX",
             mb(b->total), b->source, mb(b->dense), mb(b->work), ctx, mb(one_kv), mb(b->dense + b->work + one_kv));
    return -1;
}

int budget_split(mem_budget *b, const model *m, int n_slots, int ctx, int kv_f16, long expert_mb, char *err,
                 size_t errlen) {
    const model_config *c = &m->c;
    b->chunk = pick_chunk(m, b->total, ctx);
    /* a slot's KV: the full-attention layers' rows for every position; a sliding-window layer's
     * buffer (two windows, or a window and a prefill chunk) and its checkpoint (a window); a
     * hybrid's recurrent layers none (their state counts in the working buffers) */
    const size_t row = (size_t)c->n_kv_heads * ((size_t)c->head_dim_k + (size_t)c->head_dim_v) * (kv_f16 ? 2 : 4);
    size_t n_full = 0, win_bytes = 0;
    for (int l = 0; l < c->n_layers + c->n_mtp; l++) {
        const size_t w = (size_t)m->layers[l].window;
        if (m->layers[l].rec_row >= 0) continue;
        if (!w) {
            n_full++;
            continue;
        }
        size_t rows = 2 * w > w - 1 + (size_t)b->chunk ? 2 * w : w - 1 + (size_t)b->chunk;
        if (rows > (size_t)ctx) rows = (size_t)ctx;
        win_bytes += (rows + w - 1) * row;
    }
    /* an MTP block also keeps the trunk's last hidden state of every position (model_mtp_draft) */
    const size_t pos = n_full * row + sizeof(int) + (c->n_mtp ? (size_t)c->d_model * sizeof(float) : 0);
    const size_t one_kv = (size_t)ctx * pos + win_bytes, all_kv = one_kv * (size_t)n_slots;
    b->experts_all = es_all_bytes(m->es);
    b->dense = rss_now() + mapped_dense(m);
    b->rows = pick_rows(m, b->total, ctx, b->chunk);
    b->hold = c->n_experts ? pick_hold(c, n_slots) : 0;
    b->keep = n_slots;
    b->work = work_bytes(m, n_slots, ctx, b->rows, b->chunk, b->hold, b->spec_rows);
    const size_t fixed = b->dense + b->work;
    if (fixed + one_kv > b->total) return refuse(b, one_kv, ctx, err, errlen);
    b->expert_override = expert_mb >= 0;
    const size_t left = b->total - fixed;
    if (b->expert_override) {
        b->experts = (size_t)expert_mb * MIB;
        const size_t room = left > b->experts ? left - b->experts : 0;
        b->kv = room < one_kv ? one_kv : room < all_kv ? room : all_kv;
    } else {
        b->kv = left < all_kv ? left : all_kv;
        b->experts = left - b->kv;
    }
    /* auto: all of them fit, so all are read at start (EXPERT_RAM_MB keeps its lazy cache) */
    if (!b->expert_override && b->experts >= b->experts_all) b->experts = SIZE_MAX, b->hold = 0;
    return 0;
}

int budget_apply(const mem_budget *b, model *m, long pin_mb) {
    const size_t pin = pin_mb < 0 ? b->experts : (size_t)pin_mb * MIB;
    m->priv->part_rows = b->chunk;
    m->priv->keep_rows = b->keep;
    return es_set_budget(m->es, b->experts, pin, b->hold);
}

void budget_lend(const mem_budget *b, model *m, kv_cache *kv) {
    /* EXPERT_RAM_MB is a figure the caller chose for the experts: it is kept as given */
    const int on = b && kv && m->es && b->experts != SIZE_MAX && b->kv && !b->expert_override;
    es_borrow(m->es, on ? &kv->used : NULL, on ? b->kv : 0);
    if (kv) kv_set_reclaim(kv, on ? es_kv_room : NULL, on ? m->es : NULL);
}

int budget_json(const mem_budget *b, char *out, size_t cap) {
    const size_t ex = b->experts == SIZE_MAX ? b->experts_all : b->experts;
    return snprintf(out, cap,
                    "\"budget_mb\":%.1f,\"source\":\"%s\",\"limit_mb\":%.1f,\"others_mb\":%.1f,\"margin_mb\":%.1f,\"dense_mb\":%.1f,"
                    "\"kv_mb\":%.1f,\"work_mb\":%.1f,\"experts_mb\":%.1f,\"experts_borrowable_mb\":%.1f,\"experts_all_mb\":%.1f,"
                    "\"experts_resident\":%s,\"expert_override\":%s,\"prefill_rows\":%d,\"prefill_chunk\":%d",
                    mb(b->total), b->source, mb(b->limit), mb(b->others), mb(b->margin), mb(b->dense), mb(b->kv), mb(b->work),
                    mb(ex), mb(b->experts == SIZE_MAX || b->expert_override ? 0 : b->kv), mb(b->experts_all), b->experts == SIZE_MAX ? "true" : "false",
                    b->expert_override ? "true" : "false", b->rows, b->chunk);
}
