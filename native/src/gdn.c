/* gdn.c — the Gated DeltaNet hybrids: llama.cpp's `qwen35moe` (arch_qwen35moe.c) and `qwen3next`
 * (arch_qwen3next.c), whose graphs differ only where their arch files' hybrid_variant says.
 * Most layers are Gated DeltaNet linear attention, every full_attention_interval-th (or the file's
 * attention.recurrent_layers array says which) a gated full-attention layer; every layer's FFN
 * MoE (softmax router over all experts, top-k renormalized) plus a shared expert times
 * sigmoid(h . ffn_gate_inp_shexp); post_attention_norm before the FFN; untied head.
 * Owns: the Gated DeltaNet layer, the hybrids' blocks, forward and MTP block, and each slot's
 * recurrent state (rstate, model_impl.h).
 *
 * Full attention (llama.cpp's build_layer_attn): attn_q gives per head [q | gate]; per-head RMS
 * q/k norms; RoPE on rope.dimension_count dims (NeoX pairs; qwen35moe's interleaved M-RoPE
 * sections leave some pairs unturned: model_load.c's imrope_mask); the heads' outputs times
 * sigmoid(gate) before attn_output (blocks.h's gated attention).
 *
 * Gated DeltaNet (build_layer_attn_linear and ggml's ssm_conv / gated_delta_net ops), per row in
 * order on its slot's state, with Hk = ssm.group_count q/k heads and Hv = ssm.time_step_rank v
 * heads of width S = ssm.state_size (= ssm.inner_size / Hv):
 *   [q | k | v] = attn_qkv h (conv channels 2 Hk S + Hv S), z = attn_gate h,
 *   b = sigmoid(ssm_beta h), g = softplus(ssm_alpha h + ssm_dt.bias) * ssm_a  (per v head);
 *   (qwen3next: the same from its fused forms, below)
 *   each channel: conv over its last d_conv inputs (ssm_conv1d row, the d_conv - 1 previous ones
 *   kept in the state), then SiLU;
 *   q, k per head L2-normalized: x / sqrt(sum x^2 + eps); v head h reads q/k head h mod Hk
 *   (qwen35moe: its converter tiles the v heads) or h / (Hv / Hk) (qwen3next: grouped);
 *   state M (S x S per v head, M[j][i]: value j, key i): M *= exp(g); d_j = (v_j - M[j] . k) b;
 *   M[j] += d_j k; o_j = (M[j] . q) / sqrt(S)  (row j at a time: each row's update needs only its d_j;
 *   delta_rule);
 *   o per head: rmsnorm(o, ssm_norm) * silu(z); ssm_out o into the branch.
 * qwen3next's fused forms (build_qkvz): the legacy ssm_in [q | k | v | z] per q/k head (each q/k
 * head's q and k, then the v and z of its Hv / Hk v heads), and ssm_ba [beta | alpha] per q/k
 * head (Hv / Hk each); the v heads in the order they give (grouped).
 *
 * State: a slot's rstate holds, per recurrent layer, the conv inputs and M; it stands after
 * exactly n_pos tokens whose hash it keeps. An armed trail (model_trail) also gets the state
 * after each of the forward's first rows of the slot, copied while M is in cache. A forward
 * whose first row of a slot is at position 0 starts from zeros; at p > 0 it needs the state of
 * exactly the slot's first p tokens (-1 otherwise: the caller resumes from a checkpoint or
 * re-prefills, model_resume in rstate.c).
 * The trailing MTP block (nextn_predict_layers 1), when loaded (expert_opts.mtp: a draft head,
 * mtp.c), is never in the trunk's loop. llama.cpp's graph_mtp: x = eh_proj [enorm(embed(t)) |
 * hnorm(h)] for the token t after the row's position and h the trunk's output_norm'ed last state
 * (or the block's own, for a further guess); then a gated full-attention layer with its own K/V
 * and the MoE with the gated shared expert, as a trunk layer; shared_head_norm (else output_norm)
 * and the model's head. Its own embed_tokens / shared_head_head, which files may carry, are
 * refused (the released Qwen3.6 files share the model's). */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "arch.h"

#define GDN_MAX_CONV 16

/* ---------------------------------------------------------------- loading */

static int rec_layers_from_file(model *m, int *rec, char *err, size_t errlen) {
    const model_config *c = &m->c;
    char k[128];
    const gguf_kv *kv = gguf_find_kv(&m->g, ld_key(m, "attention.recurrent_layers", k, sizeof k));
    if (kv) {
        if (kv->type != GGUF_T_ARRAY || kv->arr_len < (uint64_t)c->n_layers)
            return model_fail(err, errlen, "%s must be an array of at least %d flags", k, c->n_layers);
        for (int l = 0; l < c->n_layers; l++) rec[l] = gguf_array_int(kv, (uint64_t)l) != 0;
        return 0;
    }
    int64_t iv = gguf_get_int(&m->g, ld_key(m, "full_attention_interval", k, sizeof k), -1);
    if (iv < 1 || iv > c->n_layers + 1)
        return model_fail(err, errlen, "%s is missing or invalid (%lld) and %s.attention.recurrent_layers is absent",
                          k, (long long)iv, m->arch);
    for (int l = 0; l < c->n_layers; l++) rec[l] = (l + 1) % iv != 0;
    return 0;
}

