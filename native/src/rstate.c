/* rstate.c — a hybrid's per-slot recurrent state outside the forward.
 * Owns: each slot's live state record and its checkpoints (copies of the state keyed by the
 * position and the hash of the tokens it stands after), resuming a turn from the live state or
 * the longest checkpointed prefix, the per-slot memory they take, and the state file beside a
 * slot's K/V file. The forward that advances the live state is gdn.c's.
 *
 * State cannot be truncated as K/V rows can: a turn whose prompt shares only part of the slot's
 * history resumes from a checkpoint at or before the shared part, else re-prefills.
 *
 * State file layout (little-endian): char magic[8] = "COLIRS01", uint64 fingerprint,
 * uint64 floats per state, uint32 count, then count x (int32 n_pos, uint64 hash, floats). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model_impl.h"

static const char RS_MAGIC[8] = {'C', 'O', 'L', 'I', 'R', 'S', '0', '1'};

uint64_t rstate_hash(const int *t, int n) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < n; i++) h = (h ^ (uint32_t)t[i]) * 1099511628211ull;
    return h;
}

void rstate_free(rstate *r) {
    free(r->p);
    for (int i = 0; i < RS_CKPTS; i++) free(r->ck[i].p);
    *r = (rstate){.n_pos = -1};
}

rstate *rstate_slot(model *m, int s, int n_slots) {
    struct model_priv *P = m->priv;
    if (s < 0 || s >= n_slots) return NULL;
    if (n_slots > P->n_rs) {
        rstate *r = realloc(P->rs, sizeof *r * (size_t)n_slots);
        if (!r) return NULL;
        for (int i = P->n_rs; i < n_slots; i++) r[i] = (rstate){.n_pos = -1};
        P->rs = r, P->n_rs = n_slots;
    }
    rstate *r = &P->rs[s];
    if (!r->p) {
        r->n = model_state_bytes(m) / sizeof(float);
        if (!(r->p = calloc(r->n ? r->n : 1, sizeof(float)))) return NULL;
        r->n_pos = -1;
    }
    return r;
}

/* Slot s's record when it holds a live state, else NULL. */
static rstate *held(const model *m, int s) {
    const struct model_priv *P = m->priv;
    return s >= 0 && s < P->n_rs && P->rs[s].p ? &P->rs[s] : NULL;
}

/* The checkpoint to (re)use for a copy at n_pos with hash h: the same one, a free one, or the
 * least recently used. */
static rs_ckpt *ckpt_for(rstate *r, int n_pos, uint64_t h) {
    rs_ckpt *pick = &r->ck[0];
    for (int i = 0; i < RS_CKPTS; i++) {
        rs_ckpt *c = &r->ck[i];
        if (c->n_pos == n_pos && c->hash == h && c->p) return c;
        if (pick->p && (!c->p || c->used < pick->used)) pick = c;
    }
    return pick;
}

int model_checkpoint(model *m, const kv_cache *kv, int s) {
    rstate *r = held(m, s);
    if (!r || r->n_pos <= 0 || r->n_pos != kv->slots[s].n_pos) return 0;   /* nothing valid to keep */
    rs_ckpt *c = ckpt_for(r, r->n_pos, r->hash);
    if (!c->p && !(c->p = malloc(r->n * sizeof(float)))) return -1;
    if (c->n_pos != r->n_pos || c->hash != r->hash) memcpy(c->p, r->p, r->n * sizeof(float));
    c->n_pos = r->n_pos, c->hash = r->hash, c->used = ++r->tick;
    return 0;
}

void model_forget(model *m, int s) {
    rstate *r = held(m, s);
    for (int i = 0; r && i < RS_CKPTS; i++) {
        free(r->ck[i].p);
        r->ck[i] = (rs_ckpt){.n_pos = -1};
    }
}

