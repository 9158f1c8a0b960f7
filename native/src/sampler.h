/* sampler.h — next-token choice from logits: greedy, temperature, top-k, top-p, seeded RNG,
 * and top-k log-probabilities for TOPK lines. Pure functions over the logits.
 * Owns: sampling, and how an allowed-token mask (constrained decoding, grammar.h) restricts
 * it: `allow` is a vocab-bit bitmap (bit i of word i/64 set = token i may be chosen), NULL =
 * every token. Masked-out tokens get probability 0 and log-probabilities are those of the
 * masked (renormalised) distribution. */
#ifndef COLI_SAMPLER_H
#define COLI_SAMPLER_H
#include <stdint.h>

typedef struct { uint64_t s; } rng_state;
void rng_seed(rng_state *r, uint64_t seed);
double rng_uniform(rng_state *r);          /* [0,1) */

/* temperature 0 -> argmax (lowest id on ties). scratch: 2*vocab floats/ints worth.
 * -1 when `allow` permits no token. */
int sample_token(const float *logits, int vocab, float temperature, float top_p,
                 rng_state *r, void *scratch, const uint64_t *allow);
/* sample_token among the top_k most likely allowed tokens only (then top_p within them);
 * top_k <= 0 or >= vocab: no cut (exactly sample_token). Greedy ignores it. */
int sample_token_k(const float *logits, int vocab, float temperature, float top_p, int top_k,
                   rng_state *r, void *scratch, const uint64_t *allow);
/* The k most likely allowed tokens under softmax(logits) (temperature 1), descending;
 * returns how many exist (<= k; the rest of ids is -1, of logprobs -inf). */
int topk_logprobs(const float *logits, int vocab, int k, const uint64_t *allow, int *ids, float *logprobs);
/* Log of the softmax normaliser over the allowed tokens (-inf if none). */
double logsumexp_allowed(const float *logits, int vocab, const uint64_t *allow);
#endif