int hybrid_hparams(model *m, char *err, size_t errlen) {
    if (ld_hparams_common(m, 1, err, errlen) != 0) return -1;
    model_config *c = &m->c;
    const gguf_file *g = &m->g;
    char k[128];
    if (c->n_experts < 1) return model_fail(err, errlen, "%s.expert_count is missing or invalid", m->arch);
    if (c->head_dim_v != c->head_dim_k)
        return model_fail(err, errlen, "%s: attention.value_length %d != key_length %d", m->arch, c->head_dim_v,
                          c->head_dim_k);
    moe_opts *o = &m->priv->moe;
    o->gating = GATING_SOFTMAX_ALL;
    o->norm = 1;            /* llama.cpp's graph renormalizes the selected weights always */
    o->shexp_gated = 1;
    double sc = gguf_get_float(g, ld_key(m, "expert_weights_scale", k, sizeof k), 0.0);
    if (!isfinite(sc) || sc < 0.0) return model_fail(err, errlen, "%s = %g is invalid", k, sc);
    o->scale = sc == 0.0 ? 1.0f : (float)sc;
    if (ld_int_req(m, "ssm.conv_kernel", &c->ssm_d_conv, err, errlen) ||
        ld_int_req(m, "ssm.state_size", &c->ssm_head, err, errlen) ||
        ld_int_req(m, "ssm.time_step_rank", &c->ssm_v_heads, err, errlen) ||
        ld_int_req(m, "ssm.group_count", &c->ssm_k_heads, err, errlen))
        return -1;
    int inner;
    if (ld_int_req(m, "ssm.inner_size", &inner, err, errlen)) return -1;
    if (c->ssm_d_conv < 2 || c->ssm_d_conv > GDN_MAX_CONV)
        return model_fail(err, errlen, "%s.ssm.conv_kernel %d is not supported (2..%d)", m->arch, c->ssm_d_conv, GDN_MAX_CONV);
    if (inner != c->ssm_v_heads * c->ssm_head)
        return model_fail(err, errlen, "%s.ssm.inner_size %d != time_step_rank %d x state_size %d (value and key heads "
                          "of one width)", m->arch, inner, c->ssm_v_heads, c->ssm_head);
    if (c->ssm_head < 1 || c->ssm_head > 1024)
        return model_fail(err, errlen, "%s.ssm.state_size %d is not supported (1..1024)", m->arch, c->ssm_head);
    if (c->ssm_v_heads % c->ssm_k_heads)
        return model_fail(err, errlen, "%s.ssm.time_step_rank %d is not a multiple of group_count %d", m->arch,
                          c->ssm_v_heads, c->ssm_k_heads);
    ld_expert_widths(m);
    return 0;
}

/* The tensors of a Gated DeltaNet layer. qwen3next's legacy fused ssm_in goes into ssm_qkv
 * (2 Hk S + 2 Hv S rows, ssm_z empty) and its ssm_ba into ssm_beta (2 Hv rows, ssm_alpha
 * empty): gdn_rows spreads their outputs (llama.cpp's qwen3next reads attn_qkv when a file has
 * it, else ssm_in; a file with both is refused rather than one of them left unread). */
static int load_gdn(model *m, int l, const hybrid_variant *hv, char *err, size_t errlen) {
    const model_config *c = &m->c;
    layer_w *L = &m->layers[l];
    const gguf_file *g = &m->g;
    char nm[160];
    const int S = c->ssm_head, Hv = c->ssm_v_heads, kd = c->ssm_k_heads * S, vd = Hv * S;
    const uint64_t D = (uint64_t)c->d_model, CH = (uint64_t)(2 * kd + vd);
#define NM(s) (snprintf(nm, sizeof nm, "blk.%d." s, l), nm)
    if (hv->fused_in && !gguf_find_tensor(g, NM("attn_qkv.weight"))) {
        if (!gguf_find_tensor(g, NM("ssm_in.weight")))
            return model_fail(err, errlen, "blk.%d.attn_qkv.weight (or the legacy ssm_in.weight): tensor missing", l);
        if (ld_mat(g, NM("ssm_in.weight"), D, CH + (uint64_t)vd, 0, &L->ssm_qkv, err, errlen)) return -1;
    } else {
        if (hv->fused_in && gguf_find_tensor(g, NM("ssm_in.weight")))
            return model_fail(err, errlen, "blk.%d: both attn_qkv and the legacy ssm_in", l);
        if (ld_mat(g, NM("attn_qkv.weight"), D, CH, 0, &L->ssm_qkv, err, errlen) ||
            ld_mat(g, NM("attn_gate.weight"), D, (uint64_t)vd, 0, &L->ssm_z, err, errlen))
            return -1;
    }
    if (hv->fused_in ? ld_mat(g, NM("ssm_ba.weight"), D, 2 * (uint64_t)Hv, 0, &L->ssm_beta, err, errlen)
                     : (ld_mat(g, NM("ssm_beta.weight"), D, (uint64_t)Hv, 0, &L->ssm_beta, err, errlen) ||
                        ld_mat(g, NM("ssm_alpha.weight"), D, (uint64_t)Hv, 0, &L->ssm_alpha, err, errlen)))
        return -1;
    if (ld_mat(g, NM("ssm_out.weight"), (uint64_t)vd, D, 0, &L->ssm_out, err, errlen)) return -1;
    const uint64_t ce[2] = {(uint64_t)c->ssm_d_conv, CH};
    if (ld_vec_nd(m, NM("ssm_conv1d.weight"), 2, ce, 0, &L->ssm_conv, err, errlen) ||
        ld_vec(m, NM("ssm_dt.bias"), Hv, 0, &L->ssm_dt, err, errlen) || ld_vec(m, NM("ssm_a"), Hv, 0, &L->ssm_a, err, errlen) ||
        ld_vec(m, NM("ssm_norm.weight"), S, 0, &L->ssm_norm, err, errlen))
        return -1;
    return 0;
}

