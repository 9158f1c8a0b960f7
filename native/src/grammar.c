/* grammar.c — byte-DFA constrained decoding. See grammar.h for the wire format and the rules.
 *
 * Mask of a state: one depth-first walk of the token trie that carries the DFA state along
 * each edge; a subtree is cut as soon as its byte leaves the DFA or enters a dead state, so a
 * structural state (after `{`, only `"` or a space fit) costs the root's children only and a
 * free-text state costs one pass over the live trie. The result is kept per state together
 * with the largest distance-to-acceptance among its allowed tokens' targets: while that fits
 * the budget the kept mask is the answer; near the end of the budget a filtered mask is walked
 * into scratch instead (not kept: it depends on the tokens left).
 *
 * Sharing: the trie holds the pieces of at most SHORT bytes (all but a few hundred of a real
 * vocabulary); the longer ones are run through the DFA one by one. States whose signatures
 * agree share the trie part of their mask: a hash of which byte strings of up to SHORT bytes
 * lead from the state to live states, plus its accepting flag, which is all that part depends
 * on. So the positions of a counted string (maxLength: one state per character) walk the trie
 * about once, not once per character; each state then only copies that part and adds its long
 * tokens. far[q] bounds the distance of any state within SHORT bytes of q. */
#include "grammar.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEAD INT_MAX
#define SHORT 16                /* pieces up to this many bytes go in the trie */

typedef struct {
    int32_t child, sibling;     /* -1: none */
    int32_t tok;                /* first token ending here, -1: none (more via tok_next) */
    uint8_t byte;
} tnode;

struct gram_vocab {
    int n;                      /* vocab size */
    int words;                  /* uint64 words of a mask */
    tnode *node;
    int n_node, cap_node;
    int32_t *tok_next;          /* next token with the same bytes, -1 */
    int32_t *off, *len;         /* each token's bytes in buf (len -1: never allowed) */
    int32_t *longs;             /* the tokens longer than SHORT bytes (not in the trie) */
    int n_long;
    uint8_t *buf;
    uint64_t *eog;              /* mask of the end-of-generation tokens */
};

struct gram {
    const gram_vocab *v;
    int n_states, start, cur;
    uint8_t *accept;
    int32_t *first;             /* ranges of state q: [first[q], first[q+1]) */
    uint8_t *lo, *hi;
    int32_t *to;
    int32_t *dist;              /* bytes to an accepting state, DEAD if none is reachable */
    uint64_t **memo;            /* per state: its live-token mask (owned), NULL until needed */
    int32_t *maxnext;           /* per memoised state: bound on the dist of its tokens' targets */
    uint64_t *sig;              /* per state: the signature (top comment) */
    int32_t *far;               /* per state: the largest dist within max_len bytes */
    uint64_t *hkey;             /* signature -> index in masks (open addressing, 0 = empty) */
    int32_t *hval;
    int hcap;
    uint64_t **masks;           /* the shared trie parts of masks */
    int n_masks;
    uint64_t *scratch;          /* budget-filtered mask */
    int32_t **row;              /* per state, built on first use by a walk: the 256 next states,
                                 * -1 for none or a dead one (a lookup instead of a search) */
};

/* ------------------------------------------------------------------ vocabulary trie */

static int trie_child(gram_vocab *v, int at, uint8_t b) {
    for (int c = v->node[at].child; c >= 0; c = v->node[c].sibling)
        if (v->node[c].byte == b) return c;
    if (v->n_node == v->cap_node) {
        int nc = v->cap_node * 2;
        tnode *p = realloc(v->node, (size_t)nc * sizeof *p);
        if (!p) return -1;
        v->node = p;
        v->cap_node = nc;
    }
    int c = v->n_node++;
    v->node[c] = (tnode){ .child = -1, .sibling = v->node[at].child, .tok = -1, .byte = b };
    v->node[at].child = c;
    return c;
}

