/* test_grammar.c — constrained decoding masks (grammar.c) against a brute-force check: random
 * DFAs over a small vocabulary (every byte, multi-byte pieces sharing prefixes, duplicates, an
 * end token, a skipped control token); at random states and budgets each token is run through
 * the DFA byte by byte here and must be in the mask exactly when it ends in a live state within
 * the budget (end token: exactly in accepting states); pieces longer than the trie's limit too. Also: malformed wire bytes are refused,
 * and the sampler honours the mask (greedy, temperature, top-p, top-k). */
#define TEST_SEED 0x6a6d6d61ull
#include "check.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "sampler.h"

#define NV 300
#define MAXS 24
#define INF INT_MAX

static char piece[NV][24];
static const char *pieces[NV];
static int lens[NV];
static unsigned char eog[NV], skip[NV];

typedef struct { int n, start, acc[MAXS], nr[MAXS], lo[MAXS][8], hi[MAXS][8], to[MAXS][8], dist[MAXS]; } dfa;

static void make_vocab(void) {
    for (int i = 0; i < 256; i++) { piece[i][0] = (char)i; lens[i] = 1; }
    const char *multi[] = { "ab", "abc", "ba", "a", "{\"", "\"}", "12", "123", "xyz", "a" };
    int k = 256;
    for (int i = 0; i < (int)(sizeof multi / sizeof *multi); i++, k++) {
        lens[k] = (int)strlen(multi[i]);
        memcpy(piece[k], multi[i], (size_t)lens[k]);
    }
    for (; k < NV; k++) {               /* random 2..5 byte pieces over a small alphabet, and a
                                         * few longer than the trie's 16 bytes */
        lens[k] = k >= NV - 30 ? 17 + (int)(rnd32() % 6) : 2 + (int)(rnd32() % 4);
        for (int j = 0; j < lens[k]; j++) piece[k][j] = (char)('a' + rnd32() % 4);
    }
    for (int i = 0; i < NV; i++) pieces[i] = piece[i];
    eog[NV - 1] = 1;                    /* an end token and a control token */
    skip[NV - 2] = 1;
}

static int dstep(const dfa *d, int q, unsigned char c) {
    for (int k = 0; k < d->nr[q]; k++)
        if (c >= d->lo[q][k] && c <= d->hi[q][k]) return d->to[q][k];
    return -1;
}

static void random_dfa(dfa *d) {
    memset(d, 0, sizeof *d);
    d->n = 1 + (int)(rnd32() % MAXS);
    d->start = (int)(rnd32() % d->n);
    for (int q = 0; q < d->n; q++) {
        d->acc[q] = rnd32() % 4 == 0;
        int at = rnd32() % 2 ? 'a' - 2 : (int)(rnd32() % 200);   /* mostly around the alphabet */
        int nr = (int)(rnd32() % 6);
        for (int k = 0; k < nr && at < 255; k++) {
            int lo = at + 1 + (int)(rnd32() % 3), hi = lo + (int)(rnd32() % 3);
            if (hi > 255) hi = 255;
            if (lo > 255) break;
            d->lo[q][d->nr[q]] = lo;
            d->hi[q][d->nr[q]] = hi;
            d->to[q][d->nr[q]++] = (int)(rnd32() % d->n);
            at = hi;
        }
    }
    d->acc[(int)(rnd32() % d->n)] = 1;
    for (int q = 0; q < d->n; q++) d->dist[q] = d->acc[q] ? 0 : INF;   /* Bellman-Ford */
    for (int it = 0; it < d->n; it++)
        for (int q = 0; q < d->n; q++)
            for (int k = 0; k < d->nr[q]; k++) {
                int t = d->dist[d->to[q][k]];
                if (t != INF && t + 1 < d->dist[q]) d->dist[q] = t + 1;
            }
}

static size_t encode(const dfa *d, uint8_t *b) {
    size_t at = 0;
    memcpy(b, "CGD1", 4);
    at = 4;
    uint32_t v[2] = { (uint32_t)d->n, (uint32_t)d->start };
    for (int i = 0; i < 2; i++, at += 4)
        for (int j = 0; j < 4; j++) b[at + (size_t)j] = (uint8_t)(v[i] >> (8 * j));
    for (int q = 0; q < d->n; q++) {
        b[at++] = (uint8_t)d->acc[q];
        b[at++] = (uint8_t)d->nr[q];
        b[at++] = 0;
        for (int k = 0; k < d->nr[q]; k++) {
            b[at++] = (uint8_t)d->lo[q][k];
            b[at++] = (uint8_t)d->hi[q][k];
            for (int j = 0; j < 4; j++) b[at++] = (uint8_t)((uint32_t)d->to[q][k] >> (8 * j));
        }
    }
    return at;
}

