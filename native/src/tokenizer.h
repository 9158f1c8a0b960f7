/* tokenizer.h — byte-level BPE (tokenizer.ggml.model = gpt2) read from a GGUF.
 * Owns: vocab/merges tables, the llama-family pre-tokenizer split (GPT-2 pattern,
 * digits one by one for pre = smollm and similar), atomic special tokens, and the
 * token id -> raw bytes mapping used for output. */
#ifndef COLI_TOKENIZER_H
#define COLI_TOKENIZER_H
#include <stddef.h>
#include "gguf.h"

typedef struct tokenizer tokenizer;

/* NULL on failure with a one-line reason in err (e.g. "tokenizer.ggml.model 'llama' not supported"). */
tokenizer *tok_load(const gguf_file *g, char *err, size_t errlen);
void tok_free(tokenizer *t);
/* Build from plain tables (tests, tools): n NUL-terminated vocab strings in byte-level form
 * (control / user-defined entries as literal text), their types (NULL: all normal; 1 normal,
 * 3 control, 4 user-defined, 6 byte), n_merges "a b" strings in rank order, bos/eos ids
 * (-1: none) and the pre-tokenizer name ("smollm" etc. split digits; NULL/"gpt2": GPT-2 only).
 * NULL on failure. */
tokenizer *tok_build(const char **tokens, const int *types, int n, const char **merges, int n_merges,
                     int bos, int eos, const char *pre);

int tok_n_vocab(const tokenizer *t);
int tok_bos(const tokenizer *t);            /* -1 if none */
int tok_eos(const tokenizer *t);            /* -1 if none */
int tok_is_eog(const tokenizer *t, int id); /* end of generation: eos, eot, <|im_end|>-like ids */
int tok_is_control(const tokenizer *t, int id); /* control token (type 3): no text in replies */
/* GGUF token type after the loader's rules (1 normal, 3 control, 4 user-defined, 6 byte...);
 * 0 for an id out of range */
int tok_type(const tokenizer *t, int id);

/* Encode len bytes of text (any bytes; invalid UTF-8 is encoded byte-wise as HF does).
 * Writes at most max_ids ids to ids and returns the total number of tokens the text
 * would produce up to max_ids+1 (so the caller can detect "too long"); -1 on OOM.
 * Special tokens (control / user-defined entries) found in the text are atomic. */
int tok_encode(const tokenizer *t, const char *text, size_t len, int *ids, int max_ids);

/* Raw output bytes of a token (byte-level unicode mapping undone). Control tokens
 * return their literal text. *len is set; pointer valid for the tokenizer's life. */
const char *tok_piece(const tokenizer *t, int id, int *len);
/* The literal vocab string of a token (for MODEL json: bos/eos text). */
const char *tok_text(const tokenizer *t, int id);
#endif
