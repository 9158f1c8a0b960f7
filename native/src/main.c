/* main.c — colibri-engine: arguments and environment, then one of
 *   serve mode (SERVE=1 SERVE_BATCH=1: the mux protocol, server.c),
 *   one-shot generation (-m MODEL -p TEXT),
 *   --tokenize FILE / --detokenize "ID ID ..." (tokenizer tools for tests).
 * Exit codes: 0 ok, 1 model/tokenizer load failure, 2 bad arguments or settings. */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "budget.h"
#include "gguf.h"
#include "kv.h"
#include "io.h"
#include "model.h"
#include "sampler.h"
#include "server.h"
#include "telemetry.h"
#include "tokenizer.h"
#include "utf8stream.h"

#define MAX_SLOTS 64
/* The model file is refused at load (unsupported or invalid: the line before says what): the
 * same file fails the same way, so a supervisor reports it instead of restarting. */
#define EXIT_REFUSED 3

static void usage(FILE *f) {
    fprintf(f,
        "usage:\n"
        "  SERVE=1 SERVE_BATCH=1 [SNAP=model.gguf|dir] colibri-engine [--model PATH] [--slots N] [--ctx N]\n"
        "  colibri-engine -m MODEL.gguf -p TEXT [-n 64] [-t TEMP] [--top-p P] [--seed S] [--ctx N]\n"
        "  colibri-engine -m MODEL.gguf --tokenize FILE\n"
        "  colibri-engine -m MODEL.gguf --detokenize \"ID ID ...\"\n"
        "options: --threads N (else OMP_NUM_THREADS), --mem-budget MB (else MEM_BUDGET_MB, else the\n"
        "         cgroup's limit or MemAvailable less a margin); see native/README.md for the environment\n");
}

/* Strict integer parse of a whole string; 0 ok. */
static int parse_long(const char *s, long *out) {
    if (!s || !*s) return -1;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (*end || errno) return -1;
    *out = v;
    return 0;
}

static int parse_double(const char *s, double *out) {
    if (!s || !*s) return -1;
    char *end;
    double v = strtod(s, &end);
    if (*end) return -1;
    *out = v;
    return 0;
}

/* Integer setting from a flag (wins) or the environment variable env (may be NULL);
 * exit 2 when out of range. */
static long int_setting(const char *flag_val, const char *env, long def, long lo, long hi,
                        const char *what) {
    const char *s = flag_val ? flag_val : env ? getenv(env) : NULL;
    if (!s || !*s) return def;
    long v;
    if (parse_long(s, &v) != 0 || v < lo || v > hi) {
        fprintf(stderr, "colibri-engine: %s must be an integer in %ld..%ld (got '%s')\n", what, lo, hi, s);
        exit(2);
    }
    return v;
}

static int env_is(const char *name, const char *val) {
    const char *s = getenv(name);
    return s && !strcmp(s, val);
}

/* SNAP may name the .gguf or a directory holding exactly one. 0 ok, else err set. */
static int resolve_model(const char *p, char *out, size_t cap, char *err, size_t errlen) {
    struct stat st;
    if (stat(p, &st) != 0) {
        snprintf(err, errlen, "model path %s: %s", p, strerror(errno));
        return -1;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(out, cap, "%s", p);
        return 0;
    }
    DIR *d = opendir(p);
    if (!d) {
        snprintf(err, errlen, "model directory %s: %s", p, strerror(errno));
        return -1;
    }
    int found = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 5 && !strcmp(e->d_name + n - 5, ".gguf")) {
            if (found++ == 0) snprintf(out, cap, "%s/%s", p, e->d_name);
        }
    }
    closedir(d);
    if (found != 1) {
        snprintf(err, errlen, "model directory %s holds %d .gguf files (need exactly one)", p, found);
        return -1;
    }
    return 0;
}

static char *read_file(const char *path, size_t *len) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 65536, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        n += fread(buf + n, 1, cap - n, f);
        if (n < cap) break;
        char *nb = realloc(buf, cap *= 2);
        if (!nb) { free(buf); buf = NULL; }
        else buf = nb;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) { free(buf); return NULL; }
    *len = n;
    return buf;
}

