/* test_tokenizer.c — byte-level BPE tokenizer and UTF-8 stream sanitizer.
 * A small vocabulary is built here: the 256 byte tokens, a few merges (some of which would
 * join across pre-token boundaries if the pre-tokenizer were wrong) and special tokens.
 * Results are checked as "|"-joined token pieces. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gguf.h"
#include "tokenizer.h"
#include "unicode.h"
#include "utf8stream.h"

static int failures;
#define CHECK(c) do { if (!(c)) { failures++; fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #c); } } while (0)

/* GPT-2 bytes_to_unicode, to write merges in raw form */
static void byte_level(const char *raw, char *out)
{
    int k = 0;
    for (const unsigned char *p = (const unsigned char *)raw; *p; p++) {
        unsigned b = *p, cp = b;
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        if (!printable) {
            cp = 256;
            for (unsigned x = 0; x < b; x++)
                if (!((x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || x >= 0xAE)) cp++;
        }
        if (cp < 0x80) out[k++] = (char)cp;
        else { out[k++] = (char)(0xC0 | (cp >> 6)); out[k++] = (char)(0x80 | (cp & 0x3F)); }
    }
    out[k] = 0;
}

/* raw merges "left", "right"; merged tokens are added to the vocab in order */
static const char *raw_merges[][2] = {
    { "t", "'" },  { "a", "<" },  { "e", "\xe6" }, { "a", "\xff" },   /* cross-boundary traps */
    { " ", " " },  { "  ", " " }, { " ", "b" },    { "\n", "\n" },  { " ", "y" },
    { "1", "2" },  { "12", "3" }, { " ", "1" },    { "'", "s" },    { "i", "t" },
    { "\xe6", "\x97" }, { "\xe6\x97", "\xa5" }, { "\xe6", "\x9c" }, { "\xe6\x9c", "\xac" },
    { "\xe6\x97\xa5", "\xe6\x9c\xac" }, { " ", "\xff" }, { "\xf0", "\x9f" }, { "\x98", "\x80" },
    { "\xf0\x9f", "\x98\x80" }, { "a", "b" }, { "ab", "c" }, { "'", "ll" }, { "l", "l" },
    { "\xd9", "\xa3" }, { "\xd9", "\xa4" }, { "\xd9\xa3", "\xd9\xa4" },   /* Arabic-Indic 3, 4 */
    { "\xe3", "\x80" }, { " ", "\xe3\x80" }, { "\xe3\x80", "\x80" },       /* U+3000 */
};
#define N_MERGES ((int)(sizeof raw_merges / sizeof *raw_merges))
static const char *specials[] = { "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|im_end|>!!", "<tool>" };
#define N_SPECIAL ((int)(sizeof specials / sizeof *specials))

static char *vocab[256 + N_MERGES + N_SPECIAL];
static int types[256 + N_MERGES + N_SPECIAL];
static char *merges[N_MERGES];
static int n_vocab;

static void make_tables(void)
{
    char buf[160], a[64], b[64];
    n_vocab = 0;
    for (int i = 0; i < N_SPECIAL; i++) { vocab[n_vocab] = strdup(specials[i]); types[n_vocab++] = 3; }
    types[4] = 4;   /* "<tool>": user-defined */
    for (int c = 0; c < 256; c++) {
        char raw[2] = { (char)(c ? c : 1), 0 };
        byte_level(raw, buf);
        if (c == 0) strcpy(buf, "\xc4\x80");   /* byte 0 maps to U+0100 */
        vocab[n_vocab] = strdup(buf);
        types[n_vocab++] = 1;
    }
    for (int i = 0; i < N_MERGES; i++) {
        char raw[64];
        byte_level(raw_merges[i][0], a);
        byte_level(raw_merges[i][1], b);
        snprintf(buf, sizeof buf, "%s %s", a, b);
        merges[i] = strdup(buf);
        snprintf(raw, sizeof raw, "%s%s", raw_merges[i][0], raw_merges[i][1]);
        byte_level(raw, buf);
        vocab[n_vocab] = strdup(buf);
        types[n_vocab++] = 1;
    }
}

/* encode and join the pieces with '|' */
static const char *pieces(const tokenizer *t, const char *text, size_t len)
{
    static char out[4096];
    int ids[512];
    int n = tok_encode(t, text, len, ids, 512);
    size_t o = 0;
    for (int i = 0; i < n && i < 512; i++) {
        int pl;
        const char *p = tok_piece(t, ids[i], &pl);
        if (i) out[o++] = '|';
        memcpy(out + o, p, (size_t)pl);
        o += (size_t)pl;
    }
    out[o] = 0;
    return out;
}

static int expect(const tokenizer *t, const char *text, const char *want)
{
    const char *got = pieces(t, text, strlen(text));
    if (strcmp(got, want) != 0) {
        fprintf(stderr, "encode(\"%s\"):\n  got  \"%s\"\n  want \"%s\"\n", text, got, want);
        return 0;
    }
    return 1;
}
#define EXPECT(t, text, want) do { if (!expect(t, text, want)) { failures++; fprintf(stderr, "  at line %d\n", __LINE__); } } while (0)

static int find(const tokenizer *t, const char *text)
{
    for (int i = 0; i < tok_n_vocab(t); i++)
        if (strcmp(tok_text(t, i), text) == 0) return i;
    return -1;
}

static void test_unicode(void)
{
    CHECK(uni_is_letter('a') && uni_is_letter(0x65E5) && uni_is_letter(0xE9) && !uni_is_letter('1'));
    CHECK(uni_is_number('7') && uni_is_number(0x663) && uni_is_number(0x216B) && uni_is_number(0xBD));
    CHECK(!uni_is_number(0x4E00));           /* CJK "one" is a letter (Lo) */
    CHECK(uni_is_space(' ') && uni_is_space(0x3000) && uni_is_space(0xA0) && uni_is_space(0x85));
    CHECK(!uni_is_space(0x200B) && !uni_is_space(0x1C));   /* zero width space, info separator */
    CHECK(!uni_is_letter(0x1F600) && !uni_is_number(0x1F600) && !uni_is_space(0x1F600));
    CHECK(!uni_is_letter(0x301));            /* combining acute: Mn, "other" */
    CHECK(uni_is_mark(0x301) && uni_is_mark(0x903) && uni_is_mark(0x20DD) && !uni_is_mark('a'));
    CHECK(uni_is_upper('A') && uni_is_upper(0x1C5) && uni_is_upper(0x391) && !uni_is_upper('a'));
    CHECK(uni_is_lower('a') && uni_is_lower(0x3B1) && uni_is_lower(0xDF) && !uni_is_lower(0x1C5));
    CHECK(!uni_is_upper(0x65E5) && !uni_is_lower(0x65E5) && !uni_is_upper(0x2B0) && !uni_is_lower(0x2B0));
}

static void test_gpt2(const tokenizer *g, const tokenizer *s)
{
    /* digits: GPT-2 keeps a number together (with its space); smollm splits every digit */
    EXPECT(g, "abc 123", "abc| |123");           /* " 123" is one pre-token; no " 123" merge */
    EXPECT(g, "\xd9\xa3\xd9\xa4", "\xd9\xa3\xd9\xa4");
    EXPECT(g, "x123", "x|123");
    EXPECT(s, "abc 123", "abc| |1|2|3");
    EXPECT(s, "x123", "x|1|2|3");
    EXPECT(s, "\xd9\xa3\xd9\xa4", "\xd9\xa3|\xd9\xa4");   /* Arabic-Indic digits are \p{N} too */
    /* contractions: 't is not one, so "t'" would merge if the split were wrong */
    EXPECT(g, "it's", "it|'s");
    EXPECT(g, "it'll", "it|'ll");
    EXPECT(g, "it'S", "it|'|S");                 /* case-sensitive */
    EXPECT(g, "t'x", "t|'|x");
    /* whitespace runs: \s+(?!\S) leaves the last space to the next word */
    EXPECT(g, "a   b", "a|  | b");
    EXPECT(g, "a   ", "a|   ");
    EXPECT(g, "x\n\n y", "x|\n\n| y");
    EXPECT(g, "x\n\ny", "x|\n|\n|y");            /* a lone \n before a letter: \s+ ; no "\n\n" */
    EXPECT(g, "a \xe3\x80\x80" "b", "a| |\xe3\x80\x80|b");   /* U+3000 is \s but not " ?" */
    EXPECT(g, "a !?", "a| |!|?");
    /* special tokens: atomic, longest first, the rest through the normal path */
    EXPECT(g, "a<|im_end|>b", "a|<|im_end|>|b");
    EXPECT(g, "a<|im_end|>!!b", "a|<|im_end|>!!|b");
    EXPECT(g, "<|im_start|>user\n<tool>", "<|im_start|>|u|s|e|r|\n|<tool>");
    EXPECT(g, "a<|im_en", "a|<|||i|m|_|e|n");   /* "a <" would merge were it not split */
    /* CJK and emoji */
    EXPECT(g, "\xe6\x97\xa5\xe6\x9c\xac", "\xe6\x97\xa5\xe6\x9c\xac");
    EXPECT(g, "e\xe6\x97\xa5", "e\xe6|\x97|\xa5");  /* one letter run: the "e"+0xE6 trap merges */
    EXPECT(g, "\xf0\x9f\x98\x80\xf0\x9f\x98\x80", "\xf0\x9f\x98\x80|\xf0\x9f\x98\x80");
    EXPECT(g, "abc\xf0\x9f\x98\x80", "abc|\xf0\x9f\x98\x80");
    /* invalid UTF-8: each stray byte is an "other" char of its own, bytes preserved */
    EXPECT(g, "a\xff" "b", "a|\xff|b");
    EXPECT(g, " \xff", " \xff");
    EXPECT(g, "\xe6\x97" "a", "\xe6\x97|a");       /* truncated sequence: two "other" bytes */
    EXPECT(g, "e\xe6\x97\xe6", "e|\xe6\x97|\xe6");
    EXPECT(g, "", "");
}

static void test_api(const tokenizer *t)
{
    CHECK(tok_n_vocab(t) == n_vocab);
    CHECK(tok_bos(t) == 1 && tok_eos(t) == 0);
    int im_end = find(t, "<|im_end|>");
    CHECK(im_end == 2 && tok_is_eog(t, im_end) && tok_is_eog(t, 0) && !tok_is_eog(t, 1));
    CHECK(!tok_is_eog(t, find(t, "a")) && !tok_is_eog(t, -1) && !tok_is_eog(t, n_vocab));
    int len;
    const char *p = tok_piece(t, im_end, &len);
    CHECK(len == 10 && memcmp(p, "<|im_end|>", 10) == 0);
    p = tok_piece(t, find(t, "\xc4\xa0"), &len);   /* "Ġ" is the space byte */
    CHECK(len == 1 && p[0] == ' ');
    p = tok_piece(t, find(t, "\xc4\x80"), &len);   /* byte 0 */
    CHECK(len == 1 && p[0] == 0);
    /* the count goes up to max_ids + 1 to tell "too long" */
    int ids[4] = { -7, -7, -7, -7 };
    CHECK(tok_encode(t, "a b c d e f", 11, ids, 3) == 4);
    CHECK(ids[0] == find(t, "a") && ids[3] == -7);
    CHECK(tok_encode(t, "a b", 3, ids, 3) == 2);
    CHECK(tok_encode(t, "a b", 3, NULL, 0) == 1);
    /* NUL bytes are ordinary bytes */
    CHECK(tok_encode(t, "a\0b", 3, ids, 4) == 3 && ids[1] == find(t, "\xc4\x80"));
}

/* long inputs: BPE over a long run stays exact and terminates; pieces give back the bytes */
static void test_long(const tokenizer *t)
{
    size_t n = 200000;
    char *text = malloc(n + 1);
    for (size_t i = 0; i < n; i++) text[i] = " a\n1'\xe6\x97\xa5!x"[(i * 7 + i / 13) % 11];
    memset(text + 1000, ' ', 50000);           /* a long whitespace run */
    memset(text + 60000, '1', 30000);          /* a long number */
    memset(text + 100000, '!', 30000);         /* a long punctuation run */
    int *ids = malloc(sizeof(int) * (n + 1));
    int cnt = tok_encode(t, text, n, ids, (int)n + 1);
    CHECK(cnt > 0 && cnt <= (int)n);
    size_t o = 0;
    int ok = 1;
    for (int i = 0; i < cnt && ok; i++) {
        int pl;
        const char *p = tok_piece(t, ids[i], &pl);
        if (o + (size_t)pl > n || memcmp(text + o, p, (size_t)pl) != 0) ok = 0;
        o += (size_t)pl;
    }
    CHECK(ok && o == n);
    free(ids);
    free(text);
}

/* o200k: a contraction belongs to its word, any case ("it's" is one pre-token, so the "t'"
 * trap merge applies); numbers go in runs of three; the GPT-2 split differs on all three */
static void test_o200k(const tokenizer *o, const tokenizer *g)
{
    EXPECT(o, "it's", "i|t'|s");
    EXPECT(g, "it's", "it|'s");
    EXPECT(o, "1234", "123|4");
    EXPECT(o, "x\xd9\xa3\xd9\xa4", "x|\xd9\xa3\xd9\xa4");   /* Arabic-Indic digits: one run */
    EXPECT(o, "a<|im_end|>b", "a|<|im_end|>|b");
    /* a word that ends the buffer: nothing past it is read (an unterminated one-byte buffer,
     * which ASan watches) */
    char *one = malloc(1);
    int id;
    one[0] = 'a';
    CHECK(tok_encode(o, one, 1, &id, 1) == 1 && id == find(o, "a"));
    free(one);
}

/* Harmony's tokens, as llama.cpp's loader treats them: <|return|> and <|call|> end generation;
 * then <|end|> does not (it closes the analysis message too) and shows as text, like the
 * structure markers. Without both <|return|> and <|call|>, <|end|> ends generation (phi3). */
static tokenizer *harmony_vocab(const char *const *sp, int n_sp)
{
    static char bytes[256][4];
    const char *tok[256 + 16];
    int ty[256 + 16];
    for (int c = 0; c < 256; c++) {
        char raw[2] = { (char)(c ? c : 1), 0 };
        byte_level(raw, bytes[c]);
        if (c == 0) strcpy(bytes[c], "\xc4\x80");
        tok[c] = bytes[c];
        ty[c] = 1;
    }
    for (int i = 0; i < n_sp; i++) { tok[256 + i] = sp[i]; ty[256 + i] = 3; }
    return tok_build(tok, ty, 256 + n_sp, NULL, 0, -1, -1, "gpt-4o");
}

static void test_harmony(void)
{
    static const char *const full[] = { "<|startoftext|>", "<|endoftext|>", "<|return|>", "<|constrain|>",
                                        "<|channel|>", "<|start|>", "<|end|>", "<|message|>", "<|call|>" };
    tokenizer *t = harmony_vocab(full, 9);
    CHECK(t != NULL);
    if (!t) return;
    int ret = find(t, "<|return|>"), call = find(t, "<|call|>"), end = find(t, "<|end|>");
    int chan = find(t, "<|channel|>"), start = find(t, "<|start|>"), msg = find(t, "<|message|>");
    int cons = find(t, "<|constrain|>"), eot = find(t, "<|endoftext|>"), sot = find(t, "<|startoftext|>");
    CHECK(tok_is_eog(t, ret) && tok_is_eog(t, call) && tok_is_eog(t, eot));
    CHECK(!tok_is_eog(t, end) && !tok_is_eog(t, chan) && !tok_is_eog(t, start) && !tok_is_eog(t, sot));
    CHECK(tok_is_control(t, ret) && tok_is_control(t, call) && tok_is_control(t, sot));
    CHECK(!tok_is_control(t, end) && !tok_is_control(t, chan) && !tok_is_control(t, start) &&
          !tok_is_control(t, msg) && !tok_is_control(t, cons));
    /* all of them stay atomic in a prompt */
    const char *p = "<|start|>assistant<|channel|>analysis<|message|>hm<|end|><|start|>assistant"
                    "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{}<|call|>";
    int ids[128];
    int n = tok_encode(t, p, strlen(p), ids, 128);
    int seen[9] = { 0 };
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 9; k++) if (ids[i] == find(t, full[k])) seen[k]++;
    CHECK(seen[4] == 2 && seen[5] == 2 && seen[6] == 1 && seen[7] == 2 && seen[8] == 1 && seen[3] == 1);
    int len;
    const char *piece = tok_piece(t, end, &len);
    CHECK(len == 7 && memcmp(piece, "<|end|>", 7) == 0);
    tok_free(t);

    static const char *const phi[] = { "<|end|>", "<|return|>" };   /* no <|call|> */
    t = harmony_vocab(phi, 2);
    CHECK(t && tok_is_eog(t, find(t, "<|end|>")) && tok_is_control(t, find(t, "<|end|>")));
    tok_free(t);
}

