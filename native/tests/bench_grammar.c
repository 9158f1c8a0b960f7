/* bench_grammar.c — time of grammar masks on a real vocabulary (not a test):
 *     build/bench_grammar MODEL.gguf GRAMMAR.cgd1 TEXT
 * Walks TEXT's bytes token by token (greedy longest piece that the DFA allows) and reports the
 * time of the first mask of each state (a trie walk) and of a repeated one (the memo). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "grammar.h"
#include "gguf.h"
#include "telemetry.h"
#include "tokenizer.h"

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: %s MODEL.gguf GRAMMAR TEXT\n", argv[0]); return 2; }
    gguf_file f;
    char err[256];
    if (gguf_open(&f, argv[1]) != 0) { fprintf(stderr, "cannot open %s\n", argv[1]); return 1; }
    tokenizer *t = tok_load(&f, err, sizeof err);
    if (!t) { fprintf(stderr, "%s\n", err); return 1; }
    int n = tok_n_vocab(t);
    double t0 = now_s();
    gram_vocab *v = gram_vocab_build(t, n);
    printf("vocab %d: trie built in %.2f ms\n", n, 1e3 * (now_s() - t0));
    FILE *fp = fopen(argv[2], "rb");
    if (!fp) return 1;
    static uint8_t buf[1 << 20];
    size_t len = fread(buf, 1, sizeof buf, fp);
    fclose(fp);
    gram *g = gram_parse(buf, len, v, err, sizeof err);
    if (!g) { fprintf(stderr, "grammar: %s\n", err); return 1; }
    const char *text = argv[3];
    size_t at = 0, tl = strlen(text);
    double first = 0, again = 0;
    int steps = 0;
    while (at < tl) {
        double a = now_s();
        const uint64_t *m = gram_mask(g, 1 << 20);
        double b = now_s();
        gram_mask(g, 1 << 20);
        again += now_s() - b;
        first += b - a;
        int best = -1, bl = 0;
        for (int id = 0; id < n; id++) {
            if (!(m[id >> 6] >> (id & 63) & 1)) continue;
            int pl = 0;
            const char *p = tok_piece(t, id, &pl);
            if (pl > bl && (size_t)pl <= tl - at && !memcmp(p, text + at, (size_t)pl)) { best = id; bl = pl; }
        }
        if (best < 0 || gram_advance(g, best) != 0) { fprintf(stderr, "text leaves the grammar at %zu\n", at); break; }
        at += (size_t)bl;
        steps++;
    }
    printf("%d tokens: first mask of a state %.3f ms, memoised %.4f ms (mean)\n", steps, 1e3 * first / steps,
           1e3 * again / steps);
    gram_free(g);
    gram_vocab_free(v);
    tok_free(t);
    gguf_close(&f);
    return 0;
}
