/* model_load.c — opening a GGUF model: the architecture's hooks (arch.h), the common parts
 * (tokenizer, embeddings, head, expert store), validation with one-line refusals, packing the
 * dense matrices into the kernels' layout, the K/V fingerprint; and model_free.
 * The loading helpers here (ld_*) are the building blocks of the arch_<name>.c files. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "arch.h"
#include "mem.h"
#include "quant_iqlow.h"

/* ---------------------------------------------------------------- architectures */

static const arch_ops *const arch_table[] = {&arch_llama, &arch_qwen3moe, &arch_olmoe, &arch_qwen2moe,
                                            &arch_granitemoe, &arch_glm4moe, &arch_gptoss, &arch_qwen35moe,
                                            &arch_qwen3next};
#define N_ARCH (sizeof arch_table / sizeof arch_table[0])

const arch_ops *arch_find(const char *name) {
    for (size_t i = 0; i < N_ARCH; i++)
        if (strcmp(arch_table[i]->name, name) == 0) return arch_table[i];
    return NULL;
}

const char *arch_names(void) {
    static char buf[256];
    if (!buf[0]) {
        size_t at = 0;
        for (size_t i = 0; i < N_ARCH && at < sizeof buf; i++)
            at += (size_t)snprintf(buf + at, sizeof buf - at, i ? ", %s" : "%s", arch_table[i]->name);
    }
    return buf;
}

/* ---------------------------------------------------------------- helpers */

int model_fail(char *err, size_t errlen, const char *fmt, ...) {
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

const char *ld_mat_types(void) { return "F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, MXFP4"; }

const char *ld_key(const model *m, const char *suffix, char *buf, size_t cap) {
    snprintf(buf, cap, "%s.%s", m->arch, suffix);
    return buf;
}

#define KEY_LIM (1 << 24)
int ld_int_req(const model *m, const char *suffix, int *dst, char *err, size_t errlen) {
    char k[128];
    int64_t v = gguf_get_int(&m->g, ld_key(m, suffix, k, sizeof k), -1);
    if (v < 1 || v > KEY_LIM) return model_fail(err, errlen, "%s is missing or invalid", k);
    *dst = (int)v;
    return 0;
}

int ld_int_opt(const model *m, const char *suffix, int def, int *dst, char *err, size_t errlen) {
    char k[128];
    int64_t v = gguf_get_int(&m->g, ld_key(m, suffix, k, sizeof k), def);
    if (v < 0 || v > KEY_LIM) return model_fail(err, errlen, "%s = %lld is invalid", k, (long long)v);
    *dst = (int)v;
    return 0;
}

static void shape_str(char *buf, size_t cap, const uint64_t *ne, int nd) {
    size_t at = 0;
    at += (size_t)snprintf(buf + at, cap - at, "[");
    for (int i = 0; i < nd && at < cap; i++)
        at += (size_t)snprintf(buf + at, cap - at, i ? ", %llu" : "%llu", (unsigned long long)ne[i]);
    if (at < cap) snprintf(buf + at, cap - at, "]");
}

/* Finds `name` and checks its shape (nd dims e[0..nd), missing trailing dims = 1).
 * *t = NULL and 0 when optional and absent. */
int ld_tensor(const gguf_file *g, const char *name, int nd, const uint64_t *e, int optional,
                      const gguf_tensor **t, char *err, size_t errlen) {
    *t = gguf_find_tensor(g, name);
    if (!*t) return optional ? 0 : model_fail(err, errlen, "%s: tensor missing", name);
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
        return model_fail(err, errlen, "%s: expected %s, got %s", name, a, b);
    }
    return 0;
}

int ld_mat_type_ok(uint32_t t)
{
    return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16 || t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q4_1 ||
           t == GGML_Q5_0 || t == GGML_Q5_1 ||
           (t >= GGML_Q2_K && t <= GGML_Q6_K) || t == GGML_IQ4_NL || t == GGML_IQ4_XS ||
           t == GGML_MXFP4 || qiql_is(t);
}

