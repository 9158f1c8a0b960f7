/* tok_ids.c — tokenizer driver for native/tools/check_tokenizer.py (not a unit test).
 *   tok_ids MODEL.gguf FILE...        one line of space-separated ids per FILE (and a check
 *                                     that the pieces give back the input bytes)
 *   tok_ids --bench MODEL.gguf FILE   encode FILE repeatedly, print MB/s and tokens/s
 *   tok_ids --specials MODEL.gguf     one line per control / user-defined token:
 *                                     "id eog control shown-text" (the text a reply shows)
 * Build: make -C native build/tok_ids */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "tokenizer.h"

static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *b = malloc(n > 0 ? (size_t)n : 1);   /* exact size: ASan sees any read past the text */
    if (b && fread(b, 1, (size_t)n, f) != (size_t)n) { free(b); b = NULL; }
    fclose(f);
    *len = (size_t)n;
    return b;
}

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 && argv[1][0] == '-' ? argv[1] : "";
    int skip = *mode != 0;
    int bench = strcmp(mode, "--bench") == 0, specials = strcmp(mode, "--specials") == 0;
    if ((skip && !bench && !specials) || argc < 3 + skip - specials) {
        fprintf(stderr, "usage: tok_ids [--bench] MODEL.gguf FILE... | tok_ids --specials MODEL.gguf\n");
        return 2;
    }
    gguf_file g;
    if (gguf_open(&g, argv[1 + skip]) != 0) { fprintf(stderr, "%s\n", g.err); return 1; }
    char err[256];
    tokenizer *t = tok_load(&g, err, sizeof err);
    if (!t) { fprintf(stderr, "%s\n", err); return 1; }
    if (specials) {
        for (int i = 0; i < tok_n_vocab(t); i++) {
            int ty = tok_type(t, i), pl = 0;
            if (ty != 3 && ty != 4) continue;
            const char *p = tok_is_control(t, i) ? "" : tok_piece(t, i, &pl);
            printf("%d %d %d %.*s\n", i, tok_is_eog(t, i), tok_is_control(t, i), pl, p);
        }
        tok_free(t);
        gguf_close(&g);
        return 0;
    }
    int rc = 0;
    int has_byte[256];   /* bytes without a byte token are dropped by the encoder (as by HF) */
    for (int b = 0; b < 256; b++) {
        char c = (char)b;
        int id;
        has_byte[b] = tok_encode(t, &c, 1, &id, 1) == 1;
    }
    for (int a = 2 + skip; a < argc; a++) {
        size_t len;
        char *text = slurp(argv[a], &len);
        if (!text) { fprintf(stderr, "cannot read %s\n", argv[a]); rc = 1; continue; }
        int cap = (int)len + 16;
        int *ids = malloc(sizeof(int) * (size_t)cap);
        int n = tok_encode(t, text, len, ids, cap);
        if (n < 0 || n > cap) { fprintf(stderr, "encode failed\n"); return 1; }
        if (bench) {
            int reps = 0;
            double t0 = now(), dt;
            do { tok_encode(t, text, len, ids, cap); reps++; } while ((dt = now() - t0) < 2.0);
            printf("%zu bytes -> %d tokens; %.2f MB/s, %.0f tokens/s\n", len, n,
                   (double)len * reps / dt / 1e6, (double)n * reps / dt);
        } else {
            for (int i = 0; i < n; i++) printf(i ? " %d" : "%d", ids[i]);
            printf("\n");
            /* round trip: pieces must give back the input bytes */
            size_t o = 0, k = 0;
            for (size_t i = 0; i < len; i++)
                if (has_byte[(unsigned char)text[i]]) text[k++] = text[i];
            int ok = 1;
            for (int i = 0; i < n && ok; i++) {
                int pl;
                const char *p = tok_piece(t, ids[i], &pl);
                if (o + (size_t)pl > k || memcmp(text + o, p, (size_t)pl) != 0) ok = 0;
                o += (size_t)pl;
            }
            if (!ok || o != k) { fprintf(stderr, "%s: pieces do not give back the input\n", argv[a]); rc = 1; }
        }
        free(ids);
        free(text);
    }
    tok_free(t);
    gguf_close(&g);
    return rc;
}
