/* model.c — llama-architecture model (dense or MoE) from GGUF, and its batched forward.
 *
 * Forward, per row (same formulas as llama.cpp's llama graph):
 *   x = token_embd[token]
 *   per layer: h = rmsnorm(x, attn_norm); q,k,v = Wq h, Wk h, Wv h; RoPE (interleaved
 *   pairs, ggml mode 0) on q and k; K/V appended to the row's slot; causal attention over
 *   [0, pos] of the slot (GQA, scale 1/sqrt(head_dim), float softmax with max subtraction);
 *   x += Wo o; h = rmsnorm(x, ffn_norm); x += FFN(h) where FFN is the SiLU-gated MLP or
 *   the MoE (top-k routed experts + optional shared expert).
 *   logits = output * rmsnorm(x, output_norm)  (output tied to token_embd when absent).
 *
 * MoE combination order is fixed per row (selected experts in increasing id, then the
 * shared expert), so a row's result does not depend on which other rows share the batch. */
#include "model.h"
#include "pool.h"

#include <math.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>

typedef struct { float *p; size_t cap; } fbuf;   /* grown scratch, capacity in floats */
typedef struct { int *p; size_t cap; } ibuf;

struct model_priv {
    int g_open;
    float **owned;          /* converted (F16 -> F32) norm vectors */
    int n_owned, cap_owned;
    double *inv_freq;       /* RoPE: base^(-2i/rope_dim), i < rope_dim/2 */
    int rope_dim;
    qact act;
    fbuf x, h, q, k, v, att, tmp, fg, fu, rlog, eout, shout, xin, eg, eu, eo, hin, hout, ascr, rope, selw;
    ibuf sel, ecnt, eoff, elist, slot0, ablk, koff;
    qact *eact;             /* per expert: gate/up input (E), down input (E), row views of act (E) */
    expert_w *ew;
    mm_job *jobs;
};

static double mnow(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float *fb(fbuf *b, size_t n) {
    if (n == 0) n = 1;
    if (n > b->cap) {
        float *p = realloc(b->p, n * sizeof(float));
        if (!p) return NULL;
        b->p = p;
        b->cap = n;
    }
    return b->p;
}

static int *ib(ibuf *b, size_t n) {
    if (n == 0) n = 1;
    if (n > b->cap) {
        int *p = realloc(b->p, n * sizeof(int));
        if (!p) return NULL;
        b->p = p;
        b->cap = n;
    }
    return b->p;
}

static int fail(char *err, size_t errlen, const char *fmt, ...) {
    if (err && errlen) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, errlen, fmt, ap);
        va_end(ap);
    }
    return -1;
}

static uint32_t fnv1a32_local(const char *s) {
    uint32_t h = 2166136261u;
    for (; *s; s++) h = (h ^ (uint8_t)*s) * 16777619u;
    return h;
}

