/* check.h — the C unit tests' harness: CHECK counts a failure and prints the first 30, and,
 * for files that define TEST_SEED before including it, a seeded xorshift generator for test
 * data (rnd32, frand in about [-1, 1)). */
#ifndef COLI_TEST_CHECK_H
#define COLI_TEST_CHECK_H
#include <stdint.h>
#include <stdio.h>

static int fails;
#define CHECK(cond, ...)                                                  \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fails++;                                                      \
            if (fails < 30) {                                             \
                printf("FAIL %s:%d: ", __FILE__, __LINE__);               \
                printf(__VA_ARGS__);                                      \
                printf("\n");                                             \
            }                                                             \
        }                                                                 \
    } while (0)

#ifdef TEST_SEED
static uint64_t rng = TEST_SEED;
static inline uint32_t rnd32(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 11);
}
static inline float frand(void) { return (float)rnd32() / 2147483648.0f - 1.0f; }
#endif
#endif
