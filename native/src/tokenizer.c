/* tokenizer.c — byte-level BPE (GPT-2 style) from GGUF metadata.
 * Owns: the vocabulary and merge tables, the pre-tokenizer scanners (GPT-2, llama3 family,
 * o200k), special-token matching, and the end-of-generation / control rules.
 *
 * Pipeline of tok_encode, matching HF tokenizers' encode(add_special_tokens=False) for a
 * BPE model + ByteLevel pre-tokenizer (+ Digits(individual_digits=True) for smollm-like pre):
 *   1. special tokens (vocab type control or user-defined) are cut out of the text,
 *      leftmost-longest, and emitted as their id;
 *   2. for digit-splitting pre-tokenizers every \p{N} code point becomes its own piece;
 *   3. each piece is split by a hand-written scanner equivalent to the GPT-2 pattern
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (or the llama3-family or o200k pattern, see l3_split and o200k_split);
 *   4. every pre-token is mapped to byte symbols (bytes_to_unicode is implicit: a byte's
 *      symbol is the id of its mapped one-char token) and merged by BPE, lowest merge rank
 *      first, leftmost first among equal ranks (a min-heap keyed by rank, position).
 * Invalid UTF-8: every byte that does not start a well-formed sequence (strict UTF-8: no
 * overlongs, surrogates or > U+10FFFF) is a one-byte character of class "other" (as a
 * punctuation mark would be); its byte is kept and encoded by its byte token, so
 * concatenating tok_piece of the ids gives back the input bytes exactly — except for bytes
 * whose one-byte token is missing from the vocabulary (SmolLM2 lacks 21 of them, e.g. 0xFF,
 * 0xC0, 0x04): those are dropped, as HF's BPE without an unk token drops them.
 * tok_encode keeps no shared mutable state: it can run on several threads at once. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "unicode.h"

enum { TT_NORMAL = 1, TT_UNKNOWN = 2, TT_CONTROL = 3, TT_USER = 4, TT_UNUSED = 5, TT_BYTE = 6 };
enum { C_OTHER = 0, C_LETTER = 1, C_NUMBER = 2, C_SPACE = 3 };

typedef struct { const char *p; size_t n; } tstr;

struct tokenizer {
    int n;
    char **text;          /* vocab strings, NUL-terminated (arena) */
    int *text_len;
    char **piece;         /* raw output bytes (arena) */
    int *piece_len;
    int *type;
    unsigned char *eog;
    char *arena;
    int bos, eos, eot;
    int digits;           /* isolate every \p{N} before the GPT-2 split */
    int l3digits;         /* > 0: the llama3-family pattern instead, numbers in runs of at most
                           * this many (3: llama-bpe, glm4; 1: qwen2) */
    int o200k;            /* the case-aware o200k pattern instead (gpt-4o: gpt-oss, llama4) */
    int32_t *vh;          /* string -> id, open addressing, -1 empty */
    uint32_t vmask;
    uint64_t *mkey;       /* (left id << 32 | right id) -> rank, merged id */
    int32_t *mrank, *mnew;
    uint32_t mmask;
    int byte_id[256];
    int *special;         /* special ids sorted by first byte, longest first */
    int sp_start[257];
};

/* ---------- Unicode helpers ---------- */

static int in_ranges(const uint32_t (*r)[2], int n, uint32_t cp)
{
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (cp < r[mid][0]) hi = mid - 1;
        else if (cp > r[mid][1]) lo = mid + 1;
        else return 1;
    }
    return 0;
}
int uni_is_letter(uint32_t cp) { return in_ranges(uni_letter_ranges, uni_letter_ranges_n, cp); }
int uni_is_number(uint32_t cp) { return in_ranges(uni_number_ranges, uni_number_ranges_n, cp); }
int uni_is_space(uint32_t cp) { return in_ranges(uni_space_ranges, uni_space_ranges_n, cp); }
int uni_is_upper(uint32_t cp) { return in_ranges(uni_upper_ranges, uni_upper_ranges_n, cp); }
int uni_is_lower(uint32_t cp) { return in_ranges(uni_lower_ranges, uni_lower_ranges_n, cp); }
int uni_is_mark(uint32_t cp) { return in_ranges(uni_mark_ranges, uni_mark_ranges_n, cp); }

static inline int ascii_class(unsigned c)
{
    if ((c | 0x20) >= 'a' && (c | 0x20) <= 'z') return C_LETTER;
    if (c >= '0' && c <= '9') return C_NUMBER;
    if (c == ' ' || (c >= 9 && c <= 13)) return C_SPACE;
    return C_OTHER;
}

/* Length of the well-formed UTF-8 sequence at s[i..end) and its code point; an invalid
 * or truncated sequence is reported as length 1 with cp = 0xFFFFFFFF. */