static uint64_t fnv1a64(uint64_t h, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

/* ---------------------------------------------------------------- math helpers */

static void rmsnorm(float *out, const float *x, const float *w, int d, float eps) {
    double ss = 0.0;
    for (int j = 0; j < d; j++) ss += (double)(x[j] * x[j]);
    float mean = (float)(ss / d);
    float scale = 1.0f / sqrtf(mean + eps);
    for (int j = 0; j < d; j++) out[j] = (x[j] * scale) * w[j];
}


/* cs: rope_dim/2 (cos, sin) pairs for position pos. */
static void rope_table(const struct model_priv *P, int pos, float *cs) {
    for (int i = 0; i < P->rope_dim / 2; i++) {
        double th = (double)pos * P->inv_freq[i];
        cs[2 * i] = (float)cos(th);
        cs[2 * i + 1] = (float)sin(th);
    }
}

static void rope_apply(float *v, int n_heads, int head_dim, int rope_dim, const float *cs) {
    for (int hh = 0; hh < n_heads; hh++) {
        float *p = v + (size_t)hh * head_dim;
        for (int i = 0; i < rope_dim / 2; i++) {
            float c = cs[2 * i], s = cs[2 * i + 1];
            float x0 = p[2 * i], x1 = p[2 * i + 1];
            p[2 * i] = x0 * c - x1 * s;
            p[2 * i + 1] = x0 * s + x1 * c;
        }
    }
}

/* Row loops of the forward, run on the pool in chunks of ROW_CHUNK rows when the batch is
 * large (each row is computed the same way either way). */
#define ROW_CHUNK 16
static void par_rows(pool_fn fn, void *ctx, int n) {
    int nc = (n + ROW_CHUNK - 1) / ROW_CHUNK;
    if (n >= 2 * ROW_CHUNK) pool_run(fn, ctx, nc);
    else
        for (int c = 0; c < nc; c++) fn(ctx, c);
}

/* x += add (when add); h = rmsnorm(x, w) (when w). */
typedef struct { float *x; const float *add; float *h; const float *w; int n, d; float eps; } norm_ctx;
static void norm_chunk(void *vctx, int c) {
    const norm_ctx *N = vctx;
    const size_t d = (size_t)N->d;
    for (int i = c * ROW_CHUNK; i < N->n && i < (c + 1) * ROW_CHUNK; i++) {
        float *xi = N->x + i * d;
        if (N->add)
            for (size_t q = 0; q < d; q++) xi[q] += N->add[i * d + q];
        if (N->w) rmsnorm(N->h + i * d, xi, N->w, N->d, N->eps);
    }
}
static void add_norm(float *x, const float *add, float *h, const float *w, int n, int d, float eps) {
    norm_ctx N = {x, add, h, w, n, d, eps};
    par_rows(norm_chunk, &N, n);
}

/* RoPE on q and k, then k and v appended to the rows' slots. */
typedef struct {
    kv_cache *kv;
    const fwd_row *rows;
    float *Q, *K;
    const float *V, *rope;
    int n, l, nh, nkv, hd, rdim;
} rope_ctx;
static void rope_chunk(void *vctx, int c) {
    const rope_ctx *R = vctx;
    const size_t qd = (size_t)R->nh * R->hd, kvd = (size_t)R->nkv * R->hd;
    for (int i = c * ROW_CHUNK; i < R->n && i < (c + 1) * ROW_CHUNK; i++) {
        const float *cs = R->rope + (size_t)i * R->rdim;
        rope_apply(R->Q + i * qd, R->nh, R->hd, R->rdim, cs);
        rope_apply(R->K + i * kvd, R->nkv, R->hd, R->rdim, cs);
        kv_store(R->kv, R->rows[i].slot, R->l, R->rows[i].pos, R->K + i * kvd, R->V + i * kvd);
    }
}

/* Matmuls over the same n input rows, run as one parallel job. */
static void mm_many(struct model_priv *P, const float *x, int n, const qmat *const *ws, float *const *outs,
                    int cnt) {
    mm_job J[8];
    qact_prepare(&P->act, ws[0]->type, x, n, ws[0]->cols);
    for (int i = 0; i < cnt; i++) J[i] = (mm_job){ws[i], NULL, &P->act, outs[i], ws[i]->rows};
    qmat_mul_multi(J, cnt);
}

static void mm(struct model_priv *P, const qmat *w, const float *x, int n, float *out) {
    mm_many(P, x, n, &w, &out, 1);
}

/* ---------------------------------------------------------------- loading */

static void shape_str(char *buf, size_t cap, const uint64_t *ne, int nd) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int i = 0; i < nd && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, i ? ", %llu" : "%llu", (unsigned long long)ne[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* Finds `name` and checks its shape (nd dims e[0..nd), missing trailing dims = 1).
 * *t = NULL and 0 when optional and absent. */
static int get_tensor(const gguf_file *g, const char *name, int nd, const uint64_t *e, int optional,
                      const gguf_tensor **t, char *err, size_t errlen) {
    *t = gguf_find_tensor(g, name);
    if (!*t) return optional ? 0 : fail(err, errlen, "%s: tensor missing", name);
    uint64_t want[4] = {1, 1, 1, 1};
    for (int i = 0; i < nd; i++) want[i] = e[i];
    int ok = 1;
    for (int i = 0; i < 4; i++) ok &= (*t)->ne[i] == want[i];
    if (!ok) {
        char a[96], b[96];
        int got = (int)(*t)->n_dims;
        if (got < 1) got = 1;
        if (got > 4) got = 4;
        shape_str(a, sizeof a, want, nd);
        shape_str(b, sizeof b, (*t)->ne, got);
        return fail(err, errlen, "%s: expected %s, got %s", name, a, b);
    }
    return 0;
}

static int mat_type_ok(uint32_t t) { return t == GGML_F32 || t == GGML_F16 || t == GGML_Q8_0 || t == GGML_Q4_1; }

static int get_mat(const gguf_file *g, const char *name, uint64_t cols, uint64_t rows, int optional, qmat *q,
                   char *err, size_t errlen) {
    const gguf_tensor *t;
    uint64_t e[2] = {cols, rows};
    memset(q, 0, sizeof *q);
    if (get_tensor(g, name, 2, e, optional, &t, err, errlen) != 0) return -1;
    if (!t) return 0;
    if (!mat_type_ok(t->type))
        return fail(err, errlen, "%s: type %s is not supported (F32, F16, Q8_0, Q4_1)", name, ggml_type_name(t->type));
    q->type = t->type;
    q->rows = (int)rows;
    q->cols = (int)cols;
    q->row_bytes = ggml_row_bytes(t->type, cols);
    q->data = t->data;
    if (q->row_bytes == 0) return fail(err, errlen, "%s: bad row length for %s", name, ggml_type_name(t->type));
    return 0;
}

/* n bytes at p, a pointer into g's mapping, into dst without touching the mapping (see get_vec). */
static int read_mapped(const gguf_file *g, const void *p, size_t n, void *dst) {
    return gguf_read_at(g->fd, g->map, g->size, (uint64_t)((const uint8_t *)p - g->map), dst, n);
}

static int own(struct model_priv *P, float *p) {
    if (P->n_owned == P->cap_owned) {
        int nc = P->cap_owned ? 2 * P->cap_owned : 16;
        float **np = realloc(P->owned, sizeof *np * (size_t)nc);
        if (!np) return -1;
        P->owned = np;
        P->cap_owned = nc;
    }
    P->owned[P->n_owned++] = p;
    return 0;
}

/* F32 [n] vector, an owned copy (F16 converted). NULL result with 0 when optional+absent.
 * Never a pointer into the mapping: the page cache holds the file in large folios, and one
 * fault on a small tensor maps the whole folio around it into this process (serving one
 * conversation with the norms read in place: +72 MB of file pages in RSS). */
static int get_vec(model *m, const char *name, int n, int optional, const float **out, char *err, size_t errlen) {
    const gguf_tensor *t;
    uint64_t e[1] = {(uint64_t)n};
    *out = NULL;
    if (get_tensor(&m->g, name, 1, e, optional, &t, err, errlen) != 0) return -1;
    if (!t) return 0;
    if (t->type != GGML_F32 && t->type != GGML_F16)
        return fail(err, errlen, "%s: type %s is not supported for a vector (F32 or F16)", name,
                    ggml_type_name(t->type));
    float *b = malloc(sizeof(float) * (size_t)n);
    if (!b || own(m->priv, b) != 0) {
        free(b);
        return fail(err, errlen, "%s: out of memory", name);
    }
    if (t->type == GGML_F32) {
        if (read_mapped(&m->g, t->data, sizeof(float) * (size_t)n, b) != 0)
            return fail(err, errlen, "%s: cannot read the file", name);
    } else {
        uint16_t *h = malloc(2 * (size_t)n);
        if (!h || read_mapped(&m->g, t->data, 2 * (size_t)n, h) != 0) {
            free(h);
            return fail(err, errlen, "%s: cannot read the file", name);
        }
        for (int i = 0; i < n; i++) b[i] = fp16_to_f32(h[i]);
        free(h);
    }
    *out = b;
    return 0;
}

/* Replaces a mapped matrix by an owned copy, packed when packable (a row-major copy
 * otherwise: the F32 router). drop: the original's file pages are released from this process
 * (re-read from the file if touched). */
static int pack_mat(model *m, qmat *w, int drop) {
    if (m->exact || w->rows <= 0 || w->packed) return 0;
    const int pk = qpack_ok(w->type, w->rows, w->cols);
    size_t bytes = pk ? qpack_bytes(w->type, w->rows, w->cols) : (size_t)w->rows * w->row_bytes;
    uint8_t *b = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (!b || own(m->priv, (float *)(void *)b) != 0) {
        free(b);
        return -1;
    }
    if (pk) qpack(w, b);
    else if (read_mapped(&m->g, w->data, bytes, b) != 0) return -1;
    if (drop) {
        uintptr_t a0 = ((uintptr_t)w->data + 4095) & ~(uintptr_t)4095;
        uintptr_t a1 = ((uintptr_t)w->data + (size_t)w->rows * w->row_bytes) & ~(uintptr_t)4095;
        if (a1 > a0) madvise((void *)a0, a1 - a0, MADV_DONTNEED);
    }
    w->data = b;
    w->packed = pk;
    return 0;
}

/* The file's recommended sampling (llama.cpp's general.sampling.* keys), when present. */
static void sampling_defaults(model *m) {
    const gguf_file *g = &m->g;    /* a key of a non-numeric type, or not finite, counts as absent */
    double t = gguf_get_float(g, "general.sampling.temp", NAN);
    double p = gguf_get_float(g, "general.sampling.top_p", NAN);
    double k = gguf_get_float(g, "general.sampling.top_k", NAN);
    m->sampling.has_temp = isfinite(t);
    m->sampling.has_top_p = isfinite(p);
    m->sampling.has_top_k = isfinite(k) && k >= 0 && k <= 1e9;
    m->sampling.temp = m->sampling.has_temp ? (float)t : 0.0f;
    m->sampling.top_p = m->sampling.has_top_p ? (float)p : 1.0f;
    m->sampling.top_k = m->sampling.has_top_k ? (int)k : 0;
}

static int load_inner(model *m, const char *path, const expert_opts *eo, char *err, size_t errlen) {
    struct model_priv *P = m->priv;
    gguf_file *g = &m->g;
    char nm[160];
    if (gguf_open(g, path) != 0) return fail(err, errlen, "%s", g->err[0] ? g->err : "cannot open model");
    P->g_open = 1;

    char *arch = gguf_get_string(g, "general.architecture");
    if (!arch) return fail(err, errlen, "general.architecture is missing");
    if (strcmp(arch, "llama") != 0) {
        fail(err, errlen, "architecture '%s' is not supported (llama only)", arch);
        free(arch);
        return -1;
    }
    snprintf(m->arch, sizeof m->arch, "%s", arch);
    free(arch);

    model_config *c = &m->c;
    const int64_t LIM = 1 << 24;
#define REQ(dst, key)                                                                     \
    do {                                                                                  \
        int64_t v_ = gguf_get_int(g, key, -1);                                            \
        if (v_ < 1 || v_ > LIM) return fail(err, errlen, "%s is missing or invalid", key); \
        dst = (int)v_;                                                                    \
    } while (0)
#define OPT(dst, key, def)                                                                       \
    do {                                                                                         \
        int64_t v_ = gguf_get_int(g, key, def);                                                  \
        if (v_ < 0 || v_ > LIM) return fail(err, errlen, "%s = %lld is invalid", key, (long long)v_); \
        dst = (int)v_;                                                                           \
    } while (0)
    REQ(c->n_layers, "llama.block_count");
    REQ(c->d_model, "llama.embedding_length");
    REQ(c->n_heads, "llama.attention.head_count");
    OPT(c->n_kv_heads, "llama.attention.head_count_kv", c->n_heads);
    OPT(c->d_ff, "llama.feed_forward_length", 0);
    OPT(c->ctx_train, "llama.context_length", 0);
    OPT(c->n_experts, "llama.expert_count", 0);
    OPT(c->top_k, "llama.expert_used_count", 0);
    OPT(c->d_expert, "llama.expert_feed_forward_length", 0);
    OPT(c->d_shexp, "llama.expert_shared_feed_forward_length", 0);
    c->rope_base = (float)gguf_get_float(g, "llama.rope.freq_base", 10000.0);
    c->rms_eps = (float)gguf_get_float(g, "llama.attention.layer_norm_rms_epsilon", 1e-5);
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0)
        return fail(err, errlen, "head_count %d is not a multiple of head_count_kv %d", c->n_heads, c->n_kv_heads);
    if (c->d_model % c->n_heads != 0)
        return fail(err, errlen, "embedding_length %d is not a multiple of head_count %d", c->d_model, c->n_heads);
    c->head_dim = c->d_model / c->n_heads;
    int64_t kl = gguf_get_int(g, "llama.attention.key_length", c->head_dim);
    int64_t vl = gguf_get_int(g, "llama.attention.value_length", c->head_dim);
    if (kl != c->head_dim || vl != c->head_dim)
        return fail(err, errlen, "attention key/value length %lld/%lld != embedding_length/head_count %d is not supported",
                    (long long)kl, (long long)vl, c->head_dim);
    int64_t rd = gguf_get_int(g, "llama.rope.dimension_count", c->head_dim);
    if (rd < 2 || rd > c->head_dim || rd % 2)
        return fail(err, errlen, "llama.rope.dimension_count %lld is invalid for head_dim %d", (long long)rd, c->head_dim);
    if (!(c->rope_base > 0.0f) || !isfinite(c->rope_base)) return fail(err, errlen, "llama.rope.freq_base is invalid");
    if (!(c->rms_eps >= 0.0f) || !isfinite(c->rms_eps))
        return fail(err, errlen, "llama.attention.layer_norm_rms_epsilon is invalid");
    c->gating = GATING_SOFTMAX;
    char *gs = gguf_get_string(g, "colibri.expert_gating");
    if (gs) {
        if (strcmp(gs, "softmax") == 0) c->gating = GATING_SOFTMAX;
        else if (strcmp(gs, "unit") == 0) c->gating = GATING_UNIT;
        else {
            fail(err, errlen, "colibri.expert_gating '%s' is not supported (softmax or unit)", gs);
            free(gs);
            return -1;
        }
        free(gs);
    }
    if (c->n_experts > 0 && (c->top_k < 1 || c->top_k > c->n_experts))
        return fail(err, errlen, "llama.expert_used_count %d is invalid for %d experts", c->top_k, c->n_experts);
    if (c->n_experts == 0) c->top_k = 0;
    const char *tk = getenv("TOPK");     /* colibri's override of experts per token */
    if (tk && *tk && c->n_experts > 0) {
        char *end;
        long v = strtol(tk, &end, 10);
        if (*end || v < 1 || v > c->n_experts)
            return fail(err, errlen, "TOPK=%s is invalid (1..%d experts)", tk, c->n_experts);
        c->top_k = (int)v;
    }

    /* tokenizer */
    m->tok = tok_load(g, err, errlen);
    if (!m->tok) return -1;
    c->vocab = tok_n_vocab(m->tok);
    if (c->vocab < 1) return fail(err, errlen, "tokenizer has no tokens");

    uint64_t D = (uint64_t)c->d_model, V = (uint64_t)c->vocab;
    int kv_dim = c->n_kv_heads * c->head_dim;
    if (get_mat(g, "token_embd.weight", D, V, 0, &m->tok_embd, err, errlen)) return -1;
    if (get_vec(m, "output_norm.weight", c->d_model, 0, &m->output_norm, err, errlen)) return -1;
    if (get_mat(g, "output.weight", D, V, 1, &m->output, err, errlen)) return -1;
    if (m->output.rows == 0) m->output = m->tok_embd;

    m->layers = calloc((size_t)c->n_layers, sizeof *m->layers);
    expert_layer_src *src = calloc((size_t)c->n_layers, sizeof *src);
    if (!m->layers || !src) {
        free(src);
        return fail(err, errlen, "out of memory");
    }
    int rc = -1;
    /* Derive expert widths from the first MoE layer when metadata lacks them. */
    if (c->n_experts > 0) {
        for (int l = 0; l < c->n_layers; l++) {
            snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
            if (!gguf_find_tensor(g, nm)) continue;
            const gguf_tensor *t;
            snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", l);
            if (c->d_expert == 0 && (t = gguf_find_tensor(g, nm)) && t->ne[1] <= (uint64_t)LIM) c->d_expert = (int)t->ne[1];
            snprintf(nm, sizeof nm, "blk.%d.ffn_gate_shexp.weight", l);
            if (c->d_shexp == 0 && (t = gguf_find_tensor(g, nm)) && t->ne[1] <= (uint64_t)LIM) c->d_shexp = (int)t->ne[1];
            if (c->d_expert) break;
        }
    }
    c->n_moe_rows = 0;
    for (int l = 0; l < c->n_layers; l++) {
        layer_w *L = &m->layers[l];
        L->moe_row = -1;
#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
        if (get_vec(m, NAME("attn_norm.weight"), c->d_model, 0, &L->attn_norm, err, errlen)) goto out;
        if (get_vec(m, NAME("ffn_norm.weight"), c->d_model, 0, &L->ffn_norm, err, errlen)) goto out;
        if (get_mat(g, NAME("attn_q.weight"), D, D, 0, &L->q, err, errlen)) goto out;
        if (get_mat(g, NAME("attn_k.weight"), D, (uint64_t)kv_dim, 0, &L->k, err, errlen)) goto out;
        if (get_mat(g, NAME("attn_v.weight"), D, (uint64_t)kv_dim, 0, &L->v, err, errlen)) goto out;
        if (get_mat(g, NAME("attn_output.weight"), D, D, 0, &L->o, err, errlen)) goto out;
        int is_moe = c->n_experts > 0 && gguf_find_tensor(g, NAME("ffn_gate_inp.weight")) != NULL;
        if (!is_moe) {
            if (c->d_ff < 1) {
                fail(err, errlen, "blk.%d is a dense layer but llama.feed_forward_length is missing", l);
                goto out;
            }
            uint64_t F = (uint64_t)c->d_ff;
            if (get_mat(g, NAME("ffn_gate.weight"), D, F, 0, &L->ffn_gate, err, errlen)) goto out;
            if (get_mat(g, NAME("ffn_up.weight"), D, F, 0, &L->ffn_up, err, errlen)) goto out;
            if (get_mat(g, NAME("ffn_down.weight"), F, D, 0, &L->ffn_down, err, errlen)) goto out;
            continue;
        }
        uint64_t E = (uint64_t)c->n_experts, X = (uint64_t)c->d_expert;
        if (c->d_expert < 1) {
            fail(err, errlen, "blk.%d.ffn_gate_exps.weight: tensor missing", l);
            goto out;
        }
        if (get_mat(g, NAME("ffn_gate_inp.weight"), D, E, 0, &L->router, err, errlen)) goto out;
        if (get_vec(m, NAME("ffn_gate_inp.bias"), c->n_experts, 1, &L->router_b, err, errlen)) goto out;
        const gguf_tensor *tg, *tu, *td;
        uint64_t eg[3] = {D, X, E}, ed[3] = {X, D, E};
        if (get_tensor(g, NAME("ffn_gate_exps.weight"), 3, eg, 0, &tg, err, errlen)) goto out;
        if (get_tensor(g, NAME("ffn_up_exps.weight"), 3, eg, 0, &tu, err, errlen)) goto out;
        if (get_tensor(g, NAME("ffn_down_exps.weight"), 3, ed, 0, &td, err, errlen)) goto out;
        const gguf_tensor *te[3] = {tg, tu, td};
        for (int k = 0; k < 3; k++)
            if (!mat_type_ok(te[k]->type)) {
                fail(err, errlen, "%.*s: type %s is not supported (F32, F16, Q8_0, Q4_1)", (int)te[k]->name.len,
                     te[k]->name.ptr, ggml_type_name(te[k]->type));
                goto out;
            }
        int has_sh = gguf_find_tensor(g, NAME("ffn_gate_shexp.weight")) || gguf_find_tensor(g, NAME("ffn_up_shexp.weight")) ||
                     gguf_find_tensor(g, NAME("ffn_down_shexp.weight"));
        if (has_sh) {
            if (c->d_shexp < 1) {
                fail(err, errlen, "blk.%d.ffn_gate_shexp.weight: tensor missing", l);
                goto out;
            }
            uint64_t S = (uint64_t)c->d_shexp;
            if (get_mat(g, NAME("ffn_gate_shexp.weight"), D, S, 0, &L->sh_gate, err, errlen)) goto out;
            if (get_mat(g, NAME("ffn_up_shexp.weight"), D, S, 0, &L->sh_up, err, errlen)) goto out;
            if (get_mat(g, NAME("ffn_down_shexp.weight"), S, D, 0, &L->sh_down, err, errlen)) goto out;
        }
#undef NAME
        L->moe_row = c->n_moe_rows;
        src[c->n_moe_rows].layer = l;
        src[c->n_moe_rows].gate = tg;
        src[c->n_moe_rows].up = tu;
        src[c->n_moe_rows].down = td;
        c->n_moe_rows++;
    }
    if (c->n_moe_rows == 0) c->d_expert = c->d_shexp = 0;

    expert_opts def;
    memset(&def, 0, sizeof def);
    def.ram_budget = SIZE_MAX;
    m->es = es_create(g, src, c->n_moe_rows, c->n_moe_rows ? c->n_experts : 0, eo ? eo : &def,
                      fnv1a32_local(m->arch), c->n_layers, err, errlen);
    if (!m->es) goto out;
    /* dense matrices into the interleaved layout of the matmul kernels (owned copies; the
     * file pages of the originals are dropped). A tied head also serves the embedding rows
     * (qmat_row reads the packed layout), so token_embd's pages are not kept either. */
    {
        const int tied = m->output.data == m->tok_embd.data;
        if (pack_mat(m, &m->output, 1) != 0) {
            fail(err, errlen, "output.weight: out of memory or unreadable");
            goto out;
        }
        if (tied) m->tok_embd = m->output;
    }
    for (int l = 0; l < c->n_layers; l++) {
        layer_w *L = &m->layers[l];
        qmat *ms[] = {&L->q, &L->k, &L->v, &L->o, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                      &L->router, &L->sh_gate, &L->sh_up, &L->sh_down};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (pack_mat(m, ms[i], 1) != 0) {
                fail(err, errlen, "blk.%d: out of memory or unreadable tensor data", l);
                goto out;
            }
    }
    rc = 0;
out:
    free(src);
    if (rc) return rc;

    /* name, template, fingerprint, rope table */
    char *name = gguf_get_string(g, "general.name");
    if (name && name[0]) snprintf(m->name, sizeof m->name, "%s", name);
    else {
        const char *b = strrchr(path, '/');
        snprintf(m->name, sizeof m->name, "%s", b ? b + 1 : path);
    }
    free(name);
    m->chat_template = gguf_get_string(g, "tokenizer.chat_template");
    sampling_defaults(m);
    /* what K/V rows depend on: the shapes, the effective top-k, the file, EXACT's arithmetic */
    int64_t fp[17] = {c->n_layers, c->d_model, c->n_heads, c->n_kv_heads, c->head_dim, c->d_ff, c->vocab,
                      c->n_experts, c->top_k, c->d_expert, c->d_shexp, c->gating, c->n_moe_rows, rd,
                      (int64_t)g->size, (int64_t)g->n_tensors, m->exact};
    m->fingerprint = fnv1a64(1469598103934665603ull, fp, sizeof fp);
    P->rope_dim = (int)rd;
    P->inv_freq = malloc(sizeof(double) * (size_t)(rd / 2));
    if (!P->inv_freq) return fail(err, errlen, "out of memory");
    for (int i = 0; i < rd / 2; i++) P->inv_freq[i] = pow((double)c->rope_base, -2.0 * i / (double)rd);
    return 0;
#undef REQ
#undef OPT
}

int model_load(model *m, const char *path, const expert_opts *eo, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->g.fd = -1;
    m->priv = calloc(1, sizeof *m->priv);
    if (!m->priv) return fail(err, errlen, "out of memory");
    m->exact = eo && eo->exact;
    m->priv->act.exact = m->exact;
    if (!path) return model_free(m), fail(err, errlen, "no model path");
    if (load_inner(m, path, eo, err, errlen) != 0) {
        model_free(m);
        return -1;
    }
    return 0;
}

void model_free(model *m) {
    struct model_priv *P = m->priv;
    if (!P) return;
    es_free(m->es);
    if (m->tok) tok_free(m->tok);
    free(m->layers);
    free(m->chat_template);
    for (int i = 0; i < P->n_owned; i++) free(P->owned[i]);
    free(P->owned);
    free(P->inv_freq);
    qact_free(&P->act);
    if (P->eact)
        for (int e = 0; e < 2 * m->c.n_experts; e++) qact_free(&P->eact[e]);
    free(P->eact);
    free(P->ew);
    free(P->jobs);
    fbuf *fs[] = {&P->x, &P->h, &P->q, &P->k, &P->v, &P->att, &P->tmp, &P->fg, &P->fu, &P->rlog, &P->eout,
                  &P->shout, &P->xin, &P->eg, &P->eu, &P->eo, &P->hin, &P->hout, &P->ascr, &P->rope, &P->selw};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]->p);
    ibuf *is[] = {&P->sel, &P->ecnt, &P->eoff, &P->elist, &P->slot0, &P->ablk, &P->koff};
    for (size_t i = 0; i < sizeof is / sizeof is[0]; i++) free(is[i]->p);
    if (P->g_open) gguf_close(&m->g);
    free(P);
    memset(m, 0, sizeof *m);
    m->g.fd = -1;
}

