/* tests/common/rng.h - tiny deterministic RNG for tests and benches (splitmix64).
 * Tests seed from time/pid by default and print the seed, so a failure can be replayed
 * with FI_TEST_SEED=<seed>. */
#ifndef FI_TEST_RNG_H
#define FI_TEST_RNG_H

#include <stdint.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef struct tt_rng { uint64_t s; } tt_rng;

static inline uint64_t tt_rng_next(tt_rng *r) {
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* uniform integer in [lo, hi] */
static inline int32_t tt_rng_int(tt_rng *r, int32_t lo, int32_t hi) {
    return lo + (int32_t)(tt_rng_next(r) % (uint64_t)(hi - lo + 1));
}
/* uniform float in [-1, 1) */
static inline float tt_rng_float(tt_rng *r) {
    return (float)((tt_rng_next(r) >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}
/* Seed from FI_TEST_SEED if set, else fresh (time ^ pid). */
static inline uint64_t tt_test_seed(void) {
    const char *s = getenv("FI_TEST_SEED");
    if (s && *s) return strtoull(s, NULL, 0);
    return (uint64_t)time(NULL) * 6364136223846793005ull ^ (uint64_t)getpid();
}
#endif