static int utf8_next(const unsigned char *s, size_t i, size_t end, uint32_t *cp)
{
    unsigned b = s[i];
    if (b < 0x80) { *cp = b; return 1; }
    int len;
    unsigned lo = 0x80, hi = 0xBF;
    uint32_t c;
    if (b >= 0xC2 && b <= 0xDF) { len = 2; c = b & 0x1F; }
    else if (b >= 0xE0 && b <= 0xEF) {
        len = 3; c = b & 0x0F;
        if (b == 0xE0) lo = 0xA0;
        else if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
        len = 4; c = b & 0x07;
        if (b == 0xF0) lo = 0x90;
        else if (b == 0xF4) hi = 0x8F;
    } else goto bad;
    if (i + (size_t)len > end) goto bad;
    for (int k = 1; k < len; k++) {
        unsigned x = s[i + k];
        if (x < lo || x > hi) goto bad;
        lo = 0x80; hi = 0xBF;
        c = (c << 6) | (x & 0x3F);
    }
    *cp = c;
    return len;
bad:
    *cp = 0xFFFFFFFFu;
    return 1;
}

static int char_class(const unsigned char *s, size_t i, size_t end, int *len)
{
    if (s[i] < 0x80) { *len = 1; return ascii_class(s[i]); }
    uint32_t cp;
    *len = utf8_next(s, i, end, &cp);
    if (cp == 0xFFFFFFFFu) return C_OTHER;
    if (uni_is_letter(cp)) return C_LETTER;
    if (uni_is_number(cp)) return C_NUMBER;
    if (uni_is_space(cp)) return C_SPACE;
    return C_OTHER;
}

/* GPT-2 bytes_to_unicode: printable bytes map to themselves, the others to 256+k. */
static void bytes_to_unicode(uint32_t cp_of[256])
{
    int k = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp_of[b] = printable ? (uint32_t)b : (uint32_t)(256 + k++);
    }
}

static int utf8_put(uint32_t cp, char *o)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | (cp >> 6)); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    o[0] = (char)(0xE0 | (cp >> 12)); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
    o[2] = (char)(0x80 | (cp & 0x3F));
    return 3;   /* only used for code points < 0x10000 */
}

/* ---------- hash tables ---------- */

static uint32_t hash_bytes(const char *p, size_t n)
{
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) { h ^= (unsigned char)p[i]; h *= 16777619u; }
    return h;
}

static uint32_t hash_pair(uint64_t k)
{
    k *= 0x9E3779B97F4A7C15ull;
    return (uint32_t)(k >> 32);
}

static uint32_t pow2_at_least(uint64_t n)
{
    uint32_t c = 16;
    while (c < n * 2) c <<= 1;
    return c;
}

static int vocab_find(const tokenizer *t, const char *p, size_t n)
{
    uint32_t i = hash_bytes(p, n) & t->vmask;
    for (;;) {
        int32_t id = t->vh[i];
        if (id < 0) return -1;
        if ((size_t)t->text_len[id] == n && memcmp(t->text[id], p, n) == 0) return id;
        i = (i + 1) & t->vmask;
    }
}

static void vocab_insert(tokenizer *t, int id)
{
    uint32_t i = hash_bytes(t->text[id], (size_t)t->text_len[id]) & t->vmask;
    for (;;) {
        int32_t o = t->vh[i];
        if (o < 0) break;
        if (t->text_len[o] == t->text_len[id] && memcmp(t->text[o], t->text[id], (size_t)t->text_len[id]) == 0)
            break;   /* duplicate string: the later id wins, as in a Python dict / HF vocab */
        i = (i + 1) & t->vmask;
    }
    t->vh[i] = id;
}

/* rank of the merge (a, b) or -1; *out gets the merged id. */
static inline int merge_find(const tokenizer *t, int a, int b, int *out)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = hash_pair(k) & t->mmask;
    for (;;) {
        if (t->mrank[i] < 0) return -1;
        if (t->mkey[i] == k) { *out = t->mnew[i]; return t->mrank[i]; }
        i = (i + 1) & t->mmask;
    }
}

static void merge_insert(tokenizer *t, int a, int b, int rank, int nid)
{
    uint64_t k = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    uint32_t i = hash_pair(k) & t->mmask;
    while (t->mrank[i] >= 0 && t->mkey[i] != k) i = (i + 1) & t->mmask;
    t->mkey[i] = k;     /* a repeated pair keeps the later rank, as HF's merge map does */
    t->mrank[i] = rank;
    t->mnew[i] = nid;
}

/* ---------- construction ---------- */

static int is_special_type(int ty) { return ty == TT_CONTROL || ty == TT_USER; }

/* End-of-generation tokens by their text, as llama.cpp's vocabulary loader picks them
 * (<|end|>, <|return|>, <|call|>: phi3 and gpt-oss's harmony format). */
static const char *const eog_texts[] = { "<|im_end|>", "<|endoftext|>", "<|eot_id|>", "</s>",
                                         "<|end|>", "<|return|>", "<|call|>" };
/* Harmony's structure markers: llama.cpp makes them user-defined whatever the file says, so
 * that a reply shows them (the bridge parses channels out of them). */
static const char *const harmony_markup[] = { "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>" };

static const char *const digit_pres[] = { "smollm", "starcoder", "refact" };
/* llama3-family pattern pre-tokenizers and their longest number run */
static const struct { const char *name; int digits; } l3_pres[] = {
    { "llama-bpe", 3 }, { "llama3", 3 }, { "glm4", 3 }, { "qwen2", 1 }, { "deepseek-r1-qwen", 1 },
};
/* o200k pattern pre-tokenizers (llama.cpp's LLAMA_VOCAB_PRE_TYPE_GPT4O names) */
static const char *const o200k_pres[] = { "gpt-4o", "llama4", "kanana2", "talkie" };