uint64_t model_fingerprint_k(const model *m, int k) {
    if (k == m->c.top_k) return m->fingerprint;
    int64_t v = k;
    return fnv1a64(m->fingerprint, &v, sizeof v);
}

/* ---------------------------------------------------------------- forward */

/* y_i = sum_j w_ij * expert_out(i, j) (row i's selected experts in increasing id) + shared_i;
 * row i's pairs are koff[i] .. koff[i + 1] - 1. */
typedef struct {
    float *out;
    const float *selw, *eo, *so;
    const int *slot_of, *koff;
    int n, d;
} combine_ctx;
static void combine_chunk(void *vctx, int c) {
    const combine_ctx *C = vctx;
    const int d = C->d;
    for (int i = c * ROW_CHUNK; i < C->n && i < (c + 1) * ROW_CHUNK; i++) {
        float *restrict y = C->out + (size_t)i * d;
        for (int q = 0; q < d; q++) y[q] = 0.0f;
        for (int p = C->koff[i]; p < C->koff[i + 1]; p++) {
            const float *restrict er = C->eo + (size_t)C->slot_of[p] * d;
            const float wp = C->selw[p];
            for (int q = 0; q < d; q++) y[q] += wp * er[q];
        }
        if (C->so)
            for (int q = 0; q < d; q++) y[q] += C->so[(size_t)i * d + q];
    }
}