/* The longest checkpoint of slot s standing after a prefix of at most keep of its history. */
static rs_ckpt *longest_ckpt(rstate *r, const kv_cache *kv, int s, int keep) {
    rs_ckpt *best = NULL;
    for (int i = 0; i < RS_CKPTS; i++) {
        rs_ckpt *c = &r->ck[i];
        if (!c->p || c->n_pos <= 0 || c->n_pos > keep || (best && c->n_pos <= best->n_pos)) continue;
        if (c->hash == rstate_hash(kv->slots[s].tokens, c->n_pos)) best = c;
    }
    return best;
}

int model_resume(model *m, const kv_cache *kv, int s, int keep) {
    if (m->c.ssm_v_heads == 0) return keep;     /* no recurrent layers: K/V truncate exactly */
    rstate *r = held(m, s);
    if (keep <= 0 || !r || keep > kv->slots[s].n_pos) return 0;
    if (r->n_pos == keep && r->hash == rstate_hash(kv->slots[s].tokens, keep)) return keep;
    rs_ckpt *c = longest_ckpt(r, kv, s, keep);
    if (!c) return 0;
    memcpy(r->p, c->p, r->n * sizeof(float));
    r->n_pos = c->n_pos, r->hash = c->hash, c->used = ++r->tick;
    return c->n_pos;
}

/* ---------------------------------------------------------------- the trail */

int model_trail(model *m, int s, int n, int n_slots) {
    if (m->c.ssm_v_heads == 0 || n <= 0) return 0;      /* K/V alone truncate exactly */
    rstate *r = rstate_slot(m, s, n_slots);
    struct model_priv *P = m->priv;
    if (!r || !fb(&P->trail, (size_t)n * r->n)) return -1;
    for (int i = 0; i < P->n_rs; i++) P->rs[i].trail_want = P->rs[i].trail_n = 0;    /* the buffer is s's now */
    r->trail_want = n;
    return 0;
}

int model_rollback(model *m, kv_cache *kv, int s, int keep) {
    const int n_pos = kv->slots[s].n_pos;
    if (keep >= n_pos) return n_pos;
    mtp_cut(m, s, keep);
    if (kv_rewind(kv, s, keep) != keep) {       /* the windows lost rows a verify never drops */
        kv_truncate(kv, s, 0);
        return -1;
    }
    if (m->c.ssm_v_heads == 0) return keep;
    rstate *r = held(m, s);
    const struct model_priv *P = m->priv;
    const int i = r ? keep - r->trail_pos - 1 : -1;     /* the entry after the row at keep - 1 */
    if (!r || i < 0 || i >= r->trail_n) {
        if (r) r->n_pos = -1;
        kv_truncate(kv, s, 0);
        return -1;
    }
    memcpy(r->p, P->trail.p + (size_t)i * r->n, r->n * sizeof(float));
    r->n_pos = keep, r->hash = rstate_hash(kv->slots[s].tokens, keep);
    return keep;
}

size_t model_slot_state_bytes(const model *m, int s, int *n_ckpt) {
    const rstate *r = held(m, s);
    int n = 0;
    for (int i = 0; r && i < RS_CKPTS; i++) n += r->ck[i].p != NULL;
    if (n_ckpt) *n_ckpt = n;
    return r ? (size_t)(1 + n) * r->n * sizeof(float) : 0;
}

/* ---------------------------------------------------------------- the state file */

static int write_all(FILE *f, const void *p, size_t n) { return n == 0 || fwrite(p, 1, n, f) == n ? 0 : -1; }
static int read_all(FILE *f, void *p, size_t n) { return n == 0 || fread(p, 1, n, f) == n ? 0 : -1; }

static int write_entry(FILE *f, int32_t n_pos, uint64_t hash, const float *p, size_t n) {
    return write_all(f, &n_pos, sizeof n_pos) | write_all(f, &hash, sizeof hash) | write_all(f, p, n * sizeof(float));
}

/* The live state (when it stands after the slot's history and no checkpoint holds it) and
 * the checkpoints; written to path.tmp, then renamed. */
