/* model.c — the batched forward of a loaded model: model_forward checks the rows, appends
 * their tokens to the slot histories (undone on failure) and runs the file's architecture's
 * forward (arch_ops.forward in arch_<name>.c), which composes the building blocks of forward.c
 * (blocks.h) as llama.cpp's src/models/<name>.cpp graphs do. Also the CPU compute tier.
 *
 * MoE combination order is fixed per row (selected experts in increasing id, then the
 * shared expert), so a row's result does not depend on which other rows share the batch.
 *
 * The parts live in their own files (model_impl.h lists them): loading in model_load.c and
 * arch_<name>.c, the blocks in forward.c, the MoE FFN in moe.c, attention kernels in attention.c. */
#include "arch.h"

/* The CPU compute tier: quant.c's kernels on the pool. */
const compute_tier compute_cpu = {"cpu", qmat_mul_multi};

void par_rows(pool_fn fn, void *ctx, int n) {
    int nc = (n + ROW_CHUNK - 1) / ROW_CHUNK;
    if (n >= 2 * ROW_CHUNK) pool_run(fn, ctx, nc);
    else
        for (int c = 0; c < nc; c++) fn(ctx, c);
}

size_t model_state_bytes(const model *m) {
    const model_config *c = &m->c;
    const size_t S = (size_t)c->ssm_head, ch = (size_t)(2 * c->ssm_k_heads + c->ssm_v_heads) * S;
    size_t n = 0;
    for (int l = 0; m->layers && l < c->n_layers; l++) n += m->layers[l].rec_row >= 0;
    return c->ssm_v_heads ? n * (ch * (size_t)(c->ssm_d_conv - 1) + (size_t)c->ssm_v_heads * S * S) * sizeof(float) : 0;
}

int model_kv_init(const model *m, kv_cache *kv, int n_slots, int ctx) {
    const model_config *c = &m->c;
    /* an MTP block's layer last: the trunk's forward never touches it */
    if (kv_init_kv(kv, n_slots, ctx, c->n_layers + c->n_mtp, c->n_kv_heads * c->head_dim_k,
                   c->n_kv_heads * c->head_dim_v) != 0)
        return -1;
    /* sliding-window layers keep only their window's rows; a hybrid's recurrent layers none */
    for (int l = 0; l < c->n_layers; l++)
        if ((m->layers[l].window > 0 && kv_set_window(kv, l, m->layers[l].window) != 0) ||
            (m->layers[l].rec_row >= 0 && kv_set_rowless(kv, l) != 0)) {
            kv_free(kv);
            return -1;
        }
    return 0;
}

/* A cache serves the model's layers when each layer's rows are kept in full, or with the
 * window the layer attends over, and only a recurrent layer keeps none. */
static int kv_fits(const model *m, const kv_cache *kv) {
    for (int l = 0; kv->windowed && l < m->c.n_layers; l++)
        if (kv->windowed[l] && (m->layers[l].window <= 0 || m->layers[l].window > kv->window)) return 0;
    for (int l = 0; kv->rowless && l < m->c.n_layers; l++)
        if (kv->rowless[l] && m->layers[l].rec_row < 0) return 0;
    return 1;
}

/* The rows' pass: the blocks' state, then the architecture's own forward (arch_<name>.c). */
static int forward_inner(model *m, kv_cache *kv, fwd_row *rows, int n) {
    fwd F;
    if (fwd_begin(&F, m, kv, rows, n) != 0 || m->priv->ops->forward(&F) != 0) return -1;
    m->perf.forwards++;
    return 0;
}

int model_forward(model *m, kv_cache *kv, fwd_row *rows, int n) {
    if (n <= 0) return 0;
    struct model_priv *P = m->priv;
    const model_config *c = &m->c;
    if (!P || !kv || kv->n_layers != c->n_layers + c->n_mtp || kv->k_dim != c->n_kv_heads * c->head_dim_k ||
        kv->v_dim != c->n_kv_heads * c->head_dim_v || !kv_fits(m, kv))
        return -1;
    int *slot0 = ib(&P->slot0, (size_t)kv->n_slots);
    if (!slot0) return -1;
    for (int s = 0; s < kv->n_slots; s++) slot0[s] = -1;
    /* Validate rows and append their tokens to the slot histories; undone on failure. Every
     * position the forward stores is reserved here, before forward_inner acquires any expert:
     * KV's growth may make the expert store give back borrowed memory (kv_set_reclaim), which
     * must happen while no expert is held; nothing inside forward_inner grows KV. */
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        int s = rows[i].slot;
        if (s < 0 || s >= kv->n_slots || rows[i].token < 0 || rows[i].token >= c->vocab) {
            rc = -1;
            break;
        }
        kv_slot *sl = &kv->slots[s];
        if (slot0[s] < 0) slot0[s] = sl->n_pos;
        if (rows[i].pos != sl->n_pos || rows[i].pos >= kv->ctx || kv_reserve_from(kv, s, slot0[s], rows[i].pos + 1) != 0) {
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