/* Experts per token of a row: its own count when set (1 .. n_experts), else the model's. */
static int row_experts(const model_config *c, const fwd_row *r) {
    return r->n_experts >= 1 && r->n_experts <= c->n_experts ? r->n_experts : c->top_k;
}

/* The K largest router logits of lg (ties -> lower id), written to s in increasing id. */
static void top_k_ids(const float *lg, int E, int K, int *s) {
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j; q++) taken |= s[q] == e;
            if (taken) continue;
            if (best < 0 || lg[e] > lg[best]) best = e;
        }
        s[j] = best;
    }
    for (int a = 1; a < K; a++)
        for (int b = a; b > 0 && s[b - 1] > s[b]; b--) {
            int t = s[b];
            s[b] = s[b - 1];
            s[b - 1] = t;
        }
}

/* Gating weights of the K selected experts s of one row: 1 each (unit), or the softmax of
 * their logits. */
static void gate_weights(int gating, const float *lg, const int *s, int K, float *w) {
    if (gating == GATING_UNIT) {
        for (int j = 0; j < K; j++) w[j] = 1.0f;
        return;
    }
    float mx = lg[s[0]];
    for (int j = 1; j < K; j++) mx = fmaxf(mx, lg[s[j]]);
    double sum = 0.0;
    for (int j = 0; j < K; j++) {
        w[j] = expf(lg[s[j]] - mx);
        sum += w[j];
    }
    float inv = (float)(1.0 / sum);
    for (int j = 0; j < K; j++) w[j] *= inv;
}