/* The tensors of a gated full-attention layer: attn_q is heads x [q | gate]. */
static int load_attn(model *m, int l, char *err, size_t errlen) {
    const model_config *c = &m->c;
    layer_w *L = &m->layers[l];
    const gguf_file *g = &m->g;
    char nm[160];
    const uint64_t D = (uint64_t)c->d_model, hd = (uint64_t)c->head_dim_k, QD = (uint64_t)c->n_heads * hd,
                   KV = (uint64_t)c->n_kv_heads * hd;
    if (ld_mat(g, NM("attn_q.weight"), D, 2 * QD, 0, &L->q, err, errlen) ||
        ld_mat(g, NM("attn_k.weight"), D, KV, 0, &L->k, err, errlen) ||
        ld_mat(g, NM("attn_v.weight"), D, KV, 0, &L->v, err, errlen) ||
        ld_mat(g, NM("attn_output.weight"), QD, D, 0, &L->o, err, errlen) ||
        ld_vec(m, NM("attn_q_norm.weight"), (int)hd, 0, &L->q_norm, err, errlen) ||
        ld_vec(m, NM("attn_k_norm.weight"), (int)hd, 0, &L->k_norm, err, errlen))
        return -1;
    const char *bias[3] = {"attn_q.bias", "attn_k.bias", "attn_v.bias"};
    for (int i = 0; i < 3; i++) {
        snprintf(nm, sizeof nm, "blk.%d.%s", l, bias[i]);
        if (gguf_find_tensor(g, nm)) return model_fail(err, errlen, "%s: attention biases are not supported in %s", nm, m->arch);
    }
    return 0;
}

int hybrid_block(model *m, int l, expert_layer_src *src, const hybrid_variant *hv, char *err, size_t errlen) {
    layer_w *L = &m->layers[l];
    char nm[160];
    if (l == 0) {   /* which layers are recurrent: once, for all (their rec_row numbering) */
        int rec[4096];
        if (m->c.n_layers > 4096) return model_fail(err, errlen, "%s: %d layers are too many", m->arch, m->c.n_layers);
        if (rec_layers_from_file(m, rec, err, errlen) != 0) return -1;
        for (int i = 0, r = 0; i < m->c.n_layers; i++) m->layers[i].rec_row = rec[i] ? r++ : -1;
    }
    if (ld_vec(m, NM("attn_norm.weight"), m->c.d_model, 0, &L->attn_norm, err, errlen) ||
        ld_vec(m, NM("post_attention_norm.weight"), m->c.d_model, 0, &L->ffn_norm, err, errlen))
        return -1;
    if ((L->rec_row >= 0 ? load_gdn(m, l, hv, err, errlen) : load_attn(m, l, err, errlen)) != 0) return -1;
    if (ld_moe_ffn(m, l, src, err, errlen) != 0) return -1;
    if (hv->shexp_required || gguf_find_tensor(&m->g, NM("ffn_gate_shexp.weight"))) {
        if (ld_shared_expert(m, l, err, errlen) != 0 ||
            ld_vec(m, NM("ffn_gate_inp_shexp.weight"), m->c.d_model, 0, &L->sh_gate_inp, err, errlen) != 0)
            return -1;
    }
    return 1;
}