static int find_special(const tokenizer *t, const char *text)
{
    int id = vocab_find(t, text, strlen(text));
    return id >= 0 && is_special_type(t->type[id]) ? id : -1;
}

/* llama.cpp's rule for harmony vocabularies: when <|return|> and <|call|> both end generation,
 * <|end|> does not (it closes every message, the analysis one too, and the model goes on with
 * the next); it becomes user-defined, so its text shows in replies. The structure markers are
 * user-defined too. User-defined tokens stay atomic in prompts. */
static void harmony_rules(tokenizer *t)
{
    int ret = find_special(t, "<|return|>"), call = find_special(t, "<|call|>");
    int end = find_special(t, "<|end|>");
    if (ret >= 0 && call >= 0 && end >= 0 && t->eog[ret] && t->eog[call] && t->eog[end]) {
        t->eog[end] = 0;
        t->type[end] = TT_USER;
    }
    for (size_t k = 0; k < sizeof harmony_markup / sizeof *harmony_markup; k++) {
        int id = find_special(t, harmony_markup[k]);
        if (id >= 0) t->type[id] = TT_USER;
    }
}

static int hexval(int c)
{
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

typedef struct { unsigned char first; int len, id; } spkey;
static int cmp_special(const void *pa, const void *pb)
{
    const spkey *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->id - b->id;
}

static tokenizer *build(const tstr *tokens, const int *types, int n, const tstr *merges, int n_merges,
                        int bos, int eos, int eot, const char *pre, char *err, size_t errlen)
{
    if (n <= 0) { snprintf(err, errlen, "tokenizer: empty vocabulary"); return NULL; }
    tokenizer *t = calloc(1, sizeof *t);
    if (!t) goto oom;
    t->n = n;
    t->bos = (bos >= 0 && bos < n) ? bos : -1;
    t->eos = (eos >= 0 && eos < n) ? eos : -1;
    t->eot = (eot >= 0 && eot < n) ? eot : -1;

    size_t total = 0;
    for (int i = 0; i < n; i++) {
        if (tokens[i].n > 0x7fffffff) { snprintf(err, errlen, "tokenizer: token %d too long", i); tok_free(t); return NULL; }
        total += 2 * (tokens[i].n + 1);   /* text copy + piece (never longer than text) */
    }
    t->text = malloc(sizeof(char *) * (size_t)n);
    t->piece = malloc(sizeof(char *) * (size_t)n);
    t->text_len = malloc(sizeof(int) * (size_t)n);
    t->piece_len = malloc(sizeof(int) * (size_t)n);
    t->type = malloc(sizeof(int) * (size_t)n);
    t->eog = calloc((size_t)n, 1);
    t->arena = malloc(total ? total : 1);
    t->vmask = pow2_at_least((uint64_t)n) - 1;
    t->vh = malloc(sizeof(int32_t) * ((size_t)t->vmask + 1));
    if (!t->text || !t->piece || !t->text_len || !t->piece_len || !t->type || !t->eog || !t->arena || !t->vh)
        goto oom;
    memset(t->vh, 0xff, sizeof(int32_t) * ((size_t)t->vmask + 1));

    uint32_t cp_of[256];
    int byte_of[324];
    bytes_to_unicode(cp_of);
    for (int i = 0; i < 324; i++) byte_of[i] = -1;
    for (int b = 0; b < 256; b++) byte_of[cp_of[b]] = b;

    char *a = t->arena;
    int n_special = 0;
    for (int i = 0; i < n; i++) {
        int ty = types ? types[i] : TT_NORMAL;
        t->type[i] = ty;
        t->text[i] = a;
        t->text_len[i] = (int)tokens[i].n;
        memcpy(a, tokens[i].p, tokens[i].n);
        a[tokens[i].n] = 0;
        a += tokens[i].n + 1;
        t->piece[i] = a;
        const unsigned char *s = (const unsigned char *)t->text[i];
        size_t len = tokens[i].n, o = 0;
        if (is_special_type(ty)) {
            memcpy(a, s, len);
            o = len;
            if (len > 0) n_special++;
        } else if (ty == TT_BYTE && len == 6 && s[0] == '<' && s[1] == '0' && s[2] == 'x' && s[5] == '>' &&
                   hexval(s[3]) >= 0 && hexval(s[4]) >= 0) {
            a[o++] = (char)(hexval(s[3]) * 16 + hexval(s[4]));
        } else {
            for (size_t j = 0; j < len;) {
                uint32_t cp;
                int l = utf8_next(s, j, len, &cp);
                if (cp < 324 && byte_of[cp] >= 0) a[o++] = (char)byte_of[cp];
                else { memcpy(a + o, s + j, (size_t)l); o += (size_t)l; }   /* not byte-level: as is */
                j += (size_t)l;
            }
        }
        a[o] = 0;
        t->piece_len[i] = (int)o;
        a += o + 1;
        vocab_insert(t, i);
        if (ty == TT_CONTROL)
            for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++)
                if (strcmp(t->text[i], eog_texts[k]) == 0) t->eog[i] = 1;
    }
    if (t->eos >= 0) t->eog[t->eos] = 1;
    if (t->eot >= 0) t->eog[t->eot] = 1;
    harmony_rules(t);

    for (int b = 0; b < 256; b++) {
        char buf[4];
        int l = utf8_put(cp_of[b], buf);
        t->byte_id[b] = vocab_find(t, buf, (size_t)l);
    }

    /* special tokens, grouped by first byte, longest first */
    t->special = malloc(sizeof(int) * (size_t)(n_special ? n_special : 1));
    spkey *sk = malloc(sizeof(spkey) * (size_t)(n_special ? n_special : 1));
    if (!t->special || !sk) { free(sk); goto oom; }
    n_special = 0;
    for (int i = 0; i < n; i++)
        if (is_special_type(t->type[i]) && t->text_len[i] > 0)
            sk[n_special++] = (spkey){ (unsigned char)t->text[i][0], t->text_len[i], i };
    qsort(sk, (size_t)n_special, sizeof(spkey), cmp_special);
    for (int k = 0; k < n_special; k++) t->special[k] = sk[k].id;
    for (int b = 0, k = 0; b <= 256; b++) {
        while (k < n_special && sk[k].first < b) k++;
        t->sp_start[b] = k;
    }
    free(sk);

    /* merges */
    t->mmask = pow2_at_least((uint64_t)(n_merges > 0 ? n_merges : 1)) - 1;
    size_t mcap = (size_t)t->mmask + 1;
    t->mkey = malloc(sizeof(uint64_t) * mcap);
    t->mrank = malloc(sizeof(int32_t) * mcap);
    t->mnew = malloc(sizeof(int32_t) * mcap);
    if (!t->mkey || !t->mrank || !t->mnew) goto oom;
    memset(t->mrank, 0xff, sizeof(int32_t) * mcap);
    size_t maxlen = 0;
    for (int i = 0; i < n_merges; i++) if (merges[i].n > maxlen) maxlen = merges[i].n;
    char *buf = malloc(maxlen + 1);
    if (!buf) goto oom;
    for (int i = 0; i < n_merges; i++) {
        const char *m = merges[i].p;
        size_t ml = merges[i].n;
        const char *sp = memchr(m, ' ', ml);
        if (!sp || sp == m || sp == m + ml - 1) continue;
        size_t la = (size_t)(sp - m), lb = ml - la - 1;
        int ia = vocab_find(t, m, la), ib = vocab_find(t, sp + 1, lb);
        memcpy(buf, m, la);
        memcpy(buf + la, sp + 1, lb);
        int iab = vocab_find(t, buf, la + lb);
        if (ia < 0 || ib < 0 || iab < 0) continue;   /* HF would refuse such a merge; we skip it */
        merge_insert(t, ia, ib, i, iab);
    }
    free(buf);

    t->digits = 0;
    if (pre && *pre && strcmp(pre, "gpt2") != 0 && strcmp(pre, "default") != 0) {
        int known = 0;
        for (size_t k = 0; k < sizeof digit_pres / sizeof *digit_pres; k++)
            if (strcmp(pre, digit_pres[k]) == 0) known = t->digits = 1;
        for (size_t k = 0; k < sizeof l3_pres / sizeof *l3_pres; k++)
            if (strcmp(pre, l3_pres[k].name) == 0) known = 1, t->l3digits = l3_pres[k].digits;
        for (size_t k = 0; k < sizeof o200k_pres / sizeof *o200k_pres; k++)
            if (strcmp(pre, o200k_pres[k]) == 0) known = t->o200k = 1;
        static int warned;
        if (!known && !warned) {
            warned = 1;
            fprintf(stderr, "tokenizer: warning: pre-tokenizer '%s' not known, using the GPT-2 pattern\n", pre);
        }
    }
    return t;
oom:
    snprintf(err, errlen, "tokenizer: out of memory");
    tok_free(t);
    return NULL;
}