/* MoE FFN of layer L for n rows of normalized input h; result (not yet added) in out.
 * All selected experts' gate/up (and the shared expert's) run as one parallel job, then all
 * down projections as a second one. */
static int moe_ffn(model *m, const layer_w *L, const float *h, int n, const fwd_row *rows, float *out) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const int d = c->d_model, E = c->n_experts, X = c->d_expert, r = L->moe_row;
    const int S = L->sh_gate.rows > 0 ? c->d_shexp : 0;
    /* each row has its own expert count: row i's (row, expert) pairs are koff[i] .. koff[i+1]-1 */
    int *koff = ib(&P->koff, (size_t)n + 1);
    if (!koff) return -1;
    koff[0] = 0;
    for (int i = 0; i < n; i++) koff[i + 1] = koff[i] + row_experts(c, &rows[i]);
    const int NP = koff[n];
    float *rl = fb(&P->rlog, (size_t)n * E);
    int *sel = ib(&P->sel, (size_t)NP);
    float *selw = fb(&P->selw, (size_t)NP);
    int *ecnt = ib(&P->ecnt, (size_t)E + 1);
    int *eoff = ib(&P->eoff, (size_t)E + 1);
    int *elist = ib(&P->elist, (size_t)NP * 2 + E); /* pairs by expert | slot of each pair | experts */
    float *eg = fb(&P->eg, (size_t)NP * X);
    float *eo = fb(&P->eout, (size_t)NP * d);
    float *sg = S ? fb(&P->fg, (size_t)n * S) : NULL, *so = S ? fb(&P->shout, (size_t)n * d) : NULL;
    if (!rl || !sel || !selw || !ecnt || !eoff || !elist || !eg || !eo || (S && (!sg || !so))) return -1;
    if (!P->eact) {
        P->eact = calloc((size_t)E * 3, sizeof(qact));   /* gathered, down inputs, views */
        P->ew = calloc((size_t)E, sizeof(expert_w));
        P->jobs = calloc((size_t)E + 2, sizeof(mm_job));
        if (!P->eact || !P->ew || !P->jobs) return -1;
        for (int e = 0; e < 3 * E; e++) P->eact[e].exact = m->exact;
    }
    qact *gact = P->eact, *dact = P->eact + E, *gview = P->eact + 2 * E;
    int *slot_of = elist + NP;

    double t0 = mnow();
    qact_prepare(&P->act, L->router.type, h, n, d);
    qmat_mul(&L->router, &P->act, rl, E);
    for (int i = 0; i < n; i++) {
        float *lg = rl + (size_t)i * E;
        if (L->router_b)
            for (int e = 0; e < E; e++) lg[e] += L->router_b[e];
        const int K = koff[i + 1] - koff[i];
        int *s = sel + koff[i];
        top_k_ids(lg, E, K, s);
        gate_weights(c->gating, lg, s, K, selw + koff[i]);
        for (int j = 0; j < K; j++) {
            es_note(m->es, r, s[j], !rows[i].no_heat);
            if (rows[i].route_counts) rows[i].route_counts[(size_t)r * E + s[j]]++;
        }
    }
    /* group (row, rank) pairs by expert; within an expert, rows in batch order */
    memset(ecnt, 0, sizeof(int) * (size_t)(E + 1));
    for (int p = 0; p < NP; p++) ecnt[sel[p]]++;
    eoff[0] = 0;
    for (int e = 0; e < E; e++) eoff[e + 1] = eoff[e] + ecnt[e];
    for (int e = 0; e <= E; e++) ecnt[e] = eoff[e];
    for (int i = 0; i < n; i++)
        for (int p = koff[i]; p < koff[i + 1]; p++) {
            slot_of[p] = ecnt[sel[p]];
            elist[ecnt[sel[p]]++] = i;          /* the batch row of each grouped pair */
        }
    m->perf.t_dense += mnow() - t0;

    /* acquire every selected expert (misses are read and packed here, in parallel on the pool) */
    int nsel = 0;
    for (int e = 0; e < E; e++)
        if (eoff[e + 1] > eoff[e]) elist[2 * NP + nsel++] = e;
    int rc = es_acquire_many(m->es, r, elist + 2 * NP, nsel, P->ew, &m->perf.t_edisk);
    int nacq = rc == 0 ? E : 0;
    double t1 = mnow();
    mm_job *J = P->jobs;
    int nj = 0;
    if (rc == 0) {
        /* gate/up: experts on gathered rows of h, shared expert on all rows */
        /* P->act still holds h (prepared for the router; int8 blocks and floats both kept) */
        for (int e = 0; e < E; e++) {
            int cnt = eoff[e + 1] - eoff[e];
            if (cnt == 0) continue;
            if (qpack_ok(P->ew[e].gate.type, P->ew[e].gate.rows, P->ew[e].gate.cols)) {
                gview[e] = P->act;                  /* a view: rows by index, no copy */
                gview[e].n = cnt;
                gview[e].idx = elist + eoff[e];
                J[nj++] = (mm_job){&P->ew[e].gate, &P->ew[e].up, &gview[e], eg + (size_t)eoff[e] * X, X};
                continue;
            }
            if (qact_gather(&gact[e], &P->act, elist + eoff[e], cnt) != 0) {
                rc = -1;
                break;
            }
            J[nj++] = (mm_job){&P->ew[e].gate, &P->ew[e].up, &gact[e], eg + (size_t)eoff[e] * X, X};
        }
        if (S) J[nj++] = (mm_job){&L->sh_gate, &L->sh_up, &P->act, sg, S};
    }
    if (rc == 0) {
        qmat_mul_multi(J, nj);
        nj = 0;
        for (int e = 0; e < E; e++) {
            int cnt = eoff[e + 1] - eoff[e];
            if (cnt == 0) continue;
            qact_prepare(&dact[e], P->ew[e].down.type, eg + (size_t)eoff[e] * X, cnt, X);
            J[nj++] = (mm_job){&P->ew[e].down, NULL, &dact[e], eo + (size_t)eoff[e] * d, d};
        }
        if (S) {
            qact_prepare(&P->act, L->sh_down.type, sg, n, S);
            J[nj++] = (mm_job){&L->sh_down, NULL, &P->act, so, d};
        }
        qmat_mul_multi(J, nj);
    }
    for (int e = 0; e < nacq; e++)
        if (eoff[e + 1] > eoff[e]) es_release(m->es, r, e);
    m->perf.t_emm += mnow() - t1;
    if (rc != 0) return -1;

    t0 = mnow();
    combine_ctx C = {out, selw, eo, so, slot_of, koff, n, d};
    par_rows(combine_chunk, &C, n);
    m->perf.t_dense += mnow() - t0;
    return 0;
}

