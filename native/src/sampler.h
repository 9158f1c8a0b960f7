/* sampler.h — next-token choice from logits: greedy, temperature, top-k, top-p, seeded RNG,
 * and top-k log-probabilities for TOPK lines. Pure functions over the logits. */
#ifndef COLI_SAMPLER_H
#define COLI_SAMPLER_H
#include <stdint.h>

typedef struct { uint64_t s; } rng_state;
void rng_seed(rng_state *r, uint64_t seed);
double rng_uniform(rng_state *r);          /* [0,1) */

/* temperature 0 -> argmax (lowest id on ties). scratch: 2*vocab floats/ints worth. */
int sample_token(const float *logits, int vocab, float temperature, float top_p,
                 rng_state *r, void *scratch);
/* sample_token among the top_k most likely tokens only (then top_p within them);
 * top_k <= 0 or >= vocab: no cut (exactly sample_token). Greedy ignores it. */
int sample_token_k(const float *logits, int vocab, float temperature, float top_p, int top_k,
                   rng_state *r, void *scratch);
/* The k most likely tokens under softmax(logits) (temperature 1), descending. */
void topk_logprobs(const float *logits, int vocab, int k, int *ids, float *logprobs);
#endif
