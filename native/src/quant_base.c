/* quant_base.c — the bottom of the quant layer: what the per-format files (quant_k.c,
 * quant_iq.c) and everything above them share.
 * Owns: fp16_to_f32 / f32_to_fp16 (F16C or the portable conversions, exported for the tests) and
 * qdot_exact (EXACT=1's float dot, BF16's row kernel). */
#include "quant_base.h"

#include <math.h>
#include <string.h>
#ifdef __F16C__
#include <immintrin.h>
#endif

/* ---- fp16 ------------------------------------------------------------------------ */

static inline float bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static float sw_fp16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 31, man = h & 0x3ff;
    if (exp == 0) {                        /* zero or subnormal: man * 2^-24, exact */
        float v = (float)man * 0x1p-24f;
        return bits_f32(f32_bits(v) | sign);
    }
    if (exp == 31)                         /* inf, or NaN (quieted, payload kept) */
        return bits_f32(sign | 0x7f800000u | (man ? 0x00400000u | (man << 13) : 0));
    return bits_f32(sign | ((exp + 112) << 23) | (man << 13));
}

static uint16_t sw_f32_to_fp16(float f)
{
    uint32_t u = f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    u &= 0x7fffffffu;
    if (u >= 0x7f800000u)                  /* inf / NaN (NaN stays NaN, quiet) */
        return (uint16_t)(sign | 0x7c00 | (u > 0x7f800000u ? 0x200 | ((u >> 13) & 0x3ff) : 0));
    if (u >= 0x477ff000u)                  /* >= 65520 rounds to inf */
        return (uint16_t)(sign | 0x7c00);
    if (u < 0x38800000u) {                 /* below 2^-14: subnormal half (or zero) */
        float v = rintf(bits_f32(u) * 0x1p24f);   /* exact scaling, round to nearest even */
        return (uint16_t)(sign | (uint16_t)v);    /* 1024 becomes the smallest normal */
    }
    uint32_t h = (u >> 13) - (112u << 10);
    uint32_t rem = u & 0x1fff;
    if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) h++;
    return (uint16_t)(sign | h);
}

float fp16_to_f32(uint16_t h)
{
#ifdef __F16C__
    return _cvtsh_ss(h);
#else
    return sw_fp16_to_f32(h);
#endif
}

uint16_t f32_to_fp16(float f)
{
#ifdef __F16C__
    return (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
#else
    return sw_f32_to_fp16(f);
#endif
}

/* Exposed for tests only (not in quant.h): the portable conversions. */
float quant_sw_fp16_to_f32(uint16_t h);
uint16_t quant_sw_f32_to_fp16(float f);
float quant_sw_fp16_to_f32(uint16_t h) { return sw_fp16_to_f32(h); }
uint16_t quant_sw_f32_to_fp16(float f) { return sw_f32_to_fp16(f); }

float qdot_exact(const float *w, const float *x, int n)
{
    float l[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int k = 0;
#ifdef __AVX2__
    __m256 acc = _mm256_setzero_ps();
    for (; k + 8 <= n; k += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(w + k), _mm256_loadu_ps(x + k), acc);
    _mm256_storeu_ps(l, acc);
#endif
    for (; k < n; k++) l[k % 8] = fmaf(w[k], x[k], l[k % 8]);
    return ((l[0] + l[4]) + (l[2] + l[6])) + ((l[1] + l[5]) + (l[3] + l[7]));
}