#define ATT_R 4     /* query rows per attention task (same slot, consecutive positions) */

typedef struct {
    kv_cache *kv;
    const fwd_row *rows;
    const int *blk;         /* task blocks: rows blk[b] .. blk[b + 1] - 1 */
    const float *Q;
    float *att, *ascr;
    int sc_len, l, nh, nkv, hd, qd, grp;
    float scale;
} attn_ctx;

/* Attention's fixed operation orders (every path, whatever the batch):
 *   score(q, k): lanes l < 8: s0[l] = fma chain over d with d % 16 == l, s1[l] over
 *     d % 16 == l + 8 (d ascending); e[l] = s0[l] + s1[l];
 *     dot = ((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7)); score = dot * scale.
 *   softmax: see softmax_scores (own exp, double sums by t % 4).
 *   out[d] = fma chain of w_t * v_t[d] over t ascending from 0. */
/* K/V rows hold float or fp16 values (kv_cache.f16); every value is read as its exact float,
 * so both element types share one kernel and one order. f16 is a constant in each caller's
 * branch of the always-inline kernels, so each compiles to its own loads. */
static inline float kv_ld1(const void *p, size_t i, int f16) {
    return f16 ? fp16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
#ifdef __AVX2__
static inline __attribute__((always_inline)) __m256 kv_ld8(const void *p, size_t i, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
               : _mm256_loadu_ps((const float *)p + i);
}
#endif

static void score_scalar(const float *q, const void *k, int hd, int f16, float *out) {
    float s0[8] = {0}, s1[8] = {0}, e[8];
    for (int d = 0; d < hd; d++) {
        int l = d % 16;
        if (l < 8) s0[l] = fmaf(q[d], kv_ld1(k, (size_t)d, f16), s0[l]);
        else s1[l - 8] = fmaf(q[d], kv_ld1(k, (size_t)d, f16), s1[l - 8]);
    }
    for (int l = 0; l < 8; l++) e[l] = s0[l] + s1[l];
    *out = ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

/* The G query heads of one KV head (GQA) share every key and value row: the kernels below
 * take G heads at once, so each K/V value is loaded (and converted from fp16) once for all
 * of them. Per head the operations and their order are those stated above. */
#define ATT_G 4     /* query heads per kernel call, at most */
#ifndef ATT_PF
#define ATT_PF 32   /* K/V rows prefetched ahead (into L2): 8 slots' caches stream from DRAM */
#endif

static inline void prefetch_l2(const char *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
}

#ifdef __AVX2__
/* Reduces v[0..7] (key j's lanes e[l] = s0[l] + s1[l] in v[j]) to the 8 scores, canonical order. */
static inline __attribute__((always_inline)) __m256 score_reduce8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

static inline __attribute__((always_inline)) void score8_v(const float *const *q, const int G,
                                                           const void *const *kp, const int hd, const int f16,
                                                           float *const *out) {
    __m256 v[ATT_G][8];
    for (int j = 0; j < 8; j++) {
        __m256 s0[ATT_G], s1[ATT_G];
        for (int g = 0; g < G; g++) s0[g] = s1[g] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            const __m256 k0 = kv_ld8(kp[j], (size_t)d, f16), k1 = kv_ld8(kp[j], (size_t)d + 8, f16);
            for (int g = 0; g < G; g++) {
                s0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + d), k0, s0[g]);
                s1[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + d + 8), k1, s1[g]);
            }
        }
        for (int g = 0; g < G; g++) v[g][j] = _mm256_add_ps(s0[g], s1[g]);
    }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out[g], score_reduce8(v[g]));
}
#endif

#ifdef __AVX512F__
/* 16 lanes: lane l < 8 is score_scalar's s0[l], lane l >= 8 its s1[l - 8] (the same fma chains). */
static inline __attribute__((always_inline)) __m512 kv_ld16(const void *p, size_t i, int f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
               : _mm512_loadu_ps((const float *)p + i);
}

static inline __attribute__((always_inline)) void score8_z(const float *const *q, const int G,
                                                           const void *const *kp, const int hd, const int f16,
                                                           float *const *out) {
    __m256 v[ATT_G][8];
    for (int j = 0; j < 8; j++) {
        __m512 s[ATT_G];
        for (int g = 0; g < G; g++) s[g] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            const __m512 k = kv_ld16(kp[j], (size_t)d, f16);
            for (int g = 0; g < G; g++) s[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q[g] + d), k, s[g]);
        }
        for (int g = 0; g < G; g++)
            v[g][j] = _mm256_add_ps(_mm512_castps512_ps256(s[g]),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s[g]), 1)));
    }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out[g], score_reduce8(v[g]));
}
#define score8_w score8_z
#elif defined(__AVX2__)
#define score8_w score8_v
#endif