/* The MTP block's own tensors (its layer, layers[l], loaded by hybrid_block). */
int hybrid_mtp_block(model *m, int l, char *err, size_t errlen) {
    const uint64_t D = (uint64_t)m->c.d_model;
    char nm[160];
    if (gguf_find_tensor(&m->g, NM("nextn.embed_tokens.weight")) ||
        gguf_find_tensor(&m->g, NM("nextn.shared_head_head.weight")))
        return model_fail(err, errlen, "%s: an MTP block with its own embedding or head is not supported", nm);
    if (ld_mat(&m->g, NM("nextn.eh_proj.weight"), 2 * D, D, 0, &m->mtp.eh_proj, err, errlen) ||
        ld_vec(m, NM("nextn.enorm.weight"), m->c.d_model, 0, &m->mtp.enorm, err, errlen) ||
        ld_vec(m, NM("nextn.hnorm.weight"), m->c.d_model, 0, &m->mtp.hnorm, err, errlen) ||
        ld_vec(m, NM("nextn.shared_head_norm.weight"), m->c.d_model, 1, &m->mtp.head_norm, err, errlen))
        return -1;
    if (!m->mtp.head_norm) m->mtp.head_norm = m->output_norm;
    return 0;
}
#undef NM

/* ---------------------------------------------------------------- recurrent state */

/* Floats of one recurrent layer's state: conv inputs [channels x (d_conv - 1)], then Hv x S x S
 * (model_state_bytes: all of a slot's layers, in rec_row order). */
static size_t layer_state(const model_config *c) {
    const size_t S = (size_t)c->ssm_head, ch = (size_t)(2 * c->ssm_k_heads + c->ssm_v_heads) * S;
    return ch * (size_t)(c->ssm_d_conv - 1) + (size_t)c->ssm_v_heads * S * S;
}

/* Before the layers: each slot with rows here gets its state ready (zeros at position 0, else
 * the state must stand after exactly the slot's first p tokens), all checked before any is
 * marked in flight, so one slot's refusal leaves the others' states valid. */
static int first_of_slot(const fwd *F, int i) {
    for (int j = 0; j < i; j++)
        if (F->rows[j].slot == F->rows[i].slot) return 0;
    return 1;
}

static int states_begin(fwd *F) {
    model *m = F->m;
    for (int i = 0; i < F->n; i++) {
        const int s = F->rows[i].slot, p = F->rows[i].pos;
        if (!first_of_slot(F, i)) continue;
        rstate *r = rstate_slot(m, s, F->kv->n_slots);
        if (!r) return -1;
        if (p > 0 && (r->n_pos != p || r->hash != rstate_hash(F->kv->slots[s].tokens, p))) {
            fprintf(stderr, "%s: slot %d's recurrent state does not stand after its %d tokens (re-prefill)\n", m->arch, s, p);
            return -1;
        }
    }
    for (int i = 0; i < F->n; i++) {
        if (!first_of_slot(F, i)) continue;
        rstate *r = &F->P->rs[F->rows[i].slot];
        if (F->rows[i].pos == 0) memset(r->p, 0, r->n * sizeof(float));
        r->n_pos = -1;      /* in flight: a failure leaves it invalid */
        r->trail_pos = F->rows[i].pos, r->trail_n = 0;
    }
    return 0;
}

/* Where row i's state goes in its slot's trail (model_trail), or NULL when none is armed for it. */
static float *trail_entry(struct model_priv *P, const fwd_row *row) {
    const rstate *r = &P->rs[row->slot];
    const int i = row->pos - r->trail_pos;
    return i >= 0 && i < r->trail_want ? P->trail.p + (size_t)i * r->n : NULL;
}

static void states_end(fwd *F) {
    struct model_priv *P = F->P;
    for (int i = 0; i < F->n; i++) {
        const int s = F->rows[i].slot;
        rstate *r = &P->rs[s];
        const int np = F->kv->slots[s].n_pos;   /* the history includes this forward's rows */
        if (r->n_pos != np) r->n_pos = np, r->hash = rstate_hash(F->kv->slots[s].tokens, np);
        if (r->trail_want) {    /* the armed rows this forward ran, then disarmed */
            const int kept = np - r->trail_pos;
            r->trail_n = kept < r->trail_want ? kept : r->trail_want;
            r->trail_want = 0;
        }
    }
}

/* ---------------------------------------------------------------- the Gated DeltaNet layer */

static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }
static float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

/* Groups of matmuls of one weight type per call into the tier (its activations are per type). */
static void mm_typed(fwd *F, const float *x, int n, const qmat *const *ws, float *const *outs, int cnt) {
    for (int a = 0, b; a < cnt; a = b) {
        for (b = a + 1; b < cnt && ws[b]->type == ws[a]->type; b++) {}
        fwd_mm(F, x, n, ws + a, outs + a, b - a);
    }
}

typedef struct {
    const model_config *c;
    const layer_w *L;
    struct model_priv *P;
    const fwd_row *rows;
    int n;
    size_t st_off;          /* the layer's state within a slot's */
    float *qkv;             /* q|k|v (n x channels), conv'd in place */
    const float *beta, *alpha;   /* raw beta / alpha (n x Hv) */
    float *o;               /* n x Hv x S */
    int grouped;            /* v head h reads q/k head h / (Hv / Hk), else h mod Hk */
} gdn_ctx;