int ld_mat(const gguf_file *g, const char *name, uint64_t cols, uint64_t rows, int optional, qmat *q,
                   char *err, size_t errlen) {
    const gguf_tensor *t;
    uint64_t e[2] = {cols, rows};
    memset(q, 0, sizeof *q);
    if (ld_tensor(g, name, 2, e, optional, &t, err, errlen) != 0) return -1;
    if (!t) return 0;
    if (!ld_mat_type_ok(t->type))
        return model_fail(err, errlen, "%s: type %s is not supported (%s)", name, ggml_type_name(t->type), ld_mat_types());
    q->type = t->type;
    q->rows = (int)rows;
    q->cols = (int)cols;
    q->row_bytes = ggml_row_bytes(t->type, cols);
    q->data = t->data;
    if (q->row_bytes == 0) return model_fail(err, errlen, "%s: bad row length for %s", name, ggml_type_name(t->type));
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

/* F32 [n] vector, an owned copy (F16 / BF16 converted). NULL result with 0 when optional+absent.
 * Never a pointer into the mapping: the page cache holds the file in large folios, and one
 * fault on a small tensor maps the whole folio around it into this process (serving one
 * conversation with the norms read in place: +72 MB of file pages in RSS). */
int ld_vec(model *m, const char *name, int n, int optional, const float **out, char *err, size_t errlen) {
    uint64_t e[1] = {(uint64_t)n};
    return ld_vec_nd(m, name, 1, e, optional, out, err, errlen);
}

int ld_vec2(model *m, const char *name, int n0, int n1, int optional, const float **out, char *err, size_t errlen) {
    uint64_t e[2] = {(uint64_t)n0, (uint64_t)n1};
    return ld_vec_nd(m, name, n1 == 1 ? 1 : 2, e, optional, out, err, errlen);
}

int ld_vec_nd(model *m, const char *name, int nd, const uint64_t *e, int optional, const float **out, char *err,
              size_t errlen) {
    const gguf_tensor *t;
    size_t n = 1;
    for (int i = 0; i < nd; i++) n *= (size_t)e[i];
    *out = NULL;
    if (ld_tensor(&m->g, name, nd, e, optional, &t, err, errlen) != 0) return -1;
    if (!t) return 0;
    if (t->type != GGML_F32 && t->type != GGML_F16 && t->type != GGML_BF16)
        return model_fail(err, errlen, "%s: type %s is not supported for a vector (F32, F16 or BF16)", name,
                    ggml_type_name(t->type));
    float *b = malloc(sizeof(float) * n);
    if (!b || own(m->priv, b) != 0) {
        free(b);
        return model_fail(err, errlen, "%s: out of memory", name);
    }
    if (t->type == GGML_F32) {
        if (read_mapped(&m->g, t->data, sizeof(float) * n, b) != 0)
            return model_fail(err, errlen, "%s: cannot read the file", name);
    } else {
        uint16_t *h = malloc(2 * n);
        if (!h || read_mapped(&m->g, t->data, 2 * n, h) != 0) {
            free(h);
            return model_fail(err, errlen, "%s: cannot read the file", name);
        }
        for (size_t i = 0; i < n; i++) {
            if (t->type == GGML_F16) b[i] = fp16_to_f32(h[i]);
            else {     /* BF16: the upper half of the float's bits (a converter's bf16 output keeps
                        * 2-D [n, 1] vectors such as qwen2moe's ffn_gate_inp_shexp in it) */
                uint32_t u = (uint32_t)h[i] << 16;
                memcpy(&b[i], &u, sizeof u);
            }
        }
        free(h);
    }
    *out = b;
    return 0;
}

/* The file pages of [p, p + n) released from this process and the page cache (the whole pages
 * inside the range; they are re-read from the file if touched again). */
static void drop_mapped(model *m, const uint8_t *p, size_t n) {
    uintptr_t a0 = ((uintptr_t)p + 4095) & ~(uintptr_t)4095;
    uintptr_t a1 = ((uintptr_t)p + n) & ~(uintptr_t)4095;
    if (a1 > a0) madvise((void *)a0, a1 - a0, MADV_DONTNEED);
    gguf_drop_cache(m->g.fd, (uint64_t)(p - m->g.map), n);
}

/* The file pages of [p, p + n) read in the background, in large requests: the mapping has no
 * readahead (gguf_open), so a slab would otherwise fault in a page at a time. Exactly these
 * pages: the packing touches each of them (waiting for any still in flight) before they are
 * dropped, so no read of the load is still landing in the page cache after its last drop. */
static void will_need(const model *m, const uint8_t *p, size_t n) {
    gguf_will_need(m->g.fd, (uint64_t)(p - m->g.map), n);
}

#define PACK_SLAB_BYTES ((size_t)16 << 20)

/* w's packed layout into b, a 16 MB slab of file rows at a time; drop: each slab's file pages
 * are released as soon as it is packed, so the file's copy and the packed copy of a big matrix
 * (a 151,936-row head: 250 MB) are never both in memory, only two slabs of them (the one packed
 * and the next, being read). */
static void pack_slabs(model *m, const qmat *w, uint8_t *b, int drop) {
    size_t per = PACK_SLAB_BYTES / (w->row_bytes ? w->row_bytes : 1);
    const int slab = per < 8 ? 8 : (int)(per & ~(size_t)7);
    for (int r = 0; r < w->rows; r += slab) {
        const int n = slab < w->rows - r ? slab : w->rows - r;
        /* this slab (the first), and the next one, read while this one is packed */
        if (r == 0) will_need(m, w->data, (size_t)n * w->row_bytes);
        if (r + n < w->rows) {
            const int nn = slab < w->rows - r - n ? slab : w->rows - r - n;
            will_need(m, w->data + (size_t)(r + n) * w->row_bytes, (size_t)nn * w->row_bytes);
        }
        if (qpack_rows(w, r, slab, b) != 0) {
            will_need(m, w->data, (size_t)w->rows * w->row_bytes);
            qpack(w, b);
            return;
        }
        if (drop) drop_mapped(m, w->data + (size_t)r * w->row_bytes, (size_t)n * w->row_bytes);
    }
}

/* Replaces a mapped matrix by an owned copy, packed when packable (a row-major copy
 * otherwise: the F32 router). drop: the original's file pages are released from this process
 * (re-read from the file if touched). */
static int pack_mat(model *m, qmat *w, int drop) {
    if (m->exact || w->rows <= 0 || w->packed) return 0;
    const int pk = qpack_ok(w->type, w->rows, w->cols);
    size_t bytes = pk ? qpack_bytes(w->type, w->rows, w->cols) : (size_t)w->rows * w->row_bytes;
    uint8_t *b = weights_alloc(bytes);
    if (!b || own(m->priv, (float *)(void *)b) != 0) {
        free(b);
        return -1;
    }
    if (pk) pack_slabs(m, w, b, drop);
    else if (read_mapped(&m->g, w->data, bytes, b) != 0) return -1;
    if (drop) drop_mapped(m, w->data, (size_t)w->rows * w->row_bytes);  /* the slabs' edge pages too */
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

/* ---------------------------------------------------------------- building blocks of arch files */

/* <arch>.rope.scaling.*, as llama.cpp reads them: type none | linear (the default when only a
 * factor is given) | yarn; factor (or the older rope.scale_linear), 0 = none; attn_factor;
 * original_context_length (YaRN's, else context_length); yarn_beta_fast / yarn_beta_slow /
 * yarn_ext_factor. Anything else (longrope, a YaRN log multiplier or attention factor) is refused. */
static int rope_scaling(model *m, char *err, size_t errlen) {
    model_config *c = &m->c;
    const gguf_file *g = &m->g;
    char k[128];
    c->rope_freq_scale = c->rope_attn_factor = 1.0f;
    c->rope_ext_factor = 0.0f;
    c->rope_beta_fast = 32.0f;
    c->rope_beta_slow = 1.0f;
    c->rope_ctx_orig = c->ctx_train;
    char *type = gguf_get_string(g, ld_key(m, "rope.scaling.type", k, sizeof k));
    int yarn = 0, none = 0;
    if (type) {
        yarn = strcmp(type, "yarn") == 0;
        none = strcmp(type, "none") == 0;
        if (!yarn && !none && strcmp(type, "linear") != 0) {
            model_fail(err, errlen, "%s '%s' is not supported (none, linear, yarn)", k, type);
            free(type);
            return -1;
        }
        free(type);
    }
    double f = gguf_get_float(g, ld_key(m, "rope.scaling.factor", k, sizeof k), NAN);
    if (isnan(f)) f = gguf_get_float(g, ld_key(m, "rope.scale_linear", k, sizeof k), 0.0);
    if (!isfinite(f) || f < 0.0) return model_fail(err, errlen, "%s = %g is invalid", k, f);
    if (f != 0.0 && !none) c->rope_freq_scale = (float)(1.0 / f);
    const char *fk[] = {"rope.scaling.attn_factor", "rope.scaling.yarn_beta_fast", "rope.scaling.yarn_beta_slow",
                        "rope.scaling.yarn_ext_factor"};
    float *fv[] = {&c->rope_attn_factor, &c->rope_beta_fast, &c->rope_beta_slow, &c->rope_ext_factor};
    if (yarn) c->rope_ext_factor = 1.0f;
    for (int i = 0; i < 4; i++) {
        double v = gguf_get_float(g, ld_key(m, fk[i], k, sizeof k), *fv[i]);
        if (!isfinite(v) || v < 0.0 || v > 1e6) return model_fail(err, errlen, "%s = %g is invalid", k, v);
        *fv[i] = (float)v;
    }
    const char *no[] = {"rope.scaling.yarn_log_multiplier", "rope.scaling.yarn_attn_factor"};
    const double nov[] = {0.0, 1.0};
    for (int i = 0; i < 2; i++) {
        double v = gguf_get_float(g, ld_key(m, no[i], k, sizeof k), nov[i]);
        if (v != nov[i]) return model_fail(err, errlen, "%s = %g is not supported", k, v);
    }
    if (ld_int_opt(m, "rope.scaling.original_context_length", c->ctx_train, &c->rope_ctx_orig, err, errlen)) return -1;
    if (c->rope_ext_factor != 0.0f && c->rope_ctx_orig < 1)
        return model_fail(err, errlen, "%s.rope.scaling.original_context_length (or context_length) is missing for YaRN",
                          m->arch);
    return 0;
}

/* <arch>.nextn_predict_layers: the file's last blocks are MTP / NextN heads (GLM-4.5, Qwen3.5),
 * counted in block_count but not in the trunk (llama.cpp's n_layer()); their tensors stay in the
 * file, unread. */
static int trailing_blocks(model *m, char *err, size_t errlen) {
    model_config *c = &m->c;
    char k[128];
    int64_t nextn = gguf_get_int(&m->g, ld_key(m, "nextn_predict_layers", k, sizeof k), 0);
    if (nextn < 0 || nextn >= c->n_layers) return model_fail(err, errlen, "%s = %lld is invalid", k, (long long)nextn);
    c->n_nextn = (int)nextn;
    c->n_layers -= (int)nextn;
    return 0;
}

/* The routing's defaults (moe_opts: softmax over the selected, SiLU experts) and the file's
 * grouped top-k, <arch>.expert_group_count / expert_group_used_count, which llama.cpp's MoE
 * applies for any architecture (groups > 1). */
static int moe_groups(model *m, char *err, size_t errlen) {
    moe_opts *o = &m->priv->moe;
    char k[128];
    *o = (moe_opts){GATING_SOFTMAX, 0, 1.0f, 0, 0, 0, MOE_ACT_SILU, 0.0f, 0.0f};
    int64_t G = gguf_get_int(&m->g, ld_key(m, "expert_group_count", k, sizeof k), 0);
    int64_t U = gguf_get_int(&m->g, ld_key(m, "expert_group_used_count", k, sizeof k), 0);
    const int E = m->c.n_experts;
    if (G <= 1) return 0;
    if (G > 64 || E % G || U < 1 || U > G)
        return model_fail(err, errlen, "%s.expert_group_count %lld / expert_group_used_count %lld are invalid for %d "
                          "experts (groups 2..64 dividing them, 1..groups used)", m->arch, (long long)G, (long long)U, E);
    o->n_group = (int)G, o->group_used = (int)U;
    return 0;
}

int ld_hparams_common(model *m, int own_head_dim, char *err, size_t errlen) {
    model_config *c = &m->c;
    const gguf_file *g = &m->g;
    char k[128];
    if (ld_int_req(m, "block_count", &c->n_layers, err, errlen) ||
        ld_int_req(m, "embedding_length", &c->d_model, err, errlen) ||
        ld_int_req(m, "attention.head_count", &c->n_heads, err, errlen) ||
        ld_int_opt(m, "attention.head_count_kv", c->n_heads, &c->n_kv_heads, err, errlen) ||
        ld_int_opt(m, "feed_forward_length", 0, &c->d_ff, err, errlen) ||
        ld_int_opt(m, "context_length", 0, &c->ctx_train, err, errlen) ||
        ld_int_opt(m, "expert_count", 0, &c->n_experts, err, errlen) ||
        ld_int_opt(m, "expert_used_count", 0, &c->top_k, err, errlen) ||
        ld_int_opt(m, "expert_feed_forward_length", 0, &c->d_expert, err, errlen) ||
        ld_int_opt(m, "expert_shared_feed_forward_length", 0, &c->d_shexp, err, errlen))
        return -1;
    c->rope_base = (float)gguf_get_float(g, ld_key(m, "rope.freq_base", k, sizeof k), 10000.0);
    c->rms_eps = (float)gguf_get_float(g, ld_key(m, "attention.layer_norm_rms_epsilon", k, sizeof k), 1e-5);
    if (c->n_kv_heads < 1 || c->n_heads % c->n_kv_heads != 0)
        return model_fail(err, errlen, "head_count %d is not a multiple of head_count_kv %d", c->n_heads, c->n_kv_heads);
    if (!own_head_dim && c->d_model % c->n_heads != 0)
        return model_fail(err, errlen, "embedding_length %d is not a multiple of head_count %d", c->d_model, c->n_heads);
    c->head_dim_k = c->head_dim_v = c->d_model / c->n_heads;
    int64_t kl = gguf_get_int(g, ld_key(m, "attention.key_length", k, sizeof k), c->head_dim_k);
    int64_t vl = gguf_get_int(g, ld_key(m, "attention.value_length", k, sizeof k), c->head_dim_v);
    if (own_head_dim && kl >= 2 && kl <= 1024 && kl % 2 == 0 && vl >= 1 && vl <= 1024) {
        c->head_dim_k = (int)kl;
        c->head_dim_v = (int)vl;
    }
    if (kl != c->head_dim_k || vl != c->head_dim_v)
        return model_fail(err, errlen, "attention key/value length %lld/%lld != embedding_length/head_count %d is not supported",
                          (long long)kl, (long long)vl, c->d_model / c->n_heads);
    int64_t rd = gguf_get_int(g, ld_key(m, "rope.dimension_count", k, sizeof k), c->head_dim_k);
    if (rd < 2 || rd > c->head_dim_k || rd % 2)
        return model_fail(err, errlen, "%s %lld is invalid for key_length %d", k, (long long)rd, c->head_dim_k);
    c->rope_dim = (int)rd;
    if (!(c->rope_base > 0.0f) || !isfinite(c->rope_base))
        return model_fail(err, errlen, "%s is invalid", ld_key(m, "rope.freq_base", k, sizeof k));
    if (!(c->rms_eps >= 0.0f) || !isfinite(c->rms_eps))
        return model_fail(err, errlen, "%s is invalid", ld_key(m, "attention.layer_norm_rms_epsilon", k, sizeof k));
    if (c->n_experts > 0 && (c->top_k < 1 || c->top_k > c->n_experts))
        return model_fail(err, errlen, "%s %d is invalid for %d experts", ld_key(m, "expert_used_count", k, sizeof k),
                          c->top_k, c->n_experts);
    if (c->n_experts == 0) c->top_k = 0;
    c->embd_scale = c->resid_scale = c->logit_scale = 1.0f;
    c->attn_scale = 0.0f;
    if (trailing_blocks(m, err, errlen) != 0 || moe_groups(m, err, errlen) != 0) return -1;
    return rope_scaling(m, err, errlen);
}

void ld_expert_widths(model *m) {
    model_config *c = &m->c;
    const gguf_file *g = &m->g;
    char nm[160];
    if (c->n_experts == 0) return;
    for (int l = 0; l < c->n_layers; l++) {
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_inp.weight", l);
        if (!gguf_find_tensor(g, nm)) continue;
        const gguf_tensor *t;
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_exps.weight", l);
        if (c->d_expert == 0 && (t = gguf_find_tensor(g, nm)) && t->ne[1] <= (uint64_t)KEY_LIM) c->d_expert = (int)t->ne[1];
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_up_exps.weight", l);     /* gate and up fused: twice as wide */
        if (c->d_expert == 0 && (t = gguf_find_tensor(g, nm)) && t->ne[1] <= (uint64_t)KEY_LIM) c->d_expert = (int)(t->ne[1] / 2);
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate.0.weight", l);   /* one tensor per expert (old Mixtral files) */
        if (c->d_expert == 0 && (t = gguf_find_tensor(g, nm)) && t->ne[1] <= (uint64_t)KEY_LIM) c->d_expert = (int)t->ne[1];
        snprintf(nm, sizeof nm, "blk.%d.ffn_gate_shexp.weight", l);
        if (c->d_shexp == 0 && (t = gguf_find_tensor(g, nm)) && t->ne[1] <= (uint64_t)KEY_LIM) c->d_shexp = (int)t->ne[1];
        if (c->d_expert) break;
    }
}

#define NAME(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
int ld_attention(model *m, int l, int qk_norm, const char *ffn_norm, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const gguf_file *g = &m->g;
    layer_w *L = &m->layers[l];
    char nm[160];
    const uint64_t D = (uint64_t)c->d_model, QD = (uint64_t)c->n_heads * (uint64_t)c->head_dim_k,
                   KV = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim_k,
                   VD = (uint64_t)c->n_kv_heads * (uint64_t)c->head_dim_v, OD = (uint64_t)c->n_heads * (uint64_t)c->head_dim_v;
    if (ld_vec(m, NAME("attn_norm.weight"), c->d_model, 0, &L->attn_norm, err, errlen)) return -1;
    snprintf(nm, sizeof nm, "blk.%d.%s.weight", l, ffn_norm);
    if (ld_vec(m, nm, c->d_model, 0, &L->ffn_norm, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_q.weight"), D, QD, 0, &L->q, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_k.weight"), D, KV, 0, &L->k, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_v.weight"), D, VD, 0, &L->v, err, errlen)) return -1;
    if (ld_mat(g, NAME("attn_output.weight"), OD, D, 0, &L->o, err, errlen)) return -1;
    const int full = qk_norm == QK_NORM_FULL, opt = qk_norm == QK_NORM_OPT;
    if (qk_norm != QK_NORM_NONE &&
        (ld_vec(m, NAME("attn_q_norm.weight"), full ? (int)QD : c->head_dim_k, opt, &L->q_norm, err, errlen) ||
         ld_vec(m, NAME("attn_k_norm.weight"), full ? (int)KV : c->head_dim_k, opt, &L->k_norm, err, errlen)))
        return -1;
    if (ld_vec(m, NAME("attn_q.bias"), (int)QD, 1, &L->q_b, err, errlen)) return -1;
    if (ld_vec(m, NAME("attn_k.bias"), (int)KV, 1, &L->k_b, err, errlen)) return -1;
    if (ld_vec(m, NAME("attn_v.bias"), (int)VD, 1, &L->v_b, err, errlen)) return -1;
    return 0;
}

int ld_dense_ffn(model *m, int l, char *err, size_t errlen) {
    const model_config *c = &m->c;
    layer_w *L = &m->layers[l];
    char nm[160];
    if (c->d_ff < 1)
        return model_fail(err, errlen, "blk.%d is a dense layer but %s.feed_forward_length is missing", l, m->arch);
    const uint64_t D = (uint64_t)c->d_model, F = (uint64_t)c->d_ff;
    if (ld_mat(&m->g, NAME("ffn_gate.weight"), D, F, 0, &L->ffn_gate, err, errlen)) return -1;
    if (ld_mat(&m->g, NAME("ffn_up.weight"), D, F, 0, &L->ffn_up, err, errlen)) return -1;
    if (ld_mat(&m->g, NAME("ffn_down.weight"), F, D, 0, &L->ffn_down, err, errlen)) return -1;
    return 0;
}

/* Older llama.cpp Mixtral files (architecture llama, as llama.cpp accepts them): one 2-D tensor per
 * expert, blk.l.ffn_{gate,up,down}.E.weight, which the expert store reads in place of the stacked
 * tensors' slices (src->per, freed by load_blocks). */
static int ld_moe_per_expert(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    const uint64_t D = (uint64_t)m->c.d_model, X = (uint64_t)m->c.d_expert, E = (uint64_t)m->c.n_experts;
    static const char *const kind[3] = {"gate", "up", "down"};
    char nm[160];
    if (!(src->per = calloc(3 * E, sizeof *src->per))) return model_fail(err, errlen, "out of memory");
    for (int k = 0; k < 3; k++)
        for (uint64_t e = 0; e < E; e++) {
            uint64_t dims[2] = {k == 2 ? X : D, k == 2 ? D : X};
            const gguf_tensor **t = &src->per[(uint64_t)k * E + e];
            snprintf(nm, sizeof nm, "blk.%d.ffn_%s.%llu.weight", l, kind[k], (unsigned long long)e);
            if (ld_tensor(&m->g, nm, 2, dims, 0, t, err, errlen)) return -1;
            if (!ld_mat_type_ok((*t)->type))
                return model_fail(err, errlen, "%s: type %s is not supported (%s)", nm, ggml_type_name((*t)->type), ld_mat_types());
        }
    src->layer = l;
    src->gate = src->per[0];
    src->up = src->per[E];
    src->down = src->per[2 * E];
    return 0;
}

int ld_moe_ffn(model *m, int l, expert_layer_src *src, char *err, size_t errlen) {
    const model_config *c = &m->c;
    const gguf_file *g = &m->g;
    layer_w *L = &m->layers[l];
    char nm[160];
    const uint64_t D = (uint64_t)c->d_model, E = (uint64_t)c->n_experts, X = (uint64_t)c->d_expert;
    if (c->d_expert < 1) return model_fail(err, errlen, "blk.%d.ffn_gate_exps.weight: tensor missing", l);
    if (ld_mat(g, NAME("ffn_gate_inp.weight"), D, E, 0, &L->router, err, errlen)) return -1;
    if (ld_vec(m, NAME("ffn_gate_inp.bias"), c->n_experts, 1, &L->router_b, err, errlen)) return -1;
    if (strcmp(m->arch, "llama") == 0 && !gguf_find_tensor(g, NAME("ffn_gate_exps.weight")) &&
        gguf_find_tensor(g, NAME("ffn_gate.0.weight")))
        return ld_moe_per_expert(m, l, src, err, errlen);
    const gguf_tensor *te[3];
    uint64_t eg[3] = {D, X, E}, egu[3] = {D, 2 * X, E}, ed[3] = {X, D, E};
    /* gate and up fused in one tensor (llama.cpp's ffn_gate_up_exps: each expert's gate rows,
     * then its up rows), read as the two halves of each expert's slice; else the two tensors */
    src->fused = !gguf_find_tensor(g, NAME("ffn_gate_exps.weight")) && gguf_find_tensor(g, NAME("ffn_gate_up_exps.weight"));
    if (src->fused) {
        if (gguf_find_tensor(g, NAME("ffn_up_exps.weight")))
            return model_fail(err, errlen, "blk.%d: both ffn_gate_up_exps and ffn_up_exps", l);
        if (ld_tensor(g, NAME("ffn_gate_up_exps.weight"), 3, egu, 0, &te[0], err, errlen)) return -1;
        te[1] = te[0];
    } else if (ld_tensor(g, NAME("ffn_gate_exps.weight"), 3, eg, 0, &te[0], err, errlen) ||
               ld_tensor(g, NAME("ffn_up_exps.weight"), 3, eg, 0, &te[1], err, errlen)) {
        return -1;
    }
    if (ld_tensor(g, NAME("ffn_down_exps.weight"), 3, ed, 0, &te[2], err, errlen)) return -1;
    for (int k = 0; k < 3; k++)
        if (!ld_mat_type_ok(te[k]->type))
            return model_fail(err, errlen, "%.*s: type %s is not supported (%s)", (int)te[k]->name.len,
                              te[k]->name.ptr, ggml_type_name(te[k]->type), ld_mat_types());
    src->layer = l;
    src->gate = te[0];
    src->up = te[1];
    src->down = te[2];
    return 0;
}

int ld_shared_expert(model *m, int l, char *err, size_t errlen) {
    const model_config *c = &m->c;
    layer_w *L = &m->layers[l];
    char nm[160];
    if (c->d_shexp < 1) return model_fail(err, errlen, "blk.%d.ffn_gate_shexp.weight: tensor missing", l);
    const uint64_t D = (uint64_t)c->d_model, S = (uint64_t)c->d_shexp;
    if (ld_mat(&m->g, NAME("ffn_gate_shexp.weight"), D, S, 0, &L->sh_gate, err, errlen)) return -1;
    if (ld_mat(&m->g, NAME("ffn_up_shexp.weight"), D, S, 0, &L->sh_up, err, errlen)) return -1;
    if (ld_mat(&m->g, NAME("ffn_down_shexp.weight"), S, D, 0, &L->sh_down, err, errlen)) return -1;
    return 0;
}
#undef NAME

/* ---------------------------------------------------------------- the load */

/* general.architecture -> its hooks; m->arch set. */
static const arch_ops *load_arch(model *m, char *err, size_t errlen) {
    char *arch = gguf_get_string(&m->g, "general.architecture");
    if (!arch) return model_fail(err, errlen, "general.architecture is missing"), NULL;
    const arch_ops *ops = arch_find(arch);
    if (!ops) model_fail(err, errlen, "architecture '%s' is not supported (supported: %s)", arch, arch_names());
    else snprintf(m->arch, sizeof m->arch, "%s", arch);
    free(arch);
    return ops;
}

/* TOPK: colibri's override of the routed experts per token. */
static int topk_override(model *m, char *err, size_t errlen) {
    model_config *c = &m->c;
    const char *tk = getenv("TOPK");
    if (!tk || !*tk || c->n_experts == 0) return 0;
    char *end;
    long v = strtol(tk, &end, 10);
    if (*end || v < 1 || v > c->n_experts)
        return model_fail(err, errlen, "TOPK=%s is invalid (1..%d experts)", tk, c->n_experts);
    c->top_k = (int)v;
    return 0;
}

/* token_embd, output_norm, output (tied to token_embd when absent). */
static int load_io(model *m, char *err, size_t errlen) {
    const model_config *c = &m->c;
    uint64_t D = (uint64_t)c->d_model, V = (uint64_t)c->vocab;
    if (ld_mat(&m->g, "token_embd.weight", D, V, 0, &m->tok_embd, err, errlen)) return -1;
    if (ld_vec(m, "output_norm.weight", c->d_model, 0, &m->output_norm, err, errlen)) return -1;
    if (ld_mat(&m->g, "output.weight", D, V, 1, &m->output, err, errlen)) return -1;
    if (m->output.rows == 0) m->output = m->tok_embd;
    return 0;
}

/* Every block through the architecture's hook; the MoE blocks become the expert store's rows. */
/* Whether to load the MTP block (expert_opts.mtp): 1, 0 (the file has none), -1 refused. */
static int want_mtp(model *m, const arch_ops *ops, const expert_opts *eo, char *err, size_t errlen) {
    if (!eo || !eo->mtp || m->c.n_nextn == 0) return 0;
    if (!ops->mtp_block || !ops->mtp_forward)
        return model_fail(err, errlen, "the engine runs no MTP block of %s (speculative drafting)", m->arch);
    if (m->c.n_nextn != 1) return model_fail(err, errlen, "%d MTP blocks: the engine drafts with one", m->c.n_nextn);
    return 1;
}

static int load_blocks(model *m, const arch_ops *ops, const expert_opts *eo, char *err, size_t errlen) {
    model_config *c = &m->c;
    const int mtp = want_mtp(m, ops, eo, err, errlen);
    if (mtp < 0) return -1;
    c->n_mtp = mtp;
    const int nl = c->n_layers + mtp;   /* the MTP block last: never in the trunk's loop */
    m->layers = calloc((size_t)nl, sizeof *m->layers);
    expert_layer_src *src = calloc((size_t)nl, sizeof *src);
    int rc = -1;
    if (!m->layers || !src) {
        model_fail(err, errlen, "out of memory");
        goto out;
    }
    c->n_moe_rows = 0;
    for (int l = 0; l < nl; l++) m->layers[l].rec_row = -1;   /* a hybrid's block hook sets them */
    for (int l = 0; l < nl; l++) {
        m->layers[l].moe_row = -1;
        int k = ops->block(m, l, &src[c->n_moe_rows], err, errlen);
        if (k < 0 || (l == c->n_layers && ops->mtp_block(m, l, err, errlen) != 0)) goto out;
        if (k == 1) m->layers[l].moe_row = c->n_moe_rows++;
    }
    if (mtp) m->layers[c->n_layers].next_moe = -1;     /* the block reads ahead nothing */
    for (int l = c->n_layers - 1, next = -1; l >= 0; l--) {     /* the read-ahead's target */
        m->layers[l].next_moe = next;
        if (m->layers[l].moe_row >= 0) next = l;
    }
    if (c->n_moe_rows == 0) c->d_expert = c->d_shexp = 0;
    expert_opts def;
    memset(&def, 0, sizeof def);
    def.ram_budget = SIZE_MAX;
    m->es = es_create(&m->g, src, c->n_moe_rows, c->n_moe_rows ? c->n_experts : 0, eo ? eo : &def,
                      fnv1a32_local(m->arch), c->n_layers, err, errlen);
    if (m->es) rc = 0;
out:
    for (int l = 0; src && l < nl; l++) free(src[l].per);
    free(src);
    return rc;
}

/* The file pages the kernel read ahead around the dense tensors'
 * reads, which no drop covered (on the 48-layer 30B-shaped file the first 9 MB of every layer's
 * gate experts after its router and the last 4 MB of its downs before the next attention: 0.66 GB
 * of page cache charged to the engine's cgroup, with or without a budget). The weights' one copy
 * is the engine's own; pages still mapped (the untied embedding's rows) stay. EXACT reads the
 * mapping in place: its pages are the weights. Called after each layer is packed, the last of the
 * load's reads (so they never pile up: they were the load's peak). */
static void drop_readahead(model *m) {
    if (!m->exact) gguf_drop_cache(m->g.fd, 0, m->g.size);
}

/* Dense matrices into the interleaved layout of the matmul kernels (owned copies; the file
 * pages of the originals are dropped). A tied head also serves the embedding rows (qmat_row
 * reads the packed layout), so token_embd's pages are not kept either. */
static int pack_all(model *m, char *err, size_t errlen) {
    const int tied = m->output.data == m->tok_embd.data;
    if (pack_mat(m, &m->output, 1) != 0) return model_fail(err, errlen, "output.weight: out of memory or unreadable");
    if (tied) m->tok_embd = m->output;
    else if (!m->exact && m->tok_embd.rows > 0) {
        /* an untied embedding stays mapped and is read a row per token: without readahead or
         * fault-around (a 1 KB row faulted 2-4.5 MB of the file per token on a 151,936-row table) */
        uintptr_t a0 = (uintptr_t)m->tok_embd.data & ~(uintptr_t)4095;
        uintptr_t a1 = (uintptr_t)m->tok_embd.data + (size_t)m->tok_embd.rows * m->tok_embd.row_bytes;
        madvise((void *)a0, a1 - a0, MADV_RANDOM);
    }
    if (pack_mat(m, &m->mtp.eh_proj, 1) != 0) return model_fail(err, errlen, "nextn.eh_proj: out of memory or unreadable");
    for (int l = 0; l < m->c.n_layers + m->c.n_mtp; l++) {
        layer_w *L = &m->layers[l];
        qmat *ms[] = {&L->q, &L->k, &L->v, &L->o, &L->ffn_gate, &L->ffn_up, &L->ffn_down,
                      &L->router, &L->sh_gate, &L->sh_up, &L->sh_down, &L->ssm_qkv, &L->ssm_z,
                      &L->ssm_beta, &L->ssm_alpha, &L->ssm_out};
        for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
            if (pack_mat(m, ms[i], 1) != 0)
                return model_fail(err, errlen, "blk.%d: out of memory or unreadable tensor data", l);
        drop_readahead(m);   /* per layer: the read-ahead pages never pile up (the load's peak) */
    }
    return 0;
}

/* Interleaved M-RoPE (ggml's IMROPE) for text: pair i's sector i mod (the sections' sum) turns
 * with the position when sector % 3 is t/h/w's (0/1/2) and below 3 x that section; the others
 * take the 4th position, 0 for text, so they do not turn (angle 0). */
static void imrope_mask(const model_config *c, double *inv_freq) {
    const int *s = c->rope_imrope, sum = s[0] + s[1] + s[2] + s[3];
    if (sum <= 0) return;
    for (int i = 0; i < c->rope_dim / 2; i++) {
        const int sec = i % sum, r = sec % 3;
        if (!(sec < 3 * s[r])) inv_freq[i] = 0.0;
    }
}

/* Name, chat template, sampling, the K/V fingerprint and the RoPE table. */
static int load_finish(model *m, const char *path, char *err, size_t errlen) {
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    const gguf_file *g = &m->g;
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
    const int rd = c->rope_dim;
    int64_t fp[17] = {c->n_layers, c->d_model, c->n_heads, c->n_kv_heads, c->head_dim_k, c->d_ff, c->vocab,
                      c->n_experts, c->top_k, c->d_expert, c->d_shexp, P->moe.gating, c->n_moe_rows, rd,
                      (int64_t)g->size, (int64_t)g->n_tensors, m->exact};
    m->fingerprint = fnv1a64(1469598103934665603ull, fp, sizeof fp);
    if (c->head_dim_v != c->head_dim_k) {    /* the value width too (equal widths: as before the split) */
        int64_t hv = c->head_dim_v;
        m->fingerprint = fnv1a64(m->fingerprint, &hv, sizeof hv);
    }
    P->rope_dim = rd;
    P->inv_freq = malloc(sizeof(double) * (size_t)(rd / 2));
    if (!P->inv_freq) return model_fail(err, errlen, "out of memory");
    /* RoPE scaling (model_config): YaRN's ramp r_i over the pairs between the correction dims of
     * beta_fast and beta_slow rotations in the original context, as ggml's rope_yarn */
    const double fs = c->rope_freq_scale, ext = c->rope_ext_factor;
    double lo = 0.0, hi = 0.0;
    if (ext != 0.0) {
        const double lb = 2.0 * log((double)c->rope_base), two_pi = 2.0 * 3.14159265358979323846;
        lo = fmax(0.0, floor(rd * log(c->rope_ctx_orig / (c->rope_beta_fast * two_pi)) / lb));
        hi = fmin(rd - 1.0, ceil(rd * log(c->rope_ctx_orig / (c->rope_beta_slow * two_pi)) / lb));
    }
    for (int i = 0; i < rd / 2; i++) {
        double mix = 0.0;
        if (ext != 0.0) mix = (1.0 - fmin(1.0, fmax(0.0, (i - lo) / fmax(0.001, hi - lo)))) * ext;
        P->inv_freq[i] = pow((double)c->rope_base, -2.0 * i / (double)rd) * (fs * (1.0 - mix) + mix);
    }
    imrope_mask(c, P->inv_freq);
    P->rope_mscale = (double)c->rope_attn_factor * (ext != 0.0 ? 1.0 + 0.1 * log(1.0 / fs) : 1.0);
    /* rope_freqs.weight [rope_dim/2] (Llama 3.1+'s "llama3" scaling, written out by the converter):
     * pair i's angle divided by its factor, before the scaling above (ggml's freq_factors) */
    if (gguf_find_tensor(g, "rope_freqs.weight")) {
        const float *ff;
        if (ld_vec(m, "rope_freqs.weight", rd / 2, 0, &ff, err, errlen) != 0) return -1;
        for (int i = 0; i < rd / 2; i++) {
            if (!(ff[i] > 0.0f) || !isfinite(ff[i]))
                return model_fail(err, errlen, "rope_freqs.weight[%d] = %g is invalid", i, (double)ff[i]);
            P->inv_freq[i] /= (double)ff[i];
        }
    }
    return 0;
}

/* Whether tensor t is in one of the trailing MTP / NextN blocks (blk.L., L >= n_layers), which
 * are known and skipped. */
static int in_skipped_block(const model *m, const gguf_tensor *t) {
    char nm[64];
    snprintf(nm, sizeof nm, "%.*s", (int)(t->name.len < 63 ? t->name.len : 63), t->name.ptr);
    int l, at = 0;
    if (sscanf(nm, "blk.%d.%n", &l, &at) != 1 || at == 0) return 0;
    return l >= m->c.n_layers && l < m->c.n_layers + m->c.n_nextn;
}

/* <arch>. keys a file may carry that change nothing here: the vocabulary's size (the tokenizer's
 * list decides), the shared experts' count and the leading dense blocks (the tensors decide, as
 * the blocks' loaders read them), the converters' layout and fine-tuning notes. */
static int key_harmless(const char *suffix) {
    static const char *const ok[] = {"vocab_size", "expert_shared_count", "leading_dense_block_count",
                                     "tensor_data_layout", "rope.scaling.finetuned"};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++)
        if (strcmp(suffix, ok[i]) == 0) return 1;
    return 0;
}

/* A file is run only as a whole: a tensor the architecture never read (outside its skipped MTP
 * blocks), or a key of its namespace it never read, would be silently ignored, so either refuses
 * the load naming it (llama.cpp refuses a tensor count that differs from its loader's). */
static int check_unread(model *m, char *err, size_t errlen) {
    const gguf_file *g = &m->g;
    for (uint64_t i = 0; i < g->n_tensors; i++) {
        const gguf_tensor *t = &g->tensors[i];
        if (!t->seen && !in_skipped_block(m, t))
            return model_fail(err, errlen, "tensor %.*s is not known to this engine's %s loader (unsupported file)",
                              (int)t->name.len, t->name.ptr, m->arch);
    }
    const size_t na = strlen(m->arch);
    for (uint64_t i = 0; i < g->n_kv; i++) {
        const gguf_kv *kv = &g->kv[i];
        char key[160];
        snprintf(key, sizeof key, "%.*s", (int)(kv->key.len < 159 ? kv->key.len : 159), kv->key.ptr);
        if (kv->seen || strncmp(key, m->arch, na) != 0 || key[na] != '.' || key_harmless(key + na + 1)) continue;
        return model_fail(err, errlen, "key %s is not known to this engine's %s loader (unsupported file)", key, m->arch);
    }
    return 0;
}

static int load_inner(model *m, const char *path, const expert_opts *eo, char *err, size_t errlen) {
    gguf_file *g = &m->g;
    if (gguf_open(g, path) != 0) return model_fail(err, errlen, "%s", g->err[0] ? g->err : "cannot open model");
    m->priv->g_open = 1;
    /* EXACT computes from the mapping in place: its pages are the weights, read ahead as usual */
    if (m->exact) (void)madvise((void *)g->map, g->size, MADV_NORMAL);
    const arch_ops *ops = load_arch(m, err, errlen);
    if (!ops || ops->hparams(m, err, errlen) != 0 || topk_override(m, err, errlen) != 0) return -1;
    m->priv->ops = ops;
    m->tok = tok_load(g, err, errlen);
    if (!m->tok) return -1;
    m->c.vocab = tok_n_vocab(m->tok);
    if (m->c.vocab < 1) return model_fail(err, errlen, "tokenizer has no tokens");
    if (load_io(m, err, errlen) || load_blocks(m, ops, eo, err, errlen) || pack_all(m, err, errlen)) return -1;
    if (load_finish(m, path, err, errlen) != 0) return -1;
    return check_unread(m, err, errlen);
}

int model_load(model *m, const char *path, const expert_opts *eo, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    m->g.fd = -1;
    m->priv = calloc(1, sizeof *m->priv);
    if (!m->priv) return model_fail(err, errlen, "out of memory");
    m->exact = eo && eo->exact;
    m->priv->act.exact = m->exact;
    m->priv->tier = &compute_cpu;
    if (!path) return model_free(m), model_fail(err, errlen, "no model path");
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
    mtp_slots_free(P);
    for (int s = 0; s < P->n_rs; s++) rstate_free(&P->rs[s]);
    free(P->rs);
    free(P->gdn.p);
    free(P->trail.p);
    qact_free(&P->act);
    qact_free(&P->ahead_act);
    qact_free(&P->sh_act);
    if (P->eact)
        for (int e = 0; e < 2 * m->c.n_experts; e++) qact_free(&P->eact[e]);
    free(P->eact);
    free(P->ew);
    free(P->jobs);
    fbuf *fs[] = {&P->x, &P->h, &P->q, &P->k, &P->v, &P->att, &P->tmp, &P->fg, &P->fu, &P->rlog, &P->eout,
                  &P->shout, &P->xin, &P->eg, &P->eu, &P->eo, &P->hin, &P->hout, &P->ascr, &P->rope, &P->selw, &P->ahead_lg};
    for (size_t i = 0; i < sizeof fs / sizeof fs[0]; i++) free(fs[i]->p);
    ibuf *is[] = {&P->sel, &P->ecnt, &P->eoff, &P->elist, &P->slot0, &P->ablk, &P->koff, &P->ready, &P->guess};
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