gram_vocab *gram_vocab_from(const char *const *pieces, const int *lens, const unsigned char *eog,
                            const unsigned char *skip, int n) {
    gram_vocab *v = calloc(1, sizeof *v);
    if (!v) return NULL;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += lens[i] > 0 ? (size_t)lens[i] : 0;
    v->n = n;
    v->words = (n + 63) / 64;
    v->cap_node = 1024;
    v->n_node = 1;
    v->node = malloc((size_t)v->cap_node * sizeof *v->node);
    v->tok_next = malloc(((size_t)n + 1) * sizeof *v->tok_next);
    v->off = malloc(((size_t)n + 1) * sizeof *v->off);
    v->len = malloc(((size_t)n + 1) * sizeof *v->len);
    v->buf = malloc(total + 1);
    v->eog = calloc((size_t)v->words + 1, sizeof *v->eog);
    v->longs = malloc(((size_t)n + 1) * sizeof *v->longs);
    if (!v->longs || !v->node || !v->tok_next || !v->off || !v->len || !v->buf || !v->eog) goto oom;
    v->node[0] = (tnode){ .child = -1, .sibling = -1, .tok = -1 };
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        v->tok_next[i] = -1;
        v->off[i] = (int32_t)at;
        v->len[i] = -1;
        if (eog && eog[i]) {
            v->eog[i >> 6] |= 1ull << (i & 63);
            continue;
        }
        if ((skip && skip[i]) || lens[i] <= 0) continue;
        memcpy(v->buf + at, pieces[i], (size_t)lens[i]);
        v->len[i] = lens[i];
        at += (size_t)lens[i];
        if (lens[i] > SHORT) {
            v->longs[v->n_long++] = i;
            continue;
        }
        int node = 0;
        for (int k = 0; k < lens[i] && node >= 0; k++) node = trie_child(v, node, v->buf[v->off[i] + k]);
        if (node < 0) goto oom;
        v->tok_next[i] = v->node[node].tok;
        v->node[node].tok = i;
    }
    return v;
oom:
    gram_vocab_free(v);
    return NULL;
}

gram_vocab *gram_vocab_build(const tokenizer *t, int vocab) {
    const char **pieces = malloc(((size_t)vocab + 1) * sizeof *pieces);
    int *lens = malloc(((size_t)vocab + 1) * sizeof *lens);
    unsigned char *eog = malloc((size_t)vocab + 1), *skip = malloc((size_t)vocab + 1);
    gram_vocab *v = NULL;
    if (pieces && lens && eog && skip) {
        for (int i = 0; i < vocab; i++) {
            pieces[i] = i < tok_n_vocab(t) ? tok_piece(t, i, &lens[i]) : "";
            if (i >= tok_n_vocab(t)) lens[i] = 0;
            eog[i] = (unsigned char)(tok_is_eog(t, i) != 0);
            skip[i] = (unsigned char)(tok_is_control(t, i) != 0);
        }
        v = gram_vocab_from(pieces, lens, eog, skip, vocab);
    }
    free(pieces);
    free(lens);
    free(eog);
    free(skip);
    return v;
}

void gram_vocab_free(gram_vocab *v) {
    if (!v) return;
    free(v->node);
    free(v->tok_next);
    free(v->off);
    free(v->len);
    free(v->buf);
    free(v->eog);
    free(v->longs);
    free(v);
}

/* ------------------------------------------------------------------ the wire DFA */

static uint32_t rd32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

#define FAIL(...) do { snprintf(err, errlen, __VA_ARGS__); goto bad; } while (0)

/* First pass: checks the layout and counts the ranges. 0 ok. */
static int scan(const uint8_t *b, size_t n, uint32_t states, size_t *n_ranges, char *err, size_t errlen) {
    size_t at = 12, total = 0;
    for (uint32_t q = 0; q < states; q++) {
        if (n - at < 3) FAIL("state %u: truncated", q);
        if (b[at] & ~1u) FAIL("state %u: unknown flags 0x%02x", q, b[at]);
        unsigned nr = (unsigned)b[at + 1] | (unsigned)b[at + 2] << 8;
        at += 3;
        if (nr > 256) FAIL("state %u: %u ranges (at most 256)", q, nr);
        if ((n - at) / 6 < nr) FAIL("state %u: truncated ranges", q);
        int prev = -1;
        for (unsigned k = 0; k < nr; k++, at += 6) {
            unsigned lo = b[at], hi = b[at + 1];
            if (lo > hi || (int)lo <= prev) FAIL("state %u: range %u not ascending and disjoint", q, k);
            if (rd32(b + at + 2) >= states) FAIL("state %u: range %u targets a missing state", q, k);
            prev = (int)hi;
        }
        total += nr;
    }
    if (at != n) FAIL("%zu bytes after the last state", n - at);
    *n_ranges = total;
    return 0;
bad:
    return -1;
}