/* ---- a GGUF with only tokenizer metadata, for tok_load ---- */
static void put(FILE *f, const void *p, size_t n) { fwrite(p, 1, n, f); }
static void put_u32(FILE *f, uint32_t v) { put(f, &v, 4); }
static void put_u64(FILE *f, uint64_t v) { put(f, &v, 8); }
static void put_str(FILE *f, const char *s) { put_u64(f, strlen(s)); put(f, s, strlen(s)); }

static int write_gguf(const char *path, const char *model, const char *pre)
{
    FILE *f = fopen(path, "wb");
    if (!f) return -1;
    put(f, "GGUF", 4);
    put_u32(f, 3);
    put_u64(f, 0);          /* tensors */
    put_u64(f, 7);          /* kv */
    put_str(f, "tokenizer.ggml.model"); put_u32(f, GGUF_T_STRING); put_str(f, model);
    put_str(f, "tokenizer.ggml.pre"); put_u32(f, GGUF_T_STRING); put_str(f, pre);
    put_str(f, "tokenizer.ggml.tokens"); put_u32(f, GGUF_T_ARRAY); put_u32(f, GGUF_T_STRING);
    put_u64(f, (uint64_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) put_str(f, vocab[i]);
    put_str(f, "tokenizer.ggml.merges"); put_u32(f, GGUF_T_ARRAY); put_u32(f, GGUF_T_STRING);
    put_u64(f, N_MERGES);
    for (int i = 0; i < N_MERGES; i++) put_str(f, merges[i]);
    put_str(f, "tokenizer.ggml.token_type"); put_u32(f, GGUF_T_ARRAY); put_u32(f, GGUF_T_INT32);
    put_u64(f, (uint64_t)n_vocab);
    for (int i = 0; i < n_vocab; i++) put_u32(f, (uint32_t)types[i]);
    put_str(f, "tokenizer.ggml.bos_token_id"); put_u32(f, GGUF_T_UINT32); put_u32(f, 1);
    put_str(f, "tokenizer.ggml.eos_token_id"); put_u32(f, GGUF_T_UINT32); put_u32(f, 0);
    return fclose(f);
}

static void test_load(void)
{
    char path[] = "/tmp/test_tokenizer_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) { CHECK(!"mkstemp"); return; }
    close(fd);
    char err[256];
    gguf_file g;
    CHECK(write_gguf(path, "gpt2", "smollm") == 0);
    if (gguf_open(&g, path) == 0) {
        tokenizer *t = tok_load(&g, err, sizeof err);
        CHECK(t != NULL);
        if (t) {
            EXPECT(t, "abc 123<|im_end|>", "abc| |1|2|3|<|im_end|>");
            CHECK(tok_n_vocab(t) == n_vocab && tok_bos(t) == 1 && tok_eos(t) == 0);
            tok_free(t);
        }
        gguf_close(&g);
    } else {
        fprintf(stderr, "gguf_open: %s\n", g.err);
        CHECK(!"gguf_open");
    }
    CHECK(write_gguf(path, "llama", "default") == 0);
    if (gguf_open(&g, path) == 0) {
        err[0] = 0;
        CHECK(tok_load(&g, err, sizeof err) == NULL);
        CHECK(strstr(err, "llama") != NULL && strchr(err, '\n') == NULL);
        gguf_close(&g);
    }
    unlink(path);
}

/* ---- utf8stream ---- */
static int push_str(utf8s *s, const char *in, int n, char *out)
{
    return utf8s_push(s, in, n, out, 256);
}

static void test_utf8stream(void)
{
    utf8s s;
    char out[256];
    const char *emoji = "\xf0\x9f\x98\x80";
    utf8s_init(&s);
    CHECK(push_str(&s, "ab", 2, out) == 2 && memcmp(out, "ab", 2) == 0);
    CHECK(push_str(&s, emoji, 2, out) == 0);                  /* held */
    CHECK(push_str(&s, emoji + 2, 1, out) == 0);              /* still held */
    int n = push_str(&s, "\x80z", 2, out);
    CHECK(n == 5 && memcmp(out, "\xf0\x9f\x98\x80z", 5) == 0);
    CHECK(utf8s_flush(&s, out, 256) == 0);
    /* invalid bytes become U+FFFD, one per maximal ill-formed subpart */
    n = push_str(&s, "a\xff" "b", 3, out);
    CHECK(n == 5 && memcmp(out, "a\xef\xbf\xbd" "b", 5) == 0);
    n = push_str(&s, "\xe6\x97z", 3, out);                   /* truncated then ASCII */
    CHECK(n == 4 && memcmp(out, "\xef\xbf\xbdz", 4) == 0);
    n = push_str(&s, "\xed\xa0\x80", 3, out);                 /* surrogate: 3 replacements */
    CHECK(n == 9);
    n = push_str(&s, "\xc0\xaf", 2, out);                     /* overlong */
    CHECK(n == 6);
    /* a split sequence broken by the next push */
    CHECK(push_str(&s, "\xe6", 1, out) == 0);
    n = push_str(&s, "\x97" "x", 2, out);
    CHECK(n == 4 && memcmp(out, "\xef\xbf\xbdx", 4) == 0);
    /* end of turn with a held tail */
    CHECK(push_str(&s, "ok\xe6\x97", 4, out) == 2);
    CHECK(utf8s_flush(&s, out, 256) == 3 && memcmp(out, "\xef\xbf\xbd", 3) == 0);
    CHECK(utf8s_flush(&s, out, 256) == 0);
    /* CJK byte by byte */
    const char *cjk = "\xe6\x97\xa5\xe6\x9c\xac";
    int total = 0;
    for (int i = 0; i < 6; i++) total += push_str(&s, cjk + i, 1, out + total);
    CHECK(total == 6 && memcmp(out, cjk, 6) == 0);
    CHECK(utf8s_push(&s, "abc", 3, out, 5) == -1);           /* cap too small */
}

int main(void)
{
    make_tables();
    const char **v = (const char **)vocab, **m = (const char **)merges;
    tokenizer *g = tok_build(v, types, n_vocab, m, N_MERGES, 1, 0, "gpt2");
    tokenizer *s = tok_build(v, types, n_vocab, m, N_MERGES, 1, 0, "smollm");
    tokenizer *o = tok_build(v, types, n_vocab, m, N_MERGES, 1, 0, "gpt-4o");
    CHECK(g && s && o);
    if (g && s && o) {
        test_unicode();
        test_gpt2(g, s);
        test_o200k(o, g);
        test_long(o);
        test_api(g);
        test_long(g);
        test_long(s);
    }
    tok_free(g);
    tok_free(s);
    tok_free(o);
    test_harmony();
    test_load();
    test_utf8stream();
    for (int i = 0; i < n_vocab; i++) free(vocab[i]);
    for (int i = 0; i < N_MERGES; i++) free(merges[i]);
    if (failures) { fprintf(stderr, "test_tokenizer: %d failure(s)\n", failures); return 1; }
    printf("test_tokenizer: all passed\n");
    return 0;
}