/* The delta rule on one v head's state M (S x S, row j = value j) for one row: M *= decay;
 * d_j = (v_j - M[j] . k) b; M[j] += d_j k; o_j = (M[j] . q) scale. Each row of M needs only its
 * own d_j, so a row is finished before the next is read. The dots have one order on every path:
 * 16 lanes (lane l takes t = l, l + 16, ... in fused multiply-adds), then halves added 16 -> 8 ->
 * 4 -> 2 -> 1; the 512-bit path, the 256-bit one (lanes 0-7 and 8-15 in two registers) and the
 * portable one give the same bits. */
#ifdef __AVX512F__
static inline __attribute__((always_inline)) float sum16(__m512 a) {
    return hsum8(_mm256_add_ps(_mm512_castps512_ps256(a), _mm512_extractf32x8_ps(a, 1)));
}

static void delta_rule_z(float *M, const float *k, const float *q, const float *v, float decay, float b,
                         float scale, float *o, int S) {
    const int C = S / 16;
    __m512 kz[16], qz[16];
    const __m512 dz = _mm512_set1_ps(decay);
    for (int c = 0; c < C; c++) kz[c] = _mm512_loadu_ps(k + 16 * c), qz[c] = _mm512_loadu_ps(q + 16 * c);
    for (int j = 0; j < S; j++) {
        float *Mj = M + (size_t)j * S;
        __m512 m[16], acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c++) {
            m[c] = _mm512_mul_ps(_mm512_loadu_ps(Mj + 16 * c), dz);
            acc = _mm512_fmadd_ps(m[c], kz[c], acc);
        }
        const __m512 d = _mm512_set1_ps((v[j] - sum16(acc)) * b);
        acc = _mm512_setzero_ps();
        for (int c = 0; c < C; c++) {
            m[c] = _mm512_fmadd_ps(d, kz[c], m[c]);
            _mm512_storeu_ps(Mj + 16 * c, m[c]);
            acc = _mm512_fmadd_ps(m[c], qz[c], acc);
        }
        o[j] = sum16(acc) * scale;
    }
}
#elif defined(__AVX2__)
/* A 128-wide row does not fit 16 ymm registers beside k and q: the second pass reloads the row
 * from L1 and recomputes its decay (the same product, so the same bits) instead of storing it. */
static void delta_rule_y(float *M, const float *k, const float *q, const float *v, float decay, float b,
                         float scale, float *o, int S) {
    const __m256 dz = _mm256_set1_ps(decay);
    for (int j = 0; j < S; j++) {
        float *Mj = M + (size_t)j * S;
        __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
        for (int t = 0; t < S; t += 16) {
            lo = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(Mj + t), dz), _mm256_loadu_ps(k + t), lo);
            hi = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_loadu_ps(Mj + t + 8), dz), _mm256_loadu_ps(k + t + 8), hi);
        }
        const __m256 d = _mm256_set1_ps((v[j] - hsum8(_mm256_add_ps(lo, hi))) * b);
        lo = hi = _mm256_setzero_ps();
        for (int t = 0; t < S; t += 16) {
            const __m256 m0 = _mm256_fmadd_ps(d, _mm256_loadu_ps(k + t), _mm256_mul_ps(_mm256_loadu_ps(Mj + t), dz));
            const __m256 m1 = _mm256_fmadd_ps(d, _mm256_loadu_ps(k + t + 8), _mm256_mul_ps(_mm256_loadu_ps(Mj + t + 8), dz));
            _mm256_storeu_ps(Mj + t, m0);
            _mm256_storeu_ps(Mj + t + 8, m1);
            lo = _mm256_fmadd_ps(m0, _mm256_loadu_ps(q + t), lo);
            hi = _mm256_fmadd_ps(m1, _mm256_loadu_ps(q + t + 8), hi);
        }
        o[j] = hsum8(_mm256_add_ps(lo, hi)) * scale;
    }
}
#endif

static float sum16_scalar(const float *a) {
    float h8[8], h4[4];
    for (int l = 0; l < 8; l++) h8[l] = a[l] + a[l + 8];
    for (int l = 0; l < 4; l++) h4[l] = h8[l] + h8[l + 4];
    return (h4[0] + h4[2]) + (h4[1] + h4[3]);
}

void gdn_delta_rule_portable(float *M, const float *k, const float *q, const float *v, float decay, float b,
                             float scale, float *o, int S) {
    for (int j = 0; j < S; j++) {
        float *Mj = M + (size_t)j * S, acc[16] = {0};
        for (int t = 0; t < S; t++) {
            Mj[t] *= decay;
            acc[t % 16] = fmaf(Mj[t], k[t], acc[t % 16]);
        }
        const float d = (v[j] - sum16_scalar(acc)) * b;
        memset(acc, 0, sizeof acc);
        for (int t = 0; t < S; t++) {
            Mj[t] = fmaf(d, k[t], Mj[t]);
            acc[t % 16] = fmaf(Mj[t], q[t], acc[t % 16]);
        }
        o[j] = sum16_scalar(acc) * scale;
    }
}