/* dist[q] = bytes from q to an accepting state (reverse breadth-first search). */
static int distances(gram *g) {
    int S = g->n_states;
    int32_t *cnt = calloc((size_t)S + 1, sizeof *cnt), *queue = malloc((size_t)S * sizeof *queue);
    size_t nr = (size_t)g->first[S];
    int32_t *from = malloc((nr + 1) * sizeof *from);
    if (!cnt || !queue || !from) {
        free(cnt); free(queue); free(from);
        return -1;
    }
    for (size_t k = 0; k < nr; k++) cnt[g->to[k] + 1]++;       /* reverse edges, CSR */
    for (int q = 0; q < S; q++) cnt[q + 1] += cnt[q];
    for (int q = 0; q < S; q++)
        for (int k = g->first[q]; k < g->first[q + 1]; k++) from[cnt[g->to[k]]++] = q;
    for (int q = S; q > 0; q--) cnt[q] = cnt[q - 1];            /* back to starts */
    cnt[0] = 0;
    int head = 0, tail = 0;
    for (int q = 0; q < S; q++) {
        g->dist[q] = g->accept[q] ? 0 : DEAD;
        if (g->accept[q]) queue[tail++] = q;
    }
    while (head < tail) {
        int q = queue[head++];
        for (int k = cnt[q]; k < cnt[q + 1]; k++) {
            int p = from[k];
            if (g->dist[p] == DEAD) {
                g->dist[p] = g->dist[q] + 1;
                queue[tail++] = p;
            }
        }
    }
    free(cnt); free(queue); free(from);
    return 0;
}

static uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* sig and far by max_len rounds over the ranges (adjacent ranges to equal children merged, so
 * two spellings of one transition function hash alike). */
static int signatures(gram *g) {
    int S = g->n_states, L = SHORT;
    uint64_t *h = malloc((size_t)S * sizeof *h), *h2 = malloc((size_t)S * sizeof *h2);
    int32_t *f2 = malloc((size_t)S * sizeof *f2);
    if (!h || !h2 || !f2) {
        free(h); free(h2); free(f2);
        return -1;
    }
    for (int q = 0; q < S; q++) {
        h[q] = g->dist[q] == DEAD ? 0 : 1;
        g->far[q] = g->dist[q];
    }
    for (int round = 0; round < L; round++) {
        for (int q = 0; q < S; q++) {
            if (g->dist[q] == DEAD) { h2[q] = 0; f2[q] = DEAD; continue; }
            uint64_t x = 0x9e3779b97f4a7c15ull;
            int far = g->dist[q], plo = -2, phi = -2;
            uint64_t pch = 0;
            for (int k = g->first[q]; k <= g->first[q + 1]; k++) {
                int end = k == g->first[q + 1];
                int t = end ? -1 : g->to[k];
                if (!end && g->dist[t] == DEAD) continue;
                if (!end && g->lo[k] == phi + 1 && h[t] == pch) { phi = g->hi[k]; continue; }
                if (plo >= 0) x = mix(x ^ ((uint64_t)plo << 8 | (uint64_t)phi) ^ mix(pch + 0x632be59bd9b4e019ull));
                if (end) break;
                plo = g->lo[k], phi = g->hi[k], pch = h[t];
                if (g->far[t] > far) far = g->far[t];
            }
            h2[q] = x;
            f2[q] = far;
        }
        memcpy(h, h2, (size_t)S * sizeof *h);
        memcpy(g->far, f2, (size_t)S * sizeof *f2);
    }
    for (int q = 0; q < S; q++) g->sig[q] = mix(h[q] ^ (uint64_t)g->accept[q] * 0xd6e8feb86659fd93ull) | 1;
    free(h); free(h2); free(f2);
    return 0;
}

