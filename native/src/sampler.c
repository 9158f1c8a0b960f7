/* sampler.c — greedy / temperature + top-k + top-p sampling and top-k log-probabilities.
 *
 * Owns: the engine's one sampling rule (temperature, then the top_k cut, then the top_p
 * nucleus within it, as llama.cpp and vLLM order them), its RNG, and top-k log-probabilities.
 *
 * RNG: splitmix64 turns the seed into the state of a xorshift64* generator.
 * Scratch for sample_token: 8 * vocab bytes (vocab (float prob, int id) pairs,
 * i.e. "2 * vocab floats/ints worth"), 4-byte aligned; the caller owns it and may
 * reuse it between calls. Only used when temperature > 0.
 * logits are never modified. */
#include "sampler.h"

#include <math.h>
#include <stdlib.h>

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void rng_seed(rng_state *r, uint64_t seed) {
    uint64_t x = seed;
    r->s = splitmix64(&x);
    if (r->s == 0) r->s = 0x2545f4914f6cdd1dull;   /* xorshift must not start at 0 */
}

double rng_uniform(rng_state *r) {
    uint64_t x = r->s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    r->s = x;
    return ((x * 0x2545f4914f6cdd1dull) >> 11) * (1.0 / 9007199254740992.0);
}

#define ALLOWED(allow, i) (!(allow) || ((allow)[(i) >> 6] >> ((i) & 63) & 1))

/* The highest allowed logit (lowest id on ties); -1 if none is allowed. */
static int argmax(const float *logits, int vocab, const uint64_t *allow) {
    int best = -1;
    for (int i = 0; i < vocab; i++)
        if (ALLOWED(allow, i) && (best < 0 || logits[i] > logits[best])) best = i;
    return best;
}

typedef struct { float p; int id; } cand;   /* the scratch layout: vocab of these */

/* Probability descending, id ascending on ties (deterministic). */
static int cmp_cand(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->p > y->p) return -1;
    if (x->p < y->p) return 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* c[0..) := the allowed tokens (all of them without a mask) with unnormalised probabilities
 * exp((logit - max) / temperature), max = 1; *total their sum. Returns their count. */
static int candidates(const float *logits, int vocab, float temperature, int best, const uint64_t *allow,
                      cand *c, double *total) {
    float mx = logits[best];
    int vc = 0;
    *total = 0;
    for (int i = 0; i < vocab; i++) {
        if (!ALLOWED(allow, i)) continue;
        c[vc].p = expf((logits[i] - mx) / temperature);
        c[vc].id = i;
        *total += c[vc++].p;
    }
    return vc;
}

/* c[0..n) sorted by probability: the shortest prefix whose mass reaches `need` is the nucleus;
 * one uniform draw picks a token from it in proportion to its probability. */
static int draw_nucleus(const cand *c, int n, double need, rng_state *r) {
    int keep = 0;
    double mass = 0;
    while (keep < n) {
        mass += c[keep++].p;
        if (mass >= need) break;
    }
    double u = rng_uniform(r) * mass, acc = 0;
    for (int i = 0; i < keep; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[keep - 1].id;
}

int sample_token(const float *logits, int vocab, float temperature, float top_p,
                 rng_state *r, void *scratch, const uint64_t *allow) {
    if (vocab <= 1) return ALLOWED(allow, 0) ? 0 : -1;
    int best = argmax(logits, vocab, allow);
    if (best < 0 || !(temperature > 0.0f)) return best;

    cand *c = scratch;
    double total = 0;
    int vc = candidates(logits, vocab, temperature, best, allow, c, &total);

    if (!(top_p < 1.0f)) {               /* no nucleus cut: sample over everything */
        double u = rng_uniform(r) * total, acc = 0;
        for (int i = 0; i < vc; i++) {
            acc += c[i].p;
            if (u < acc) return c[i].id;
        }
        return best;
    }

    /* The nucleus is a prefix of the candidates sorted by probability. Sorting only
     * those above a threshold is exact as soon as their mass reaches top_p, so
     * partition at falling thresholds (all candidates stay in the array) before
     * falling back to sorting everything. */
    double need = (double)top_p * total;
    int n = vc;
    for (float cut = 1e-3f; cut > 1e-12f; cut *= 1e-3f) {
        double mass = 0;
        int m = 0;
        for (int i = 0; i < vc; i++)
            if (c[i].p >= cut) {
                cand t = c[m]; c[m] = c[i]; c[i] = t;
                mass += c[m++].p;
            }
        if (mass >= need) { n = m; break; }
    }
    qsort(c, (size_t)n, sizeof *c, cmp_cand);
    return draw_nucleus(c, n, need, r);
}

/* Moves the k most probable candidates to c[0..k), in any order (Hoare quickselect, O(n)
 * on average): the top_k cut costs no sort of the vocabulary. */
static void select_top(cand *c, int n, int k) {
    int lo = 0, hi = n - 1;
    while (lo < hi) {
        float pivot = c[lo + (hi - lo) / 2].p;
        int i = lo, j = hi;
        while (i <= j) {
            while (c[i].p > pivot) i++;
            while (c[j].p < pivot) j--;
            if (i <= j) {
                cand t = c[i]; c[i] = c[j]; c[j] = t;
                i++;
                j--;
            }
        }
        if (k - 1 <= j) hi = j;
        else if (k - 1 >= i) lo = i;
        else return;
    }
}

int sample_token_k(const float *logits, int vocab, float temperature, float top_p, int top_k,
                   rng_state *r, void *scratch, const uint64_t *allow) {
    if (top_k <= 0 || top_k >= vocab || !(temperature > 0.0f))
        return sample_token(logits, vocab, temperature, top_p, r, scratch, allow);
    int best = argmax(logits, vocab, allow);
    if (best < 0) return -1;
    cand *c = scratch;
    double all = 0;
    int vc = candidates(logits, vocab, temperature, best, allow, c, &all);
    if (top_k > vc) top_k = vc;
    select_top(c, vc, top_k);
    qsort(c, (size_t)top_k, sizeof *c, cmp_cand);   /* the nucleus is a prefix of these */
    double total = 0;
    for (int i = 0; i < top_k; i++) total += c[i].p;
    return draw_nucleus(c, top_k, top_p < 1.0f ? (double)top_p * total : total, r);
}

double logsumexp_allowed(const float *logits, int vocab, const uint64_t *allow) {
    int best = argmax(logits, vocab, allow);
    if (best < 0) return -INFINITY;
    double mx = logits[best], sum = 0;
    for (int i = 0; i < vocab; i++)
        if (ALLOWED(allow, i)) sum += exp((double)logits[i] - mx);
    return mx + log(sum);
}

int topk_logprobs(const float *logits, int vocab, int k, const uint64_t *allow, int *ids, float *logprobs) {
    if (k <= 0) return 0;
    int n = 0;   /* ids[0..n) sorted by logit descending (id ascending on ties) */
    for (int i = 0; i < vocab; i++) {
        if (!ALLOWED(allow, i)) continue;
        if (n == k && !(logits[i] > logits[ids[n - 1]])) continue;
        int j = n < k ? n++ : k - 1;
        while (j > 0 && logits[i] > logits[ids[j - 1]]) {
            ids[j] = ids[j - 1];
            j--;
        }
        ids[j] = i;
    }
    double lse = n ? logsumexp_allowed(logits, vocab, allow) : 0;
    for (int i = 0; i < n; i++) logprobs[i] = (float)(logits[ids[i]] - lse);
    for (int i = n; i < k; i++) {        /* fewer candidates than k: pad */
        ids[i] = -1;
        logprobs[i] = -INFINITY;
    }
    return n;
}