/* Scores of the G query heads q[g] against the 8 keys kp[0..7] into out[g][0..7]. */
static void score8(const float *const *q, int G, const void *const *kp, int hd, int f16, float *const *out) {
#ifdef __AVX2__
#define SCORE_G(HD, F16)                                                                     \
    switch (G) {                                                                             \
    case 1: return score8_w(q, 1, kp, HD, F16, out);                                         \
    case 2: return score8_w(q, 2, kp, HD, F16, out);                                         \
    case 3: return score8_w(q, 3, kp, HD, F16, out);                                         \
    default: return score8_w(q, 4, kp, HD, F16, out);                                        \
    }
    if (hd % 16 == 0) {
        if (f16) {
            if (hd == 64) SCORE_G(64, 1)
            SCORE_G(hd, 1)
        }
        if (hd == 64) SCORE_G(64, 0)
        if (hd == 128) SCORE_G(128, 0)
        SCORE_G(hd, 0)
    }
#undef SCORE_G
#endif
    for (int g = 0; g < G; g++)
        for (int j = 0; j < 8; j++) score_scalar(q[g], kp[j], hd, f16, out[g] + j);
}

/* o[g][0..hd) = sum over t < nt of w[g][t] * v_t (v_t = row t of vb, vst values apart) for
 * the G heads, canonical order. Columns in chunks of 32 (64 with AVX-512: 4 vectors) keep G * 4
 * accumulators; the 512-bit and 256-bit loops differ only in vector width. */
static inline __attribute__((always_inline)) void wsum_k(const float *const *w, const int G, const void *vb,
                                                         size_t vst, int nt, int hd, const int f16,
                                                         float *const *o) {
    int d = 0;
#ifdef __AVX512F__
    /* columns in chunks of 64 (4 x 16 lanes): the same fma chain per column */
    for (; d + 64 <= hd; d += 64) {
        __m512 a[ATT_G][4];
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) a[g][c] = _mm512_setzero_ps();
        for (int t = 0; t < nt; t++) {
            __m512 vt[4];
            if (d == 0 && t + ATT_PF < nt) prefetch_l2((const char *)vb + (size_t)(t + ATT_PF) * vst * (f16 ? 2 : 4), hd * (f16 ? 2 : 4));
            for (int c = 0; c < 4; c++) vt[c] = kv_ld16(vb, (size_t)t * vst + d + 16 * c, f16);
            for (int g = 0; g < G; g++) {
                const __m512 wt = _mm512_set1_ps(w[g][t]);
                for (int c = 0; c < 4; c++) a[g][c] = _mm512_fmadd_ps(wt, vt[c], a[g][c]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(o[g] + d + 16 * c, a[g][c]);
    }
#endif
#ifdef __AVX2__
    for (; d + 32 <= hd; d += 32) {
        __m256 a[ATT_G][4];
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) a[g][c] = _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            __m256 vt[4];
            if (d == 0 && t + ATT_PF < nt) prefetch_l2((const char *)vb + (size_t)(t + ATT_PF) * vst * (f16 ? 2 : 4), hd * (f16 ? 2 : 4));
            for (int c = 0; c < 4; c++) vt[c] = kv_ld8(vb, (size_t)t * vst + d + 8 * c, f16);
            for (int g = 0; g < G; g++) {
                const __m256 wt = _mm256_broadcast_ss(w[g] + t);
                for (int c = 0; c < 4; c++) a[g][c] = _mm256_fmadd_ps(wt, vt[c], a[g][c]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(o[g] + d + 8 * c, a[g][c]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a[ATT_G];
        for (int g = 0; g < G; g++) a[g] = _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            const __m256 vt = kv_ld8(vb, (size_t)t * vst + d, f16);
            for (int g = 0; g < G; g++) a[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[g] + t), vt, a[g]);
        }
        for (int g = 0; g < G; g++) _mm256_storeu_ps(o[g] + d, a[g]);
    }
#endif
    for (; d < hd; d++)
        for (int g = 0; g < G; g++) {
            float a = 0.0f;
            for (int t = 0; t < nt; t++) a = fmaf(w[g][t], kv_ld1(vb, (size_t)t * vst + d, f16), a);
            o[g][d] = a;
        }
}

static void wsum_v(const float *const *w, int G, const void *vb, size_t vst, int nt, int hd, int f16,
                   float *const *o) {
#define WSUM_G(F16)                                                                          \
    switch (G) {                                                                             \
    case 1: wsum_k(w, 1, vb, vst, nt, hd, F16, o); break;                                    \
    case 2: wsum_k(w, 2, vb, vst, nt, hd, F16, o); break;                                    \
    case 3: wsum_k(w, 3, vb, vst, nt, hd, F16, o); break;                                    \
    default: wsum_k(w, 4, vb, vst, nt, hd, F16, o); break;                                   \
    }
    if (f16) WSUM_G(1)
    else WSUM_G(0)
#undef WSUM_G
}

/* In place over sc[0..nt): sc = scale * sc; p = exp(sc - max); sum of p in double, four
 * partial sums by t % 4 combined as (s0 + s1) + (s2 + s3); sc = p * (float)(1 / sum). */
static void softmax_scores(float *sc, int nt, float scale) {
    int t = 0;
    float mx = -INFINITY;
#ifdef __AVX2__
    __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(-INFINITY);
    for (; t + 8 <= nt; t += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(sc + t), vs);
        _mm256_storeu_ps(sc + t, v);
        vm = _mm256_max_ps(vm, v);
    }
    float m8[8];
    _mm256_storeu_ps(m8, vm);
    for (int j = 0; j < 8; j++) mx = m8[j] > mx ? m8[j] : mx;
#endif
    for (; t < nt; t++) {
        sc[t] *= scale;
        if (sc[t] > mx) mx = sc[t];
    }
    double acc[4] = {0, 0, 0, 0};
    t = 0;
#ifdef __AVX2__
    __m256 vmx = _mm256_set1_ps(mx);
    __m256d a0 = _mm256_setzero_pd();
    for (; t + 8 <= nt; t += 8) {
        __m256 p = qexp_v(_mm256_sub_ps(_mm256_loadu_ps(sc + t), vmx));
        _mm256_storeu_ps(sc + t, p);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    _mm256_storeu_pd(acc, a0);
#endif
    for (; t < nt; t++) {
        sc[t] = qexp_s(sc[t] - mx);
        acc[t % 4] += sc[t];
    }
    float inv = (float)(1.0 / ((acc[0] + acc[1]) + (acc[2] + acc[3])));
    for (t = 0; t < nt; t++) sc[t] *= inv;
}

/* One task: the rows of one block x the query heads of one KV head, up to ATT_G heads per pass. */
static void attn_task(void *vctx, int task) {
    const attn_ctx *A = vctx;
    kv_cache *kv = A->kv;
    const int hd = A->hd, l = A->l, kh = task % A->nkv, b = task / A->nkv;
    const int i0 = A->blk[b], i1 = A->blk[b + 1], s = A->rows[i0].slot;
    const size_t kvd = (size_t)kv->kv_dim, koff = (size_t)kh * hd * kv_elt(kv);
    float *scr = A->ascr + (size_t)pool_thread_id() * ATT_G * (size_t)A->sc_len;
    for (int i = i0; i < i1; i++) {
        const int nt = A->rows[i].pos + 1;
        for (int g0 = 0; g0 < A->grp; g0 += ATT_G) {
            const int G = A->grp - g0 < ATT_G ? A->grp - g0 : ATT_G;
            const float *qv[ATT_G];
            float *sc[ATT_G], *o[ATT_G];
            for (int g = 0; g < G; g++) {
                const int hh = kh * A->grp + g0 + g;
                qv[g] = A->Q + (size_t)i * A->qd + (size_t)hh * hd;
                sc[g] = scr + (size_t)g * A->sc_len;
                o[g] = A->att + (size_t)i * A->qd + (size_t)hh * hd;
            }
            for (int t0 = 0; t0 < nt; t0 += 8) {
                const void *kp[8];
                float *out[ATT_G];
                for (int j = 0; j < 8; j++) {
                    kp[j] = (const char *)kv_k(kv, s, l, t0 + j < nt ? t0 + j : nt - 1) + koff;
                    if (g0 == 0 && t0 + j + ATT_PF < nt) prefetch_l2((const char *)kv_k(kv, s, l, t0 + j + ATT_PF) + koff, hd * (int)kv_elt(kv));
                }
                for (int g = 0; g < G; g++) out[g] = sc[g] + t0;
                score8(qv, G, kp, hd, kv->f16, out);
            }
            for (int g = 0; g < G; g++) softmax_scores(sc[g], nt, A->scale);
            wsum_v((const float *const *)sc, G, (const char *)kv_v(kv, s, l, 0) + koff, kvd, nt, hd, kv->f16, o);
        }
    }
}

static int forward_inner(model *m, kv_cache *kv, fwd_row *rows, int n) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const int d = c->d_model, hd = c->head_dim, nh = c->n_heads, nkv = c->n_kv_heads;
    const int qd = nh * hd, kvd = nkv * hd, grp = nh / nkv, rdim = P->rope_dim;
    int maxpos = 0;
    for (int i = 0; i < n; i++)
        if (rows[i].pos > maxpos) maxpos = rows[i].pos;
    int nthr = pool_threads();
    float *x = fb(&P->x, (size_t)n * d), *h = fb(&P->h, (size_t)n * d);
    float *Q = fb(&P->q, (size_t)n * qd), *Kb = fb(&P->k, (size_t)n * kvd), *Vb = fb(&P->v, (size_t)n * kvd);
    float *att = fb(&P->att, (size_t)n * qd), *tmp = fb(&P->tmp, (size_t)n * d);
    const int sc_len = (maxpos + 8) / 8 * 8;
    float *ascr = fb(&P->ascr, (size_t)nthr * ATT_G * (size_t)sc_len);
    /* attention blocks: up to ATT_R consecutive rows of one slot at consecutive positions */
    int *blk = ib(&P->ablk, (size_t)n + 1), nblk = 0;
    if (!blk) return -1;
    for (int i = 0; i < n; i++)
        if (i == 0 || i - blk[nblk - 1] >= ATT_R || rows[i].slot != rows[i - 1].slot || rows[i].pos != rows[i - 1].pos + 1)
            blk[nblk++] = i;
    blk[nblk] = n;
    float *rope = fb(&P->rope, (size_t)n * rdim);
    if (!x || !h || !Q || !Kb || !Vb || !att || !tmp || !ascr || !rope) return -1;

    for (int i = 0; i < n; i++) {
        qmat_row(&m->tok_embd, rows[i].token, x + (size_t)i * d);
        rope_table(P, rows[i].pos, rope + (size_t)i * rdim);
    }
    const float scale = 1.0f / sqrtf((float)hd);

    for (int l = 0; l < c->n_layers; l++) {
        const layer_w *L = &m->layers[l];
        double t0 = mnow();
        /* h = attn_norm(x); the previous layer's FFN output is added to x first */
        add_norm(x, l > 0 ? tmp : NULL, h, L->attn_norm, n, d, c->rms_eps);
        {
            const qmat *ws[3] = {&L->q, &L->k, &L->v};
            float *os[3] = {Q, Kb, Vb};
            mm_many(P, h, n, ws, os, 3);
        }
        rope_ctx R = {kv, rows, Q, Kb, Vb, rope, n, l, nh, nkv, hd, rdim};
        par_rows(rope_chunk, &R, n);
        /* threads only when there is enough work to pay for them (results do not depend
         * on it: each (row, head) task is computed the same way either way) */
        long awork = (long)n * nh * (long)(maxpos + 1) * hd;
        attn_ctx A = {kv, rows, blk, Q, att, ascr, sc_len, l, nh, nkv, hd, qd, grp, scale};
        if (awork > (1L << 15)) pool_run(attn_task, &A, nblk * nkv);
        else
            for (int task = 0; task < nblk * nkv; task++) attn_task(&A, task);
        mm(P, &L->o, att, n, tmp);
        m->perf.t_attn += mnow() - t0;

        add_norm(x, tmp, h, L->ffn_norm, n, d, c->rms_eps);
        if (L->moe_row < 0) {
            t0 = mnow();
            float *g = fb(&P->fg, (size_t)n * c->d_ff), *u = fb(&P->fu, (size_t)n * c->d_ff);
            if (!g || !u) return -1;
            const qmat *ws[2] = {&L->ffn_gate, &L->ffn_up};
            float *os[2] = {g, u};
            mm_many(P, h, n, ws, os, 2);
            for (size_t q = 0; q < (size_t)n * c->d_ff; q++) g[q] = qsilu_mul(g[q], u[q]);
            mm(P, &L->ffn_down, g, n, tmp);
            m->perf.t_dense += mnow() - t0;
        } else {
            if (moe_ffn(m, L, h, n, rows, tmp) != 0) return -1;
        }
    }
    add_norm(x, tmp, NULL, NULL, n, d, c->rms_eps);

    double t0 = mnow();
    int nl = 0;
    for (int i = 0; i < n; i++) nl += rows[i].logits != NULL;
    if (nl > 0) {
        float *hin = fb(&P->hin, (size_t)nl * d), *hout = fb(&P->hout, (size_t)nl * c->vocab);
        if (!hin || !hout) return -1;
        int j = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].logits) rmsnorm(hin + (size_t)(j++) * d, x + (size_t)i * d, m->output_norm, d, c->rms_eps);
        mm(P, &m->output, hin, nl, hout);
        j = 0;
        for (int i = 0; i < n; i++)
            if (rows[i].logits) memcpy(rows[i].logits, hout + (size_t)(j++) * c->vocab, sizeof(float) * c->vocab);
    }
    m->perf.t_head += mnow() - t0;
    m->perf.forwards++;
    return 0;
}

