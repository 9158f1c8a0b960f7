/* grammar.h — constrained decoding: SUBMIT's grammar bytes (gbytes with grammar=1) as a
 * byte-level DFA that the sampled output must stay inside.
 * Owns: parsing and validating the wire DFA (format below), the vocabulary's byte trie,
 * the allowed-token mask of a DFA state (memoised per state: steady state is a lookup), the
 * budget rule (only tokens after which an accepting state is still reachable within the
 * tokens left), and advancing a request's state by a sampled token. Sampling itself stays in
 * sampler.c, which takes the mask.
 *
 * Wire format "CGD1" (little-endian): "CGD1", u32 n_states (1..GRAM_MAX_STATES), u32 start,
 * then per state: u8 flags (bit 0: accepting; other bits 0), u16 n_ranges (0..256), then
 * n_ranges x (u8 lo, u8 hi, u32 target) sorted ascending and disjoint (lo <= hi, each lo
 * above the previous hi), target < n_states. Nothing may follow. The start state must reach
 * an accepting state (else the language is empty: refused).
 *
 * Invariants: a token is allowed in state q iff its bytes lead, byte by byte, from q to a
 * state from which an accepting state is reachable ("live"), and - once q's own distance (in
 * bytes) to acceptance is within the tokens left, this one included - that state's distance is
 * at most max(tokens left after it, the smallest such distance among q's live tokens); before
 * that (a byte bound that real, multi-byte tokens beat) every live token is allowed.
 * End-of-generation tokens are allowed only in accepting states; control tokens never. So a mask is empty only where no token is live, and since a
 * byte-level vocabulary has a token for every byte, a request whose budget covers the start
 * state's distance always ends in an accepting state (a smaller budget: as close as it gets). */
#ifndef COLI_GRAMMAR_H
#define COLI_GRAMMAR_H
#include <stddef.h>
#include <stdint.h>

#include "tokenizer.h"

#define GRAM_MAX_STATES (1 << 18)

typedef struct gram_vocab gram_vocab;   /* the trie of token pieces: one per engine */
typedef struct gram gram;               /* one request's DFA, masks and current state */

/* From a tokenizer's first `vocab` ids (pieces of non-control, non-end tokens go in the
 * trie; end-of-generation ids are allowed in accepting states). NULL on OOM. */
gram_vocab *gram_vocab_build(const tokenizer *t, int vocab);
/* From plain tables (tests): n pieces with lengths; eog[i] != 0 marks an end token, skip[i]
 * != 0 a token never allowed. NULL on OOM. */
gram_vocab *gram_vocab_from(const char *const *pieces, const int *lens, const unsigned char *eog,
                            const unsigned char *skip, int n);
void gram_vocab_free(gram_vocab *v);

/* NULL on malformed bytes (reason in err) or OOM ("out of memory"). */
gram *gram_parse(const uint8_t *bytes, size_t n, const gram_vocab *v, char *err, size_t errlen);
void gram_free(gram *g);

/* The allowed tokens of the current state when `left` tokens (this one included) may still
 * be generated; valid until the next gram_mask / gram_advance / gram_free. NULL on OOM. */
const uint64_t *gram_mask(gram *g, int left);
/* Moves the current state along token tok's bytes. -1 (state unchanged) if that leaves the
 * DFA, or if tok is an end token or not in the trie. */
int gram_advance(gram *g, int tok);
int gram_accepting(const gram *g);  /* the current state accepts */
int gram_final(const gram *g);      /* accepting with no way on: the output is complete */
#endif