tokenizer *tok_build(const char **tokens, const int *types, int n, const char **merges, int n_merges,
                     int bos, int eos, const char *pre)
{
    char err[128];
    tstr *tk = malloc(sizeof(tstr) * (size_t)(n > 0 ? n : 1));
    tstr *mg = malloc(sizeof(tstr) * (size_t)(n_merges > 0 ? n_merges : 1));
    tokenizer *t = NULL;
    if (tk && mg) {
        for (int i = 0; i < n; i++) { tk[i].p = tokens[i]; tk[i].n = strlen(tokens[i]); }
        for (int i = 0; i < n_merges; i++) { mg[i].p = merges[i]; mg[i].n = strlen(merges[i]); }
        t = build(tk, types, n, mg, n_merges, bos, eos, -1, pre, err, sizeof err);
    }
    free(tk);
    free(mg);
    return t;
}

tokenizer *tok_load(const gguf_file *g, char *err, size_t errlen)
{
    tokenizer *t = NULL;
    tstr *tk = NULL, *mg = NULL;
    int *types = NULL;
    char *pre = NULL;
    char *model = gguf_get_string(g, "tokenizer.ggml.model");
    if (!model) { snprintf(err, errlen, "tokenizer.ggml.model missing"); goto done; }
    if (strcmp(model, "gpt2") != 0) {
        snprintf(err, errlen, "tokenizer.ggml.model '%.64s' not supported (only gpt2 byte-level BPE)", model);
        goto done;
    }
    const gguf_kv *kt = gguf_find_kv(g, "tokenizer.ggml.tokens");
    const gguf_kv *km = gguf_find_kv(g, "tokenizer.ggml.merges");
    const gguf_kv *ky = gguf_find_kv(g, "tokenizer.ggml.token_type");
    if (!kt || kt->type != GGUF_T_ARRAY || kt->arr_type != GGUF_T_STRING || kt->arr_len == 0 ||
        kt->arr_len > 0x7fffffff) {
        snprintf(err, errlen, "tokenizer.ggml.tokens missing or not a string array");
        goto done;
    }
    if (!km || km->type != GGUF_T_ARRAY || km->arr_type != GGUF_T_STRING || km->arr_len > 0x7fffffff) {
        snprintf(err, errlen, "tokenizer.ggml.merges missing or not a string array");
        goto done;
    }
    if (ky && (ky->type != GGUF_T_ARRAY || ky->arr_type == GGUF_T_STRING || ky->arr_type == GGUF_T_ARRAY)) {
        snprintf(err, errlen, "tokenizer.ggml.token_type is not a numeric array");
        goto done;
    }
    int n = (int)kt->arr_len, nm = (int)km->arr_len;
    tk = malloc(sizeof(tstr) * (size_t)n);
    mg = malloc(sizeof(tstr) * (size_t)(nm ? nm : 1));
    types = malloc(sizeof(int) * (size_t)n);
    if (!tk || !mg || !types) { snprintf(err, errlen, "tokenizer: out of memory"); goto done; }
    for (int i = 0; i < n; i++) {
        gguf_str s;
        if (gguf_array_string(kt, (uint64_t)i, &s) != 0) {
            snprintf(err, errlen, "tokenizer.ggml.tokens[%d] unreadable", i);
            goto done;
        }
        tk[i].p = s.ptr;
        tk[i].n = (size_t)s.len;
        types[i] = (ky && (uint64_t)i < ky->arr_len) ? (int)gguf_array_int(ky, (uint64_t)i) : TT_NORMAL;
    }
    for (int i = 0; i < nm; i++) {
        gguf_str s;
        if (gguf_array_string(km, (uint64_t)i, &s) != 0) {
            snprintf(err, errlen, "tokenizer.ggml.merges[%d] unreadable", i);
            goto done;
        }
        mg[i].p = s.ptr;
        mg[i].n = (size_t)s.len;
    }
    int bos = (int)gguf_get_int(g, "tokenizer.ggml.bos_token_id", -1);
    int eos = (int)gguf_get_int(g, "tokenizer.ggml.eos_token_id", -1);
    int eot = (int)gguf_get_int(g, "tokenizer.ggml.eot_token_id", -1);
    pre = gguf_get_string(g, "tokenizer.ggml.pre");
    t = build(tk, types, n, mg, nm, bos, eos, eot, pre, err, errlen);
done:
    free(model);
    free(pre);
    free(tk);
    free(mg);
    free(types);
    return t;
}