/* ---------------------------------------------------------------- tokenizer tools */

/* Writes a token's bytes to stdout through the UTF-8 sanitizer u. */
static void put_token(const tokenizer *t, utf8s *u, int id) {
    int plen;
    const char *piece = tok_piece(t, id, &plen);
    int cap = 3 * (plen + 3);
    char *out = malloc((size_t)cap);
    int n = out ? utf8s_push(u, piece, plen, out, cap) : -1;
    if (n > 0) fwrite(out, 1, (size_t)n, stdout);
    free(out);
}

static int load_tokenizer_only(const char *path, gguf_file *g, tokenizer **t) {
    char err[256];
    if (gguf_open(g, path) != 0) {
        fprintf(stderr, "colibri-engine: %s\n", g->err);
        return 1;
    }
    *t = tok_load(g, err, sizeof err);
    if (!*t) {
        fprintf(stderr, "colibri-engine: %s\n", err);
        gguf_close(g);
        return 1;
    }
    return 0;
}

static int run_tokenize(const char *model_path, const char *file) {
    size_t len;
    char *text = read_file(file, &len);
    if (!text) {
        fprintf(stderr, "colibri-engine: cannot read %s: %s\n", file, strerror(errno));
        return 2;
    }
    gguf_file g;
    tokenizer *t;
    if (load_tokenizer_only(model_path, &g, &t)) { free(text); return 1; }
    int max = (int)(len < INT_MAX - 2 ? len + 1 : INT_MAX - 2);   /* BPE never yields more ids than bytes */
    int *ids = malloc(((size_t)max + 1) * sizeof *ids);
    int n = ids ? tok_encode(t, text, len, ids, max) : -1;
    int rc = 0;
    if (n < 0) {
        fprintf(stderr, "colibri-engine: out of memory while tokenizing\n");
        rc = 1;
    } else {
        if (n > max) n = max;
        for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
        printf("\n");
    }
    free(ids);
    free(text);
    tok_free(t);
    gguf_close(&g);
    return rc;
}

static int run_detokenize(const char *model_path, const char *list) {
    gguf_file g;
    tokenizer *t;
    if (load_tokenizer_only(model_path, &g, &t)) return 1;
    int vocab = tok_n_vocab(t), rc = 0;
    utf8s u;
    utf8s_init(&u);
    const char *p = list;
    for (;;) {
        while (*p == ' ' || *p == '\t' || *p == '\n' || *p == ',') p++;
        if (!*p) break;
        char *end;
        errno = 0;
        long id = strtol(p, &end, 10);
        if (end == p || errno || id < 0 || id >= vocab) {
            fprintf(stderr, "colibri-engine: bad token id near '%.20s' (vocab %d)\n", p, vocab);
            rc = 2;
            break;
        }
        p = end;
        put_token(t, &u, (int)id);
    }
    char tail[8];
    int n = utf8s_flush(&u, tail, (int)sizeof tail);
    if (n > 0) fwrite(tail, 1, (size_t)n, stdout);
    fflush(stdout);
    tok_free(t);
    gguf_close(&g);
    return rc;
}

/* ---------------------------------------------------------------- one-shot generation */