/* Where token t leads from q, or -1 (dead or off the DFA). */
static int target(const dfa *d, int q, int t) {
    for (int j = 0; j < lens[t] && q >= 0; j++) q = dstep(d, q, (unsigned char)piece[t][j]);
    return q >= 0 && d->dist[q] != INF ? q : -1;
}

/* The brute-force verdict for token t in state q with `left` tokens. */
static int allowed(const dfa *d, int q, int t, int left) {
    if (eog[t]) return d->acc[q];
    if (skip[t]) return 0;
    int near = INF;                     /* the closest live target of any token */
    for (int u = 0; u < NV; u++) {
        int x = eog[u] || skip[u] ? -1 : target(d, q, u);
        if (x >= 0 && d->dist[x] < near) near = d->dist[x];
    }
    int limit = d->dist[q] > left ? INF - 1 : left - 1 > near ? left - 1 : near;
    int x = target(d, q, t);
    return x >= 0 && d->dist[x] <= limit;
}

static void test_masks(gram_vocab *v) {
    uint8_t buf[16 + MAXS * (3 + 8 * 6)];
    int checked = 0, nonempty = 0;
    for (int round = 0; round < 400; round++) {
        dfa d;
        random_dfa(&d);
        size_t n = encode(&d, buf);
        char err[128];
        gram *g = gram_parse(buf, n, v, err, sizeof err);
        if (d.dist[d.start] == INF) {
            CHECK(!g, "round %d: a DFA whose start is dead was accepted", round);
            gram_free(g);
            continue;
        }
        CHECK(g, "round %d: refused: %s", round, err);
        if (!g) continue;
        int q = d.start;
        for (int stepn = 0; stepn < 12; stepn++) {
            int left = 1 + (int)(rnd32() % 8);
            const uint64_t *m = gram_mask(g, left);
            CHECK(m, "mask: out of memory");
            if (!m) break;
            int pick[NV], np = 0;
            for (int t = 0; t < NV; t++) {
                int in = (int)(m[t >> 6] >> (t & 63) & 1);
                CHECK(in == allowed(&d, q, t, left), "round %d state %d left %d token %d: mask %d", round, q,
                      left, t, in);
                if (in && !eog[t]) pick[np++] = t;
                checked++;
            }
            CHECK(gram_accepting(g) == d.acc[q], "accepting differs in state %d", q);
            int final = d.acc[q] && d.nr[q] == 0;
            CHECK(gram_final(g) == final, "final differs in state %d", q);
            if (!np) break;
            nonempty++;
            int t = pick[rnd32() % (unsigned)np];
            CHECK(gram_advance(g, t) == 0, "advance by an allowed token failed");
            for (int j = 0; j < lens[t]; j++) q = dstep(&d, q, (unsigned char)piece[t][j]);
        }
        CHECK(gram_advance(g, NV - 1) == -1, "advance by the end token succeeded");
        gram_free(g);
    }
    CHECK(nonempty > 200, "only %d non-empty masks: the random DFAs test too little", nonempty);
    printf("masks: %d token verdicts, %d non-empty masks\n", checked, nonempty);
}

static void test_malformed(gram_vocab *v) {
    dfa d = { .n = 2, .start = 0, .acc = { 0, 1 }, .nr = { 1, 0 } };
    d.lo[0][0] = 'a'; d.hi[0][0] = 'b'; d.to[0][0] = 1;
    uint8_t b[64], c[64];
    size_t n = encode(&d, b);
    char err[128];
    gram *g = gram_parse(b, n, v, err, sizeof err);
    CHECK(g, "a valid DFA was refused: %s", err);
    gram_free(g);
    struct { size_t at; uint8_t val; int len_delta; const char *what; } cases[] = {
        { 0, 'X', 0, "magic" }, { 4, 0, 0, "zero states" }, { 8, 2, 0, "start out of range" },
        { 12, 2, 0, "flag bits" }, { 13, 2, 0, "more ranges than bytes" }, { 15, 'c', 0, "lo > hi" },
        { 17, 9, 0, "target out of range" }, { 0, 0, 1, "trailing byte" }, { 0, 0, -1, "truncated" },
        { 7, 0x40, 0, "too many states" },
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        memcpy(c, b, n);
        size_t len = n + (size_t)cases[i].len_delta;
        if (cases[i].len_delta == 0) c[cases[i].at] = cases[i].val;
        else c[n] = 0;
        g = gram_parse(c, len, v, err, sizeof err);
        CHECK(!g, "malformed (%s) accepted", cases[i].what);
        gram_free(g);
    }
    CHECK(!gram_parse(b, 5, v, err, sizeof err), "5 bytes accepted");
}