void gdn_delta_rule(float *M, const float *k, const float *q, const float *v, float decay, float b, float scale,
                    float *o, int S) {
#ifdef __AVX512F__
    if (S % 16 == 0 && S <= 256) {
        delta_rule_z(M, k, q, v, decay, b, scale, o, S);
        return;
    }
#elif defined(__AVX2__)
    if (S % 16 == 0) {
        delta_rule_y(M, k, q, v, decay, b, scale, o, S);
        return;
    }
#endif
    gdn_delta_rule_portable(M, k, q, v, decay, b, scale, o, S);
}

/* A trail entry: written once and read back only when a draft is refused, so it goes around
 * the caches (a plain copy reads each destination line in before writing it: the verify step's
 * trail cost twice its bytes). Callers fence (_mm_sfence) before the pool's barrier. */
static void stream_copy(float *dst, const float *src, size_t n) {
#ifdef __AVX2__     /* AVX-512 builds too: two 32-byte streaming stores fill a line as one 64-byte one does */
    size_t a = ((32 - ((uintptr_t)dst & 31)) & 31) / sizeof(float);    /* floats to a 32-byte boundary */
    if (a > n) a = n;
    memcpy(dst, src, a * sizeof(float));
    for (; a + 8 <= n; a += 8) _mm256_stream_ps(dst + a, _mm256_loadu_ps(src + a));
    memcpy(dst + a, src + a, (n - a) * sizeof(float));
#else
    memcpy(dst, src, n * sizeof(float));
#endif
}

static void stream_fence(void) {
#ifdef __AVX2__
    _mm_sfence();
#endif
}

/* Task h: v head h over the rows in order, each on its slot's M. */
static void gdn_head(void *vctx, int h) {
    const gdn_ctx *G = vctx;
    const model_config *c = G->c;
    const int S = c->ssm_head, Hk = c->ssm_k_heads, Hv = c->ssm_v_heads, kd = Hk * S, ch = 2 * kd + Hv * S;
    const size_t conv_n = (size_t)ch * (size_t)(c->ssm_d_conv - 1);
    const float scale = 1.0f / sqrtf((float)S);
    float q[1024], k[1024];
    for (int i = 0; i < G->n; i++) {
        float *M = G->P->rs[G->rows[i].slot].p + G->st_off + conv_n + (size_t)h * S * S;
        const float *x = G->qkv + (size_t)i * ch;
        const int kh = G->grouped ? h / (Hv / Hk) : h % Hk;
        double sq = 0.0, sk = 0.0;
        for (int t = 0; t < S; t++) q[t] = x[kh * S + t], k[t] = x[kd + kh * S + t];
        for (int t = 0; t < S; t++) sq += (double)q[t] * q[t], sk += (double)k[t] * k[t];
        const float nq = 1.0f / sqrtf((float)sq + c->rms_eps), nk = 1.0f / sqrtf((float)sk + c->rms_eps);
        for (int t = 0; t < S; t++) q[t] *= nq, k[t] *= nk;
        const float *v = x + 2 * kd + h * S;
        const float b = sigmoidf(G->beta[(size_t)i * Hv + h]);
        const float decay = expf(softplus(G->alpha[(size_t)i * Hv + h] + G->L->ssm_dt[h]) * G->L->ssm_a[h]);
        gdn_delta_rule(M, k, q, v, decay, b, scale, G->o + ((size_t)i * Hv + h) * S, S);
        float *t = trail_entry(G->P, &G->rows[i]);
        if (t) stream_copy(t + G->st_off + conv_n + (size_t)h * S * S, M, (size_t)S * S);
    }
    stream_fence();
}

/* Task b: channels [b GDN_CONV_BLOCK, ...) over the rows in order: each channel's conv over its
 * d_conv - 1 kept inputs and this one, SiLU; the kept inputs shift by one. In place on G->qkv
 * (n x channels). */
#define GDN_CONV_BLOCK 1024

static void gdn_conv(void *vctx, int blk) {
    const gdn_ctx *G = vctx;
    const model_config *c = G->c;
    const int K = c->ssm_d_conv, ch = (2 * c->ssm_k_heads + c->ssm_v_heads) * c->ssm_head;
    const int q0 = blk * GDN_CONV_BLOCK, q1 = q0 + GDN_CONV_BLOCK < ch ? q0 + GDN_CONV_BLOCK : ch;
    for (int i = 0; i < G->n; i++) {
        float *st = G->P->rs[G->rows[i].slot].p + G->st_off, *x = G->qkv + (size_t)i * ch;
        for (int q = q0; q < q1; q++) {
            float *s = st + (size_t)q * (K - 1);
            const float *w = G->L->ssm_conv + (size_t)q * K;
            float sum = 0.0f;
            for (int j = 0; j < K - 1; j++) sum += s[j] * w[j];
            sum += x[q] * w[K - 1];
            for (int j = 0; j < K - 2; j++) s[j] = s[j + 1];
            s[K - 2] = x[q];
            x[q] = sum / (1.0f + expf(-sum));
        }
        float *t = trail_entry(G->P, &G->rows[i]);
        if (t) memcpy(t + G->st_off + (size_t)q0 * (K - 1), st + (size_t)q0 * (K - 1), sizeof(float) * (size_t)(q1 - q0) * (K - 1));
    }
}

