/* test_gdn.c — the Gated DeltaNet's delta rule (gdn.c): the vector form this build compiles
 * (AVX-512 or AVX2; the portable one elsewhere) gives the portable form's bits, state and output,
 * over many steps on one state, and both follow the rule as a float64 reference computes it. */
#define TEST_SEED 0x9e3779b97f4a7c15ull
#include "arch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

/* One step in float64: M *= decay; d_j = (v_j - M[j] . k) b; M[j] += d_j k; o_j = (M[j] . q) scale. */
static void reference(double *M, const float *k, const float *q, const float *v, double decay, double b,
                      double scale, double *o, int S) {
    for (int j = 0; j < S; j++) {
        double *Mj = M + (size_t)j * S, dk = 0.0, dq = 0.0;
        for (int t = 0; t < S; t++) Mj[t] *= decay, dk += Mj[t] * k[t];
        const double d = (v[j] - dk) * b;
        for (int t = 0; t < S; t++) Mj[t] += d * k[t], dq += Mj[t] * q[t];
        o[j] = dq * scale;
    }
}

static void check_width(int S, int steps) {
    const size_t n = (size_t)S * S;
    float *Mv = malloc(n * sizeof(float)), *Mp = malloc(n * sizeof(float));
    double *Mr = malloc(n * sizeof(double)), *orf = malloc((size_t)S * sizeof(double));
    float *k = malloc((size_t)S * sizeof(float)), *q = malloc((size_t)S * sizeof(float)),
          *v = malloc((size_t)S * sizeof(float)), *ov = malloc((size_t)S * sizeof(float)),
          *op = malloc((size_t)S * sizeof(float));
    for (size_t i = 0; i < n; i++) Mv[i] = Mp[i] = 0.5f * frand(), Mr[i] = Mv[i];
    const float scale = 1.0f / sqrtf((float)S);
    int same = 1;
    double worst = 0.0;
    for (int step = 0; step < steps; step++) {
        /* unit k and q, as the layer's L2 normalisation gives them */
        double nk = 0.0, nq = 0.0;
        for (int t = 0; t < S; t++) k[t] = frand(), q[t] = frand(), v[t] = frand();
        for (int t = 0; t < S; t++) nk += (double)k[t] * k[t], nq += (double)q[t] * q[t];
        for (int t = 0; t < S; t++) k[t] = (float)(k[t] / sqrt(nk)), q[t] = (float)(q[t] / sqrt(nq));
        const float decay = 0.9f + 0.1f * (frand() + 1.0f) / 2.0f, b = (frand() + 1.0f) / 2.0f;
        gdn_delta_rule(Mv, k, q, v, decay, b, scale, ov, S);
        gdn_delta_rule_portable(Mp, k, q, v, decay, b, scale, op, S);
        reference(Mr, k, q, v, decay, b, scale, orf, S);
        same &= memcmp(Mv, Mp, n * sizeof(float)) == 0 && memcmp(ov, op, (size_t)S * sizeof(float)) == 0;
        for (int j = 0; j < S; j++) worst = fmax(worst, fabs(op[j] - orf[j]));
    }
    CHECK(same, "S=%d: the vector delta rule's bits differ from the portable one's", S);
    CHECK(worst < 1e-4, "S=%d: max |o - float64 reference| = %g over %d steps", S, worst, steps);
    printf("  S=%d, %d steps: vector = portable bits: %s; max |o - float64| %.2e\n", S, steps, same ? "yes" : "no", worst);
    free(Mv), free(Mp), free(Mr), free(orf), free(k), free(q), free(v), free(ov), free(op);
}

int main(void) {
    check_width(16, 50);
    check_width(128, 50);   /* Qwen3.5 / Qwen3-Next's head width */
    check_width(256, 20);
    check_width(24, 20);    /* not a multiple of 16: the portable form on every build */
    if (fails) {
        printf("test_gdn: %d failures\n", fails);
        return 1;
    }
    printf("test_gdn: all passed\n");
    return 0;
}