gram *gram_parse(const uint8_t *b, size_t n, const gram_vocab *v, char *err, size_t errlen) {
    gram *g = NULL;
    size_t nr = 0;
    if (n < 12 || memcmp(b, "CGD1", 4)) FAIL("not a CGD1 grammar");
    uint32_t states = rd32(b + 4), start = rd32(b + 8);
    if (states < 1 || states > GRAM_MAX_STATES) FAIL("%u states (1..%d)", states, GRAM_MAX_STATES);
    if (start >= states) FAIL("start state %u of %u", start, states);
    if (scan(b, n, states, &nr, err, errlen) != 0) return NULL;
    g = calloc(1, sizeof *g);
    if (!g) FAIL("out of memory");
    g->v = v;
    g->n_states = (int)states;
    g->start = g->cur = (int)start;
    g->accept = malloc(states);
    g->first = malloc(((size_t)states + 1) * sizeof *g->first);
    g->lo = malloc(nr + 1);
    g->hi = malloc(nr + 1);
    g->to = malloc((nr + 1) * sizeof *g->to);
    g->dist = malloc((size_t)states * sizeof *g->dist);
    g->memo = calloc(states, sizeof *g->memo);
    g->sig = malloc((size_t)states * sizeof *g->sig);
    g->far = malloc((size_t)states * sizeof *g->far);
    for (g->hcap = 16; g->hcap < 2 * (int)states; g->hcap *= 2) {}
    g->hkey = calloc((size_t)g->hcap, sizeof *g->hkey);
    g->hval = malloc((size_t)g->hcap * sizeof *g->hval);
    g->masks = malloc((size_t)states * sizeof *g->masks);
    g->maxnext = malloc((size_t)states * sizeof *g->maxnext);
    g->scratch = malloc(((size_t)v->words + 1) * sizeof *g->scratch);
    g->row = calloc(states, sizeof *g->row);
    if (!g->accept || !g->first || !g->lo || !g->hi || !g->to || !g->dist || !g->memo || !g->sig || !g->far || !g->hkey || !g->hval || !g->masks || !g->maxnext ||
        !g->scratch || !g->row)
        FAIL("out of memory");
    size_t at = 12, k = 0;
    for (uint32_t q = 0; q < states; q++) {
        g->accept[q] = b[at] & 1;
        unsigned cnt = (unsigned)b[at + 1] | (unsigned)b[at + 2] << 8;
        at += 3;
        g->first[q] = (int32_t)k;
        for (unsigned i = 0; i < cnt; i++, at += 6, k++) {
            g->lo[k] = b[at];
            g->hi[k] = b[at + 1];
            g->to[k] = (int32_t)rd32(b + at + 2);
        }
    }
    g->first[states] = (int32_t)k;
    if (distances(g) != 0) FAIL("out of memory");
    if (g->dist[start] == DEAD) FAIL("the start state reaches no accepting state");
    if (signatures(g) != 0) FAIL("out of memory");
    return g;
bad:
    gram_free(g);
    return NULL;
}

void gram_free(gram *g) {
    if (!g) return;
    for (int q = 0; q < g->n_states; q++) {
        if (g->row) free(g->row[q]);
        if (g->memo) free(g->memo[q]);
    }
    free(g->maxnext);
    for (int i = 0; i < g->n_masks; i++) free(g->masks[i]);
    free(g->masks);
    free(g->sig);
    free(g->far);
    free(g->hkey);
    free(g->hval);
    free(g->row);
    free(g->memo);
    free(g->accept);
    free(g->first);
    free(g->lo);
    free(g->hi);
    free(g->to);
    free(g->dist);

    free(g->scratch);
    free(g);
}

/* ------------------------------------------------------------------ masks */

/* The state after byte c from q, or -1 (binary search over q's ranges). */
static int step(const gram *g, int q, uint8_t c) {
    int a = g->first[q], z = g->first[q + 1] - 1;
    while (a <= z) {
        int m = (a + z) / 2;
        if (c < g->lo[m]) z = m - 1;
        else if (c > g->hi[m]) a = m + 1;
        else return g->to[m];
    }
    return -1;
}

/* State q's dense row; NULL on OOM (the caller falls back to step). */
static const int32_t *row_of(gram *g, int q) {
    if (g->row[q]) return g->row[q];
    int32_t *r = malloc(256 * sizeof *r);
    if (!r) return NULL;
    for (int c = 0; c < 256; c++) r[c] = -1;
    for (int k = g->first[q]; k < g->first[q + 1]; k++)
        if (g->dist[g->to[k]] != DEAD)
            for (int c = g->lo[k]; c <= g->hi[k]; c++) r[c] = g->to[k];
    return g->row[q] = r;
}

/* Sets in mask the tokens below trie node `at` (reached in state q) whose target's distance
 * is at most limit; *maxd: the largest such distance (stays -1 if none), *mind: the smallest
 * distance of any live target, within limit or not. Recursion depth: the longest piece. */
static void walk(gram *g, int at, int q, int limit, uint64_t *mask, int *maxd, int *mind) {
    const gram_vocab *v = g->v;
    const int32_t *r = row_of(g, q);
    for (int c = v->node[at].child; c >= 0; c = v->node[c].sibling) {
        int q2 = r ? r[v->node[c].byte] : step(g, q, v->node[c].byte);
        if (q2 < 0 || g->dist[q2] == DEAD) continue;
        if (v->node[c].tok >= 0 && g->dist[q2] < *mind) *mind = g->dist[q2];
        if (g->dist[q2] <= limit && v->node[c].tok >= 0) {
            for (int t = v->node[c].tok; t >= 0; t = v->tok_next[t]) mask[t >> 6] |= 1ull << (t & 63);
            if (g->dist[q2] > *maxd) *maxd = g->dist[q2];
        }
        if (v->node[c].child >= 0) walk(g, c, q2, limit, mask, maxd, mind);
    }
}