void tok_free(tokenizer *t)
{
    if (!t) return;
    free(t->text); free(t->piece); free(t->text_len); free(t->piece_len); free(t->type);
    free(t->eog); free(t->arena); free(t->vh); free(t->mkey); free(t->mrank); free(t->mnew);
    free(t->special);
    free(t);
}

int tok_n_vocab(const tokenizer *t) { return t->n; }
int tok_bos(const tokenizer *t) { return t->bos; }
int tok_eos(const tokenizer *t) { return t->eos; }
int tok_is_eog(const tokenizer *t, int id) { return id >= 0 && id < t->n && t->eog[id]; }
int tok_is_control(const tokenizer *t, int id) { return id >= 0 && id < t->n && t->type[id] == TT_CONTROL; }
int tok_type(const tokenizer *t, int id) { return id >= 0 && id < t->n ? t->type[id] : 0; }

const char *tok_piece(const tokenizer *t, int id, int *len)
{
    if (id < 0 || id >= t->n) { *len = 0; return ""; }
    *len = t->piece_len[id];
    return t->piece[id];
}

const char *tok_text(const tokenizer *t, int id)
{
    return (id < 0 || id >= t->n) ? "" : t->text[id];
}

/* ---------- encoding ---------- */

typedef struct {
    const tokenizer *t;
    int *ids;
    int max_ids;
    int count;
    int full;             /* count reached max_ids + 1: stop */
    int oom;
    size_t cap;           /* symbols the work arrays hold */
    int *sid, *snext, *sprev;
    uint64_t *heap;
} enc;

static void emit(enc *e, int id)
{
    if (e->count < e->max_ids && e->ids) e->ids[e->count] = id;
    if (++e->count > e->max_ids) e->full = 1;
}