int model_forward(model *m, kv_cache *kv, fwd_row *rows, int n) {
    if (n <= 0) return 0;
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    if (!P || !kv || kv->n_layers != c->n_layers || kv->kv_dim != c->n_kv_heads * c->head_dim) return -1;
    int *slot0 = ib(&P->slot0, (size_t)kv->n_slots);
    if (!slot0) return -1;
    for (int s = 0; s < kv->n_slots; s++) slot0[s] = -1;
    /* Validate rows and append their tokens to the slot histories; undone on failure. */
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int s = rows[i].slot;
        if (s < 0 || s >= kv->n_slots || rows[i].token < 0 || rows[i].token >= c->vocab) {
            rc = -1;
            break;
        }
        kv_slot *sl = &kv->slots[s];
        if (slot0[s] < 0) slot0[s] = sl->n_pos;
        if (rows[i].pos != sl->n_pos || rows[i].pos >= kv->ctx || kv_reserve(kv, s, rows[i].pos + 1) != 0) {
            rc = -1;
            break;
        }
        sl->tokens[rows[i].pos] = rows[i].token;
        sl->n_pos = rows[i].pos + 1;
    }
    if (rc == 0) rc = forward_inner(m, kv, rows, n);
    if (rc != 0)
        for (int s = 0; s < kv->n_slots; s++)
            if (slot0[s] >= 0) kv_truncate(kv, s, slot0[s]);
    return rc;
}