/* qwen3next's fused outputs into the unfused layout, in place. qkvz: n rows of ch + vd (per q/k
 * head [q | k | v | z], r = Hv / Hk v heads each) in the space of qkv and z; row i's q, k, v
 * go to qkv's row i, which ends before the fused row i + 1 begins (so rows are read before they
 * are overwritten), its z to zt (free space) and from there to z once all rows are read. ba: n
 * rows of 2 Hv (per q/k head [beta | alpha], r each), from its own space. tmp: ch + vd floats. */
static void spread_qkvz(const model_config *c, int n, float *qkv, float *z, float *zt, float *tmp) {
    const int S = c->ssm_head, Hk = c->ssm_k_heads, r = c->ssm_v_heads / Hk, kd = Hk * S;
    const int vd = c->ssm_v_heads * S, ch = 2 * kd + vd, gw = 2 * S + 2 * r * S;
    for (int i = 0; i < n; i++) {
        memcpy(tmp, qkv + (size_t)i * (ch + vd), sizeof(float) * (size_t)(ch + vd));
        float *x = qkv + (size_t)i * ch, *zi = zt + (size_t)i * vd;
        for (int g = 0; g < Hk; g++) {
            const float *s = tmp + (size_t)g * gw;
            memcpy(x + g * S, s, sizeof(float) * (size_t)S);
            memcpy(x + kd + g * S, s + S, sizeof(float) * (size_t)S);
            memcpy(x + 2 * kd + g * r * S, s + 2 * S, sizeof(float) * (size_t)(r * S));
            memcpy(zi + g * r * S, s + 2 * S + r * S, sizeof(float) * (size_t)(r * S));
        }
    }
    memcpy(z, zt, sizeof(float) * (size_t)n * (size_t)vd);
}

static void spread_ba(const model_config *c, int n, const float *ba, float *beta, float *alpha) {
    const int Hv = c->ssm_v_heads, r = Hv / c->ssm_k_heads;
    for (int i = 0; i < n; i++)
        for (int h = 0; h < Hv; h++) {
            const float *s = ba + (size_t)i * 2 * Hv + (size_t)(h / r) * 2 * r;
            beta[(size_t)i * Hv + h] = s[h % r];
            alpha[(size_t)i * Hv + h] = s[r + h % r];
        }
}

/* One part of rows through recurrent layer L into the branch (F->tmp). */
static int gdn_rows(fwd *F, const layer_w *L, const hybrid_variant *hv) {
    const model_config *c = &F->m->c;
    const int n = F->n, S = c->ssm_head, Hv = c->ssm_v_heads, vd = Hv * S;
    const int ch = (2 * c->ssm_k_heads + Hv) * S;
    const size_t N = (size_t)n;
    const int fused_qkvz = L->ssm_z.rows == 0, fused_ba = L->ssm_alpha.rows == 0;
    double t0 = mnow();
    /* qkv, z, beta, alpha, o; then for the fused forms ba's outputs and one fused qkvz row */
    const size_t extra = (fused_ba ? 2 * N * Hv : 0) + (fused_qkvz ? (size_t)(ch + vd) : 0);
    float *buf = fb(&F->P->gdn, N * ((size_t)ch + 2 * (size_t)vd + 2 * (size_t)Hv) + extra);
    if (!buf) return -1;
    float *qkv = buf, *z = qkv + N * ch, *beta = z + N * vd, *alpha = beta + N * Hv, *o = alpha + N * Hv;
    float *ba = o + N * vd, *row = ba + (fused_ba ? 2 * N * Hv : 0);
    const qmat *ws[4];
    float *os[4];
    int nw = 0;
    ws[nw] = &L->ssm_qkv, os[nw++] = qkv;
    if (!fused_qkvz) ws[nw] = &L->ssm_z, os[nw++] = z;
    ws[nw] = &L->ssm_beta, os[nw++] = fused_ba ? ba : beta;
    if (!fused_ba) ws[nw] = &L->ssm_alpha, os[nw++] = alpha;
    mm_typed(F, F->h, n, ws, os, nw);
    if (fused_qkvz) spread_qkvz(c, n, qkv, z, o, row);
    if (fused_ba) spread_ba(c, n, ba, beta, alpha);
    gdn_ctx G = {c, L, F->P, F->rows, n, layer_state(c) * (size_t)L->rec_row, qkv, beta, alpha, o, hv->v_grouped};
    pool_run(gdn_conv, &G, (ch + GDN_CONV_BLOCK - 1) / GDN_CONV_BLOCK);
    if ((long)n * Hv * S * S > (1L << 16)) pool_run(gdn_head, &G, Hv);
    else
        for (int h = 0; h < Hv; h++) gdn_head(&G, h);
    for (size_t r = 0; r < N * Hv; r++) {   /* rmsnorm(o, ssm_norm) * silu(z), per head */
        float *oh = o + r * S;
        const float *zh = z + r * S;
        double ss = 0.0;
        for (int t = 0; t < S; t++) ss += (double)(oh[t] * oh[t]);
        const float inv = 1.0f / sqrtf((float)(ss / S) + c->rms_eps);
        for (int t = 0; t < S; t++) oh[t] = (oh[t] * inv) * L->ssm_norm[t] * (zh[t] / (1.0f + expf(-zh[t])));
    }
    const qmat *wo = &L->ssm_out;
    float *out = F->tmp;
    fwd_mm(F, o, n, &wo, &out, 1);
    F->m->perf.t_attn += mnow() - t0;
    return 0;
}