static int reserve(enc *e, size_t n)
{
    if (n <= e->cap) return 0;
    size_t c = e->cap ? e->cap : 256;
    while (c < n) c *= 2;
    int *a = realloc(e->sid, c * sizeof(int)); if (a) e->sid = a;
    int *b = realloc(e->snext, c * sizeof(int)); if (b) e->snext = b;
    int *d = realloc(e->sprev, c * sizeof(int)); if (d) e->sprev = d;
    uint64_t *h = realloc(e->heap, 3 * c * sizeof(uint64_t)); if (h) e->heap = h;
    if (!a || !b || !d || !h) { e->oom = 1; return -1; }
    e->cap = c;
    return 0;
}

static void heap_push(uint64_t *h, int *n, uint64_t v)
{
    int i = (*n)++;
    while (i > 0) {
        int p = (i - 1) / 2;
        if (h[p] <= v) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = v;
}

static uint64_t heap_pop(uint64_t *h, int *n)
{
    uint64_t top = h[0], v = h[--(*n)];
    int i = 0, m = *n;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= m) break;
        if (c + 1 < m && h[c + 1] < h[c]) c++;
        if (v <= h[c]) break;
        h[i] = h[c];
        i = c;
    }
    h[i] = v;
    return top;
}

/* BPE over one pre-token. */
static void bpe(enc *e, const unsigned char *s, size_t n)
{
    const tokenizer *t = e->t;
    if (n == 1) {
        if (t->byte_id[s[0]] >= 0) emit(e, t->byte_id[s[0]]);
        return;
    }
    if (reserve(e, n) != 0) return;
    int *id = e->sid, *nx = e->snext, *pv = e->sprev;
    uint64_t *h = e->heap;
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int b = t->byte_id[s[i]];
        if (b < 0) continue;   /* no token for this byte: dropped, as HF does without unk */
        id[m] = b; pv[m] = m - 1; nx[m] = m + 1; m++;
    }
    if (m == 0) return;
    nx[m - 1] = -1;
    int hn = 0, nid;
    for (int i = 0; i + 1 < m; i++) {
        int r = merge_find(t, id[i], id[i + 1], &nid);
        if (r >= 0) heap_push(h, &hn, ((uint64_t)r << 32) | (uint32_t)i);
    }
    while (hn > 0) {
        uint64_t top = heap_pop(h, &hn);
        int rank = (int)(top >> 32), l = (int)(uint32_t)top;
        if (id[l] < 0) continue;
        int r = nx[l];
        if (r < 0) continue;
        if (merge_find(t, id[l], id[r], &nid) != rank) continue;   /* stale entry */
        id[l] = nid;
        id[r] = -1;
        nx[l] = nx[r];
        if (nx[r] >= 0) pv[nx[r]] = l;
        int p = pv[l], q = nx[l], rr;
        if (p >= 0 && (rr = merge_find(t, id[p], id[l], &nid)) >= 0)
            heap_push(h, &hn, ((uint64_t)rr << 32) | (uint32_t)p);
        if (q >= 0 && (rr = merge_find(t, id[l], id[q], &nid)) >= 0)
            heap_push(h, &hn, ((uint64_t)rr << 32) | (uint32_t)l);
    }
    for (int i = 0; i >= 0 && !e->full; i = nx[i]) emit(e, id[i]);
}

/* Run of characters of class k starting at i; returns its end. */
static size_t run_of(const unsigned char *s, size_t i, size_t end, int k)
{
    while (i < end) {
        int l;
        if (char_class(s, i, end, &l) != k) break;
        i += (size_t)l;
    }
    return i;
}

/* The GPT-2 pattern over s[a..b), one BPE per match. */
static void gpt2_split(enc *e, const unsigned char *s, size_t a, size_t b)
{
    size_t i = a;
    while (i < b && !e->full && !e->oom) {
        size_t j = 0;
        if (s[i] == '\'' && i + 1 < b) {       /* 's 't 're 've 'm 'll 'd */
            unsigned c1 = s[i + 1], c2 = i + 2 < b ? s[i + 2] : 0;
            if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') j = i + 2;
            else if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) j = i + 3;
        }
        if (!j) {
            int l0, k0 = char_class(s, i, b, &l0);
            if (s[i] == ' ' && i + 1 < b) {   /* " ?\p{L}+", " ?\p{N}+", " ?[^\s\p{L}\p{N}]+" */
                int l1, k1 = char_class(s, i + 1, b, &l1);
                if (k1 != C_SPACE) j = run_of(s, i + 1 + (size_t)l1, b, k1);
            }
            if (!j && k0 != C_SPACE) j = run_of(s, i + (size_t)l0, b, k0);
            if (!j) {                          /* \s+(?!\S) | \s+ */
                size_t last = i, k = i;
                while (k < b) {
                    int l;
                    if (char_class(s, k, b, &l) != C_SPACE) break;
                    last = k;
                    k += (size_t)l;
                }
                j = (k == b || last == i) ? k : last;
            }
        }
        bpe(e, s + i, j - i);
        i = j;
    }
}

static int is_crlf(unsigned char c) { return c == '\r' || c == '\n'; }

/* (?i:'s|'t|'re|'ve|'m|'ll|'d) at s[i]: the length matched, 0 if none. Oniguruma folds case
 * by Unicode's rules: U+017F (long s, bytes C5 BF) folds to s, and no other non-ASCII
 * character folds onto these letters (checked against HF over every code point). */