static int run_oneshot(model *m, const char *prompt, int n_gen, double temp, double top_p,
                       uint64_t seed, int ctx, int kv_f16, const mem_budget *mb) {
    kv_cache kv;
    if (model_kv_init(m, &kv, 1, ctx) != 0 || kv_set_f16(&kv, kv_f16) != 0) {
        fprintf(stderr, "colibri-engine: out of memory for the KV cache\n");
        return 1;
    }
    kv_set_budget(&kv, mb->kv);
    budget_lend(mb, m, &kv);
    const int chunk = mb->rows;
    int vocab = m->c.vocab, rc = 0;
    int *ids = malloc((size_t)ctx * sizeof *ids);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    void *scratch = malloc((size_t)vocab * 8);
    fwd_row *rows = calloc((size_t)chunk, sizeof *rows);
    if (!ids || !logits || !scratch || !rows) {
        fprintf(stderr, "colibri-engine: out of memory\n");
        rc = 1;
        goto out;
    }
    int n = tok_encode(m->tok, prompt, strlen(prompt), ids, ctx - 1);
    const int room = kv_room(&kv, 0) < ctx ? kv_room(&kv, 0) : ctx;    /* the KV share's positions */
    if (n <= 0 || n > room - 2) {
        fprintf(stderr, "colibri-engine: prompt has %d tokens (need 1..%d%s)\n", n, room - 2,
                room < ctx ? ", the KV share of the memory budget" : "");
        rc = 2;
        goto out;
    }
    if (n_gen > ctx - n - 1) n_gen = ctx - n - 1;
    rng_state rng;
    rng_seed(&rng, seed);
    utf8s u;
    utf8s_init(&u);

    double t0 = now_s();
    if (prefill_tail(m, &kv, 0, ids, 0, n, logits, NULL, 0, 0, rows, chunk) != 0) {
        fprintf(stderr, "colibri-engine: prefill failed\n");
        rc = 1;
        goto out;
    }
    double t1 = now_s();
    es_io_stats io0, io1;
    es_io(m->es, &io0);
    const perf_counters pf0 = m->perf;
    const double idle0 = io_idle_s();
    int emitted = 0;
    while (emitted < n_gen) {
        int tok = sample_token(logits, vocab, (float)temp, (float)top_p, &rng, scratch, NULL);
        if (tok_is_eog(m->tok, tok)) break;
        emitted++;
        put_token(m->tok, &u, tok);
        fflush(stdout);
        if (emitted == n_gen) break;
        fwd_row r = { .slot = 0, .pos = kv.slots[0].n_pos, .token = tok, .logits = logits };
        if (kv_reserve(&kv, 0, r.pos + 1) == KV_OVER_BUDGET) break;     /* a length limit */
        if (kv_reserve(&kv, 0, r.pos + 1) != 0 || model_forward(m, &kv, &r, 1) != 0) {
            fprintf(stderr, "colibri-engine: forward failed\n");
            rc = 1;
            break;
        }
    }
    char tail[8];
    int k = utf8s_flush(&u, tail, (int)sizeof tail);
    if (k > 0) fwrite(tail, 1, (size_t)k, stdout);
    printf("\n");
    fflush(stdout);
    double t2 = now_s();
    fprintf(stderr, "prompt tokens: %d | prefill: %.2f tok/s | decode: %d tokens, %.2f tok/s\n", n,
            t1 > t0 ? n / (t1 - t0) : 0.0, emitted, t2 > t1 ? emitted / (t2 - t1) : 0.0);
    es_io(m->es, &io1);
    const double steps = emitted > 1 ? emitted - 1 : 1;     /* decode forwards */
    fprintf(stderr, "experts per decode token: disk %.1f MB, ideal %.1f MB, hit %.1f %%, stall %.1f ms, "
                    "lookahead %llu of %llu used\n",
            (double)(io1.disk_bytes - io0.disk_bytes) / 1e6 / steps, (double)(io1.ideal_bytes - io0.ideal_bytes) / 1e6 / steps,
            io1.acquisitions > io0.acquisitions
                ? 100.0 * (double)(io1.hits - io0.hits) / (double)(io1.acquisitions - io0.acquisitions) : 100.0,
            1e3 * (io1.stall_s - io0.stall_s) / steps, (unsigned long long)(io1.ahead_used - io0.ahead_used),
            (unsigned long long)(io1.ahead_issued - io0.ahead_issued));
    /* Where a decode token's time goes: the head and attention run with the I/O lanes idle unless
     * a lookahead is in flight, so they bound what streaming can overlap. */
    fprintf(stderr, "time per decode token: %.1f ms | head %.1f ms, attention %.1f ms, experts %.1f ms, "
                    "expert wait %.1f ms\n", 1e3 * (t2 - t1) / steps, 1e3 * (m->perf.t_head - pf0.t_head) / steps,
            1e3 * (m->perf.t_attn - pf0.t_attn) / steps, 1e3 * (m->perf.t_emm - pf0.t_emm) / steps,
            1e3 * (m->perf.t_edisk - pf0.t_edisk) / steps);
    if (io1.disk_bytes > io0.disk_bytes)    /* the disk stood idle: what streaming failed to overlap */
        fprintf(stderr, "disk idle per decode token: %.1f ms, of which during the head %.1f ms\n",
                1e3 * (io_idle_s() - idle0) / steps, 1e3 * (m->perf.t_head_idle - pf0.t_head_idle) / steps);
out:
    free(ids);
    free(logits);
    free(scratch);
    free(rows);
    budget_lend(NULL, m, &kv);
    kv_free(&kv);
    return rc;
}