static int fwd_gdn(fwd *F, const layer_w *L, const hybrid_variant *hv) {
    const int sub = part_rows(F);
    for (int a = 0; a < F->n; a += sub) {
        fwd P = fwd_part(F, a, F->n - a < sub ? F->n - a : sub);
        if (gdn_rows(&P, L, hv) != 0) return -1;
    }
    return 0;
}

/* ---------------------------------------------------------------- the forward */

static const attn_opts gated_attn = {QKN_HEAD, ROPE_NEOX, 0.0f};   /* attn_q is [q | gate] */

/* llama.cpp's qwen35moe / qwen3next graph: x += mixer(norm(x)); x += moe(post_attention_norm(x))
 * with the gated shared expert; the MTP block is not in the loop (c->n_layers excludes it). With
 * it loaded, every row's output_norm'ed state is kept for it (mtp.c). */
int hybrid_forward(fwd *F, const hybrid_variant *hv) {
    const model *m = F->m;
    if (states_begin(F) != 0) return -1;
    fwd_embed(F, 1.0f);
    for (int l = 0; l < m->c.n_layers; l++) {
        const layer_w *L = &m->layers[l];
        fwd_norm(F, L->attn_norm);
        if ((L->rec_row >= 0 ? fwd_gdn(F, L, hv) : fwd_attention(F, l, &gated_attn)) != 0) return -1;
        fwd_residual(F, 1.0f);
        fwd_norm(F, L->ffn_norm);
        if (fwd_moe(F, L, &F->P->moe) != 0) return -1;
        fwd_residual(F, 1.0f);
    }
    if (m->c.n_mtp) {
        fwd_norm(F, m->output_norm);
        if (mtp_keep(F) != 0) return -1;
    }
    if (fwd_head(F, 1.0f) != 0) return -1;
    states_end(F);
    return 0;
}

/* The MTP block over F's rows (arch_ops.mtp_forward): x = eh_proj [enorm(embed(token)) |
 * hnorm(hin)], the block's layer, then shared_head_norm'ed into hout and through the head. Rows
 * before the first that wants logits only write their K/V (what later rows attend to): their
 * MoE, whose experts a budget would read from disk, changes nothing that is kept. */
int hybrid_mtp_forward(fwd *F, const float *hin, float *hout) {
    const model *m = F->m;
    const int l = m->c.n_layers, d = m->c.d_model;
    float *cat = fb(&F->P->xin, (size_t)F->n * 2 * (size_t)d);
    if (!cat) return -1;
    fwd_embed(F, 1.0f);
    for (int i = 0; i < F->n; i++) {
        float *ci = cat + (size_t)i * 2 * d;
        fwd_rmsnorm(ci, F->x + (size_t)i * d, m->mtp.enorm, d, m->c.rms_eps);
        fwd_rmsnorm(ci + d, hin + (size_t)i * d, m->mtp.hnorm, d, m->c.rms_eps);
    }
    const qmat *eh = &m->mtp.eh_proj;
    float *x = F->x;
    fwd_mm(F, cat, F->n, &eh, &x, 1);
    const layer_w *L = &m->layers[l];
    fwd_norm(F, L->attn_norm);
    if (fwd_attention(F, l, &gated_attn) != 0) return -1;
    fwd_residual(F, 1.0f);
    int a = 0;
    while (a < F->n && !F->rows[a].logits) a++;
    if (a == F->n) return 0;
    fwd O = fwd_part(F, a, F->n - a);
    fwd_norm(&O, L->ffn_norm);
    if (fwd_moe(&O, L, &O.P->moe) != 0) return -1;
    fwd_residual(&O, 1.0f);
    fwd_norm(&O, m->mtp.head_norm);
    memcpy(hout + (size_t)a * d, O.h, sizeof(float) * (size_t)O.n * (size_t)d);
    return fwd_head_norm(&O, m->mtp.head_norm, 1.0f);
}