static void test_sampler(void) {
    float logits[200];
    for (int i = 0; i < 200; i++) logits[i] = frand() * 3;
    uint64_t allow[4] = { 0 };
    int ok[] = { 3, 70, 131, 199 };
    for (int i = 0; i < 4; i++) allow[ok[i] >> 6] |= 1ull << (ok[i] & 63);
    char scratch[200 * 8];
    rng_state r;
    rng_seed(&r, 7);
    int best = 0;
    for (int i = 1; i < 4; i++) if (logits[ok[i]] > logits[ok[best]]) best = i;
    CHECK(sample_token(logits, 200, 0, 1, &r, scratch, allow) == ok[best], "greedy ignores the mask");
    int seen[200] = { 0 };
    for (int i = 0; i < 2000; i++) {
        int t = sample_token(logits, 200, 1.5f, i % 2 ? 1.0f : 0.9f, &r, scratch, allow);
        CHECK(t >= 0 && t < 200, "sampled %d", t);
        if (t >= 0 && t < 200) seen[t]++;
    }
    int inside = seen[3] + seen[70] + seen[131] + seen[199];
    CHECK(inside == 2000, "%d of 2000 samples outside the mask", 2000 - inside);
    CHECK(seen[ok[best]] > 0 && (seen[3] > 0) + (seen[70] > 0) + (seen[131] > 0) + (seen[199] > 0) >= 3,
          "temperature sampling does not spread over the mask");
    int ids[6];
    float lps[6];
    int k = topk_logprobs(logits, 200, 6, allow, ids, lps);
    CHECK(k == 4 && ids[4] == -1 && isinf(lps[5]), "top-k under a mask of 4: %d", k);
    double sum = 0;
    for (int i = 0; i < k; i++) sum += exp(lps[i]);
    CHECK(fabs(sum - 1) < 1e-5, "masked log-probabilities do not normalise: %f", sum);
    /* top_k under a mask: only the 2 most likely allowed tokens, never one outside the mask
     * (top_k counts allowed tokens, not the vocabulary's) */
    int second = best == 0 ? 1 : 0;
    for (int i = 0; i < 4; i++) if (i != best && logits[ok[i]] > logits[ok[second]]) second = i;
    int top2 = 0;
    for (int i = 0; i < 1000; i++) {
        int t = sample_token_k(logits, 200, 2.0f, 1.0f, 2, &r, scratch, allow);
        top2 += t == ok[best] || t == ok[second];
    }
    CHECK(top2 == 1000, "top_k=2 under a mask: %d of 1000 samples outside the top 2 allowed", 1000 - top2);
    CHECK(sample_token_k(logits, 200, 1.0f, 1.0f, 50, &r, scratch, allow) >= 0, "top_k beyond the mask's size");
    uint64_t none[4] = { 0 };
    CHECK(sample_token_k(logits, 200, 1.0f, 1.0f, 5, &r, scratch, none) == -1, "top_k with an empty mask");
    CHECK(sample_token(logits, 200, 0, 1, &r, scratch, none) == -1, "greedy with an empty mask");
    CHECK(sample_token(logits, 200, 1, 1, &r, scratch, none) == -1, "sampling with an empty mask");
}

int main(void) {
    make_vocab();
    gram_vocab *v = gram_vocab_from(pieces, lens, eog, skip, NV);
    CHECK(v, "vocab: out of memory");
    if (!v) return 1;
    test_masks(v);
    test_malformed(v);
    test_sampler();
    gram_vocab_free(v);
    printf("test_grammar: %s\n", fails ? "FAILED" : "ok");
    return fails != 0;
}