/* SPEC_DRAFT, SPEC_POLICY, SPEC_REPLAY, SPEC_CORRUPT, SPEC_RECORD (server.h serve_opts); the
 * draft source is SPEC_REPLAY when set, else the file's MTP block. 0, or 2 with the reason on
 * stderr. */
static int spec_settings(serve_opts *so) {
    so->spec_draft = (int)int_setting(NULL, "SPEC_DRAFT", 0, 0, SPEC_MAX, "SPEC_DRAFT");
    const char *pol = getenv("SPEC_POLICY"), *cor = getenv("SPEC_CORRUPT");
    if (pol && *pol && strcmp(pol, "adaptive") && strcmp(pol, "always")) {
        fprintf(stderr, "colibri-engine: SPEC_POLICY must be adaptive or always (got '%s')\n", pol);
        return 2;
    }
    so->spec_always = pol && !strcmp(pol, "always");
    so->spec_corrupt = 0.0;
    if (cor && *cor &&
        (parse_double(cor, &so->spec_corrupt) != 0 || !(so->spec_corrupt >= 0.0 && so->spec_corrupt <= 1.0))) {
        fprintf(stderr, "colibri-engine: SPEC_CORRUPT must be a share in 0..1 (got '%s')\n", cor);
        return 2;
    }
    const char *rep = getenv("SPEC_REPLAY"), *rec = getenv("SPEC_RECORD");
    so->spec_replay = rep && *rep ? rep : NULL;
    so->spec_record = rec && *rec ? rec : NULL;
    return 0;
}

/* ---------------------------------------------------------------- memory budget */

/* The budget split for the loaded model (nothing of the experts read yet), logged, and the
 * expert share given to the store. 0 ok; 1 with the reason on stderr. */