static int write_states(FILE *f, const rstate *r, int live, uint64_t fp) {
    const uint64_t n = r->n;
    uint32_t cnt = (uint32_t)live;
    for (int i = 0; i < RS_CKPTS; i++) cnt += r->ck[i].p != NULL;
    int rc = write_all(f, RS_MAGIC, sizeof RS_MAGIC) | write_all(f, &fp, sizeof fp) |
             write_all(f, &n, sizeof n) | write_all(f, &cnt, sizeof cnt);
    int order[RS_CKPTS], k = 0;         /* least recently used first: loading keeps the order */
    for (int i = 0; i < RS_CKPTS; i++)
        if (r->ck[i].p) {
            int j = k++;
            for (; j > 0 && r->ck[order[j - 1]].used > r->ck[i].used; j--) order[j] = order[j - 1];
            order[j] = i;
        }
    for (int i = 0; i < k && rc == 0; i++)
        rc |= write_entry(f, r->ck[order[i]].n_pos, r->ck[order[i]].hash, r->ck[order[i]].p, r->n);
    if (live) rc |= write_entry(f, r->n_pos, r->hash, r->p, r->n);
    return rc;
}

int model_state_save(const model *m, const kv_cache *kv, int s, const char *path, uint64_t fp) {
    const rstate *r = held(m, s);
    if (!r) return unlink(path) == 0 || access(path, F_OK) != 0 ? 0 : -1;   /* no state: no stale file */
    int live = r->n_pos > 0 && r->n_pos == kv->slots[s].n_pos;
    for (int i = 0; live && i < RS_CKPTS; i++)
        if (r->ck[i].p && r->ck[i].n_pos == r->n_pos && r->ck[i].hash == r->hash) live = 0;
    char tmp[1400];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp) return -1;
    FILE *f = fopen(tmp, "wb");
    if (!f) return -1;
    int rc = write_states(f, r, live, fp);
    if (fclose(f) != 0) rc = -1;
    if (rc == 0 && rename(tmp, path) != 0) rc = -1;
    if (rc != 0) unlink(tmp);
    return rc;
}

/* Reads the entries into r's checkpoints, the last RS_CKPTS when there are more (the file's
 * order is their recency, the live state last). */
static int read_states(FILE *f, rstate *r, uint64_t fp) {
    char magic[8];
    uint64_t ffp, n;
    uint32_t cnt;
    if (read_all(f, magic, 8) || memcmp(magic, RS_MAGIC, 8) || read_all(f, &ffp, 8) || read_all(f, &n, 8) ||
        read_all(f, &cnt, 4) || ffp != fp || n != r->n)
        return -1;
    if (cnt > RS_CKPTS + 1) return -1;
    const long entry = (long)(4 + 8 + r->n * sizeof(float));
    if (cnt > RS_CKPTS && fseek(f, entry * (long)(cnt - RS_CKPTS), SEEK_CUR) != 0) return -1;
    for (uint32_t i = 0; i < cnt && i < RS_CKPTS; i++) {
        rs_ckpt *c = &r->ck[i];
        int32_t pos;
        if (!c->p && !(c->p = malloc(r->n * sizeof(float)))) return -1;
        if (read_all(f, &pos, 4) || read_all(f, &c->hash, 8) || read_all(f, c->p, r->n * sizeof(float)) || pos <= 0)
            return -1;
        c->n_pos = pos, c->used = ++r->tick;
    }
    return 0;
}

int model_state_load(model *m, const kv_cache *kv, int s, const char *path, uint64_t fp) {
    if (!model_state_bytes(m)) return 0;
    rstate *r = rstate_slot(m, s, kv->n_slots);
    if (!r) return -1;
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    const int rc = read_states(f, r, fp);
    fclose(f);
    if (rc != 0) model_forget(m, s);    /* a torn or foreign file: no checkpoints from it */
    return rc;
}