/* The long tokens' part of walk (same contract). */
static void walk_long(gram *g, int q, int limit, uint64_t *mask, int *maxd, int *mind) {
    const gram_vocab *v = g->v;
    for (int i = 0; i < v->n_long; i++) {
        int t = v->longs[i], x = q;
        for (int k = 0; k < v->len[t] && x >= 0; k++) {
            const int32_t *r = row_of(g, x);
            x = r ? r[v->buf[v->off[t] + k]] : step(g, x, v->buf[v->off[t] + k]);
            if (x >= 0 && g->dist[x] == DEAD) x = -1;
        }
        if (x < 0) continue;
        if (g->dist[x] < *mind) *mind = g->dist[x];
        if (g->dist[x] <= limit) {
            mask[t >> 6] |= 1ull << (t & 63);
            if (g->dist[x] > *maxd) *maxd = g->dist[x];
        }
    }
}

/* The shared trie part of state q's kept mask; NULL on OOM. */
static const uint64_t *trie_part(gram *g, int q) {
    unsigned slot = (unsigned)(g->sig[q] & (uint64_t)(g->hcap - 1));
    while (g->hkey[slot] && g->hkey[slot] != g->sig[q]) slot = (slot + 1) & (unsigned)(g->hcap - 1);
    if (!g->hkey[slot]) {
        uint64_t *m = calloc((size_t)g->v->words + 1, sizeof *m);
        if (!m) return NULL;
        int maxd = -1, mind = DEAD;
        walk(g, 0, q, DEAD - 1, m, &maxd, &mind);
        g->hkey[slot] = g->sig[q];
        g->hval[slot] = g->n_masks;
        g->masks[g->n_masks++] = m;
    }
    return g->masks[g->hval[slot]];
}

static void add_eog(const gram *g, uint64_t *mask) {
    if (!g->accept[g->cur]) return;
    for (int w = 0; w < g->v->words; w++) mask[w] |= g->v->eog[w];
}

const uint64_t *gram_mask(gram *g, int left) {
    int q = g->cur, words = g->v->words;
    if (!g->memo[q]) {
        const uint64_t *part = trie_part(g, q);
        uint64_t *m = part ? malloc(((size_t)words + 1) * sizeof *m) : NULL;
        if (!m) return NULL;
        memcpy(m, part, (size_t)words * sizeof *m);
        int maxd = g->far[q], mind = DEAD;
        walk_long(g, q, DEAD - 1, m, &maxd, &mind);
        add_eog(g, m);
        g->memo[q] = m;
        g->maxnext[q] = maxd;
    }
    /* Every target fits the budget; or not even q does by the byte count (real tokens carry
     * several bytes): no restriction until the bound means something. */
    if (g->maxnext[q] <= left - 1 || g->dist[q] > left) return g->memo[q];
    /* Too few tokens left for some targets: keep those that can still finish in time; when
     * none can (the byte distance overstates the tokens needed), those that get closest. */
    int maxd = -1, mind = DEAD;
    memset(g->scratch, 0, (size_t)words * sizeof *g->scratch);
    walk(g, 0, q, left - 1, g->scratch, &maxd, &mind);
    walk_long(g, q, left - 1, g->scratch, &maxd, &mind);
    if (maxd < 0 && mind != DEAD) {
        walk(g, 0, q, mind, g->scratch, &maxd, &mind);
        walk_long(g, q, mind, g->scratch, &maxd, &mind);
    }
    add_eog(g, g->scratch);
    return g->scratch;
}

int gram_advance(gram *g, int tok) {
    const gram_vocab *v = g->v;
    if (tok < 0 || tok >= v->n || v->len[tok] < 0) return -1;
    int q = g->cur;
    for (int k = 0; k < v->len[tok] && q >= 0; k++) q = step(g, q, v->buf[v->off[tok] + k]);
    if (q < 0 || g->dist[q] == DEAD) return -1;
    g->cur = q;
    return 0;
}

int gram_accepting(const gram *g) { return g->accept[g->cur]; }

int gram_final(const gram *g) { return g->accept[g->cur] && g->first[g->cur] == g->first[g->cur + 1]; }