static int split_budget(mem_budget *mb, model *m, int n_slots, int ctx, int kv_f16, long ram_mb, long pin_mb) {
    char err[512];
    if (budget_split(mb, m, n_slots, ctx, kv_f16, ram_mb, err, sizeof err) != 0) {
        fprintf(stderr, "colibri-engine: %s\n", err);
        return 1;
    }
    char js[512];
    budget_json(mb, js, sizeof js);
    fprintf(stderr, "colibri-engine: memory {%s}\n", js);
    if (budget_apply(mb, m, pin_mb) != 0) {
        fprintf(stderr, "colibri-engine: cannot read the experts from the model file\n");
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv) {
    const char *model_arg = NULL, *prompt = NULL, *tokenize_file = NULL, *detok = NULL;
    const char *slots_arg = NULL, *ctx_arg = NULL, *n_arg = NULL, *threads_arg = NULL, *budget_arg = NULL;
    double temp = 0.0, top_p = 1.0;
    uint64_t seed = 0;
    int have_seed = 0;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define TAKE() do { if (!v) { fprintf(stderr, "colibri-engine: %s needs a value\n", a); return 2; } i++; } while (0)
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "-m") || !strcmp(a, "--model")) { TAKE(); model_arg = v; }
        else if (!strcmp(a, "-p") || !strcmp(a, "--prompt")) { TAKE(); prompt = v; }
        else if (!strcmp(a, "-n")) { TAKE(); n_arg = v; }
        else if (!strcmp(a, "-t") || !strcmp(a, "--temp")) {
            TAKE();
            if (parse_double(v, &temp) || !(temp >= 0 && temp <= 2)) {
                fprintf(stderr, "colibri-engine: -t must be in 0..2\n");
                return 2;
            }
        } else if (!strcmp(a, "--top-p")) {
            TAKE();
            if (parse_double(v, &top_p) || !(top_p > 0 && top_p <= 1)) {
                fprintf(stderr, "colibri-engine: --top-p must be in (0, 1]\n");
                return 2;
            }
        } else if (!strcmp(a, "--seed")) {
            TAKE();
            char *end;
            errno = 0;
            seed = strtoull(v, &end, 10);
            if (*end || errno || !*v || *v == '-') {
                fprintf(stderr, "colibri-engine: --seed must be an unsigned integer\n");
                return 2;
            }
            have_seed = 1;
        } else if (!strcmp(a, "--slots")) { TAKE(); slots_arg = v; }
        else if (!strcmp(a, "--ctx")) { TAKE(); ctx_arg = v; }
        else if (!strcmp(a, "--threads")) { TAKE(); threads_arg = v; }
        else if (!strcmp(a, "--mem-budget")) { TAKE(); budget_arg = v; }
        else if (!strcmp(a, "--tokenize")) { TAKE(); tokenize_file = v; }
        else if (!strcmp(a, "--detokenize")) { TAKE(); detok = v; }
        else if (a[0] >= '0' && a[0] <= '9') {
            /* colibri's launch form `colibri <cap> [bits]`: accepted and ignored */
            fprintf(stderr, "colibri-engine: ignoring positional argument '%s'\n", a);
        } else {
            fprintf(stderr, "colibri-engine: unknown argument '%s'\n", a);
            usage(stderr);
            return 2;
        }