static size_t contraction_icase(const unsigned char *s, size_t i, size_t b)
{
    if (i + 1 >= b || s[i] != '\'') return 0;   /* i may be b: a word can end the text */
    unsigned c1 = s[i + 1] | 0x20, c2 = i + 2 < b ? s[i + 2] | 0x20 : 0;
    if (s[i + 1] == 0xC5 && i + 2 < b && s[i + 2] == 0xBF) return 3;   /* 'ſ */
    if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
    if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) return 3;
    return 0;
}

/* \s*[\r\n]+ | \s+(?!\S) | \s+ at s[i] (a space): the end of the match. */
static size_t space_match(const unsigned char *s, size_t i, size_t b)
{
    size_t last = i, k = i, nl_end = 0;
    while (k < b) {
        int l;
        if (char_class(s, k, b, &l) != C_SPACE) break;
        if (is_crlf(s[k])) nl_end = k + 1;
        last = k;
        k += (size_t)l;
    }
    if (nl_end) return nl_end;
    return (k == b || last == i) ? k : last;
}

/* The llama3-family pattern over s[a..b) (qwen2: maxd 1), one BPE per match:
 *   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,maxd}| ?[^\s\p{L}\p{N}]+[\r\n]*|
 *   \s*[\r\n]+|\s+(?!\S)|\s+
 * (alternatives tried in order at each position, as the regex engines do). */
static void l3_split(enc *e, const unsigned char *s, size_t a, size_t b, int maxd)
{
    size_t i = a;
    while (i < b && !e->full && !e->oom) {
        size_t j = 0, c = contraction_icase(s, i, b);
        if (c) j = i + c;
        int l0, k0 = char_class(s, i, b, &l0);
        if (!j && k0 == C_LETTER) j = run_of(s, i + (size_t)l0, b, C_LETTER);
        if (!j && k0 != C_NUMBER && !is_crlf(s[i]) && i + (size_t)l0 < b) {   /* [^\r\n\p{L}\p{N}]\p{L}+ */
            int l1;
            if (char_class(s, i + (size_t)l0, b, &l1) == C_LETTER) j = run_of(s, i + (size_t)l0 + (size_t)l1, b, C_LETTER);
        }
        if (!j && k0 == C_NUMBER) {
            j = i + (size_t)l0;
            for (int d = 1; d < maxd && j < b; d++) {
                int l;
                if (char_class(s, j, b, &l) != C_NUMBER) break;
                j += (size_t)l;
            }
        }
        if (!j) {                                /* " ?[^\s\p{L}\p{N}]+[\r\n]*" */
            size_t k = s[i] == ' ' ? i + 1 : i;
            int l;
            if (k < b && char_class(s, k, b, &l) == C_OTHER) {
                j = run_of(s, k, b, C_OTHER);
                while (j < b && is_crlf(s[j])) j++;
            }
        }
        if (!j) j = k0 == C_SPACE ? space_match(s, i, b) : i + (size_t)l0;   /* (the latter cannot happen) */
        bpe(e, s + i, j - i);
        i = j;
    }
}

/* ---------- the o200k pattern ----------
 * tokenizer.json's Split regex for gpt-4o / gpt-oss (then ByteLevel without its own regex):
 *   [^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 *  |[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?
 *  |\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+
 * with the backtracking engine's semantics (alternatives and the optional prefix tried in
 * order, the first success wins). Call the two letter classes A (upper-ish) and B (lower-ish):
 * Lm, Lo and the marks are in both. Marks are not \p{L}, so a mark can also be the prefix. */
enum { K_UPPER, K_LOWER, K_LMLO, K_MARK, K_NUMBER, K_SPACE, K_OTHER };

static int o2_kind(const unsigned char *s, size_t i, size_t end, int *len)
{
    if (s[i] < 0x80) {
        *len = 1;
        unsigned c = s[i];
        if (c >= 'A' && c <= 'Z') return K_UPPER;
        if (c >= 'a' && c <= 'z') return K_LOWER;
        int k = ascii_class(c);
        return k == C_NUMBER ? K_NUMBER : k == C_SPACE ? K_SPACE : K_OTHER;
    }
    uint32_t cp;
    *len = utf8_next(s, i, end, &cp);
    if (cp == 0xFFFFFFFFu) return K_OTHER;
    if (uni_is_letter(cp)) return uni_is_upper(cp) ? K_UPPER : uni_is_lower(cp) ? K_LOWER : K_LMLO;
    if (uni_is_mark(cp)) return K_MARK;
    if (uni_is_number(cp)) return K_NUMBER;
    if (uni_is_space(cp)) return K_SPACE;
    return K_OTHER;
}

static int in_a(int k) { return k == K_UPPER || k == K_LMLO || k == K_MARK; }
static int in_b(int k) { return k == K_LOWER || k == K_LMLO || k == K_MARK; }

/* End of the run of A (want_a) or B characters from i; *last_b gets the end of the last
 * character in the run that is also in B (0 if none). */