#undef TAKE
    }

    int serve = env_is("SERVE", "1");
    int serve_batch = env_is("SERVE_BATCH", "1");
    int n_slots = (int)int_setting(slots_arg, "KV_SLOTS", 1, 1, MAX_SLOTS, "KV_SLOTS / --slots");
    int ctx = (int)int_setting(ctx_arg, "CTX", 4096, 8, 1 << 20, "CTX / --ctx");
    int n_gen = (int)int_setting(n_arg, NULL, 64, 0, INT_MAX, "-n");
    long ram_mb = int_setting(NULL, "EXPERT_RAM_MB", -1, 0, LONG_MAX / (1L << 20), "EXPERT_RAM_MB");
    /* Unset: the whole budget is pinned to the hottest experts. A token visits each layer once,
     * so an expert's reuse distance is a whole token's selections (240 on the default model);
     * a budget below that working set never hits in an LRU (0 % measured at a quarter of the
     * experts) while the hottest quarter pinned serves a third of the selections. */
    long pin_mb = int_setting(NULL, "PIN_MB", -1, 0, LONG_MAX / (1L << 20), "PIN_MB");
    long budget_mb = int_setting(budget_arg, "MEM_BUDGET_MB", -1, 1, LONG_MAX / (1L << 20), "MEM_BUDGET_MB / --mem-budget");
    const int kv_f16 = kv_type_f16(getenv("KV_TYPE"));
    if (kv_f16 < 0) {
        fprintf(stderr, "colibri-engine: KV_TYPE must be f16 or f32 (got '%s')\n", getenv("KV_TYPE"));
        return 2;
    }
    if (threads_arg) omp_set_num_threads((int)int_setting(threads_arg, NULL, 1, 1, 4096, "--threads"));

    if (serve && !serve_batch && !prompt && !tokenize_file && !detok) {
        fprintf(stderr, "colibri-engine: the legacy single-slot protocol is not supported; "
                        "set SERVE_BATCH=1 for the mux protocol\n");
        return 2;
    }
    int serve_mode = serve && serve_batch && !prompt && !tokenize_file && !detok;
    if (!serve_mode && !prompt && !tokenize_file && !detok) {
        usage(stderr);
        return 2;
    }

    const char *src = model_arg ? model_arg : getenv("SNAP");
    if (!src || !*src) {
        fprintf(stderr, "colibri-engine: no model: pass --model PATH or set SNAP\n");
        return 1;
    }
    char path[1000], err[512];
    if (resolve_model(src, path, sizeof path, err, sizeof err) != 0) {
        fprintf(stderr, "colibri-engine: %s\n", err);
        return 1;
    }

    if (tokenize_file) return run_tokenize(path, tokenize_file);
    if (detok) return run_detokenize(path, detok);

    mem_budget mb;
    budget_figure(&mb, budget_mb);
    serve_opts so;
    memset(&so, 0, sizeof so);
    if (serve_mode && spec_settings(&so) != 0) return 2;
    expert_opts eo;
    memset(&eo, 0, sizeof eo);      /* no expert is read before the budget is split */
    eo.mtp = so.spec_draft > 0 && !so.spec_replay;     /* drafting with the file's MTP block */
    eo.usage_save = !env_is("USAGE_SAVE", "0");
    eo.exact = (int)int_setting(NULL, "EXACT", 0, 0, 1, "EXACT");
    eo.no_lookahead = !int_setting(NULL, "EXPERT_LOOKAHEAD", 1, 0, 1, "EXPERT_LOOKAHEAD");
    const char *up = getenv("USAGE_FILE");
    if (!up || !*up) up = getenv("COLI_USAGE");
    if (up && *up) snprintf(eo.usage_path, sizeof eo.usage_path, "%s", up);
    else snprintf(eo.usage_path, sizeof eo.usage_path, "%s.coli_usage", path);

    model m;
    memset(&m, 0, sizeof m);
    double t0 = now_s();
    if (model_load(&m, path, &eo, err, sizeof err) != 0) {
        /* one line a supervisor can show; the exit code says a restart will not help */
        fprintf(stderr, "colibri-engine: refused %s: %s\n", path, err);
        return EXIT_REFUSED;
    }
    mb.spec_rows = so.spec_draft;
    if (split_budget(&mb, &m, serve_mode ? n_slots : 1, ctx, kv_f16, ram_mb, pin_mb) != 0) {
        model_free(&m);
        return 1;
    }
    fprintf(stderr, "colibri-engine: loaded %s (%s, %d layers, %d experts, top-%d) in %.2fs\n", m.name,
            m.arch, m.c.n_layers, m.c.n_experts, m.c.top_k, now_s() - t0);

    int rc;
    if (eo.mtp && !m.c.n_mtp) {
        fprintf(stderr, "colibri-engine: SPEC_DRAFT needs a draft source: %s has no MTP block (or set SPEC_REPLAY)\n",
                path);
        model_free(&m);
        return 2;
    }
    if (serve_mode) {
        so.n_slots = n_slots;
        so.ctx = ctx;
        so.kv_f16 = kv_f16;
        so.kvsave = env_is("KVSAVE", "1");
        so.serve_topk = env_is("SERVE_TOPK", "1");
        so.usage_save = eo.usage_save;
        so.ckpt_every = (int)int_setting(NULL, "STATE_CKPT_EVERY", 1024, 0, 1 << 20, "STATE_CKPT_EVERY");
        so.budget = &mb;
        const char *kd = getenv("KV_DIR");
        if (kd && *kd) {
            const char *base = strrchr(path, '/');
            snprintf(so.kv_base, sizeof so.kv_base, "%s/%s.kv", kd, base ? base + 1 : path);
        } else {
            snprintf(so.kv_base, sizeof so.kv_base, "%s.kv", path);
        }
        rc = serve_mux(&m, &so);
    } else {
        rc = run_oneshot(&m, prompt, n_gen, temp, top_p, have_seed ? seed : 0, ctx, kv_f16, &mb);
    }
    model_free(&m);
    return rc;
}