static size_t o2_run(const unsigned char *s, size_t i, size_t b, int want_a, size_t *last_b)
{
    if (last_b) *last_b = 0;
    while (i < b) {
        int l, k = o2_kind(s, i, b, &l);
        if (!(want_a ? in_a(k) : in_b(k))) break;
        i += (size_t)l;
        if (last_b && in_b(k)) *last_b = i;
    }
    return i;
}

/* A*B+ from j, then the optional contraction; 0 if it fails. Greedy A* backtracks: if the
 * character after the A run is not in B, B+ is the last A-run character that is in B. */
static size_t o2_lower_word(const unsigned char *s, size_t j, size_t b)
{
    size_t last_b, e = o2_run(s, j, b, 1, &last_b), f = 0;
    int l;
    if (e < b && o2_kind(s, e, b, &l) == K_LOWER) f = o2_run(s, e, b, 0, NULL);
    else if (last_b) f = last_b;
    return f ? f + contraction_icase(s, f, b) : 0;
}

/* A+B* from j, then the optional contraction; 0 if it fails. */
static size_t o2_upper_word(const unsigned char *s, size_t j, size_t b)
{
    size_t e = o2_run(s, j, b, 1, NULL);
    if (e == j) return 0;
    size_t f = o2_run(s, e, b, 0, NULL);
    return f + contraction_icase(s, f, b);
}

/* The end of the match at s[i] (i < b). */
static size_t o2_match(const unsigned char *s, size_t i, size_t b)
{
    int l0, k0 = o2_kind(s, i, b, &l0);
    /* [^\r\n\p{L}\p{N}]? : tried with the prefix first, then without */
    int pre = (k0 == K_MARK || k0 == K_SPACE || k0 == K_OTHER) && !is_crlf(s[i]);
    size_t j = i + (size_t)l0, m;
    if (pre && j < b && (m = o2_lower_word(s, j, b))) return m;
    if ((m = o2_lower_word(s, i, b))) return m;
    if (pre && j < b && (m = o2_upper_word(s, j, b))) return m;
    if ((m = o2_upper_word(s, i, b))) return m;
    if (k0 == K_NUMBER) {                                   /* \p{N}{1,3} */
        for (int d = 1; d < 3 && j < b; d++) {
            int l;
            if (o2_kind(s, j, b, &l) != K_NUMBER) break;
            j += (size_t)l;
        }
        return j;
    }
    size_t k = s[i] == ' ' ? i + 1 : i;                     /* " ?[^\s\p{L}\p{N}]+[\r\n/]*" */
    int l, kk;
    if (k < b && ((kk = o2_kind(s, k, b, &l)) == K_OTHER || kk == K_MARK)) {
        while (k < b && ((kk = o2_kind(s, k, b, &l)) == K_OTHER || kk == K_MARK)) k += (size_t)l;
        while (k < b && (is_crlf(s[k]) || s[k] == '/')) k++;
        return k;
    }
    return k0 == K_SPACE ? space_match(s, i, b) : j;        /* (the latter cannot happen) */
}

static void o200k_split(enc *e, const unsigned char *s, size_t a, size_t b)
{
    for (size_t i = a; i < b && !e->full && !e->oom;) {
        size_t j = o2_match(s, i, b);
        bpe(e, s + i, j - i);
        i = j;
    }
}

/* One piece of text between special tokens. */
static void pretokenize(enc *e, const unsigned char *s, size_t a, size_t b)
{
    if (e->t->o200k) { o200k_split(e, s, a, b); return; }
    if (e->t->l3digits) { l3_split(e, s, a, b, e->t->l3digits); return; }
    if (!e->t->digits) { gpt2_split(e, s, a, b); return; }
    size_t start = a, i = a;
    while (i < b && !e->full && !e->oom) {
        int l;
        if (char_class(s, i, b, &l) == C_NUMBER) {
            if (start < i) gpt2_split(e, s, start, i);
            if (!e->full && !e->oom) bpe(e, s + i, (size_t)l);
            start = i + (size_t)l;
        }
        i += (size_t)l;
    }
    if (start < b && !e->full && !e->oom) gpt2_split(e, s, start, b);
}

int tok_encode(const tokenizer *t, const char *text, size_t len, int *ids, int max_ids)
{
    enc e = { .t = t, .ids = ids, .max_ids = max_ids < 0 ? 0 : max_ids };
    const unsigned char *s = (const unsigned char *)text;
    size_t start = 0, i = 0;
    while (i < len && !e.full && !e.oom) {
        int lo = t->sp_start[s[i]], hi = t->sp_start[s[i] + 1], hit = -1;
        for (int k = lo; k < hi; k++) {
            int id = t->special[k];
            size_t l = (size_t)t->text_len[id];
            if (l <= len - i && memcmp(s + i, t->text[id], l) == 0) { hit = id; break; }
        }
        if (hit < 0) { i++; continue; }
        if (start < i) pretokenize(&e, s, start, i);
        if (!e.full && !e.oom) emit(&e, hit);
        i += (size_t)t->text_len[hit];
        start = i;
    }
    if (start < len && !e.full && !e.oom) pretokenize(&e, s, start, len);
    free(e.sid); free(e.snext); free(e.sprev); free(e.heap);
    if (e.oom) return -1;
    return e.count;
}
