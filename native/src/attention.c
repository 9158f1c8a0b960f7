/* attention.c — causal attention over the K/V rows of a slot (all of them, or a sliding
 * window's; with per-head sink logits in the denominators when the layer has them): scores of 8 keys at a time,
 * softmax with our own exp, V summed as fma chains (see native/README.md "Attention"). One
 * task = up to ATT_R consecutive rows of one slot x one KV head with its query heads. Scores
 * run over the key width, the V sums over the value width (they may differ). */
#include <math.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#include "model_impl.h"
/* Attention's fixed operation orders (every path, whatever the batch):
 *   score(q, k): lanes l < 8: s0[l] = fma chain over d with d % 16 == l, s1[l] over
 *     d % 16 == l + 8 (d ascending); e[l] = s0[l] + s1[l];
 *     dot = ((e0 + e1) + (e2 + e3)) + ((e4 + e5) + (e6 + e7)); score = dot * scale.
 *   softmax: see softmax_scores (own exp, double sums by t % 4).
 *   out[d] = fma chain of w_t * v_t[d] over t ascending from 0. */
/* K/V rows hold float or fp16 values (kv_cache.f16); every value is read as its exact float,
 * so both element types share one kernel and one order. f16 is a constant in each caller's
 * branch of the always-inline kernels, so each compiles to its own loads. */
static inline float kv_ld1(const void *p, size_t i, int f16) {
    return f16 ? fp16_to_f32(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}
#ifdef __AVX2__
static inline __attribute__((always_inline)) __m256 kv_ld8(const void *p, size_t i, int f16) {
    return f16 ? _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)))
               : _mm256_loadu_ps((const float *)p + i);
}
#endif

static void score_scalar(const float *q, const void *k, int hd, int f16, float *out) {
    float s0[8] = {0}, s1[8] = {0}, e[8];
    for (int d = 0; d < hd; d++) {
        int l = d % 16;
        if (l < 8) s0[l] = fmaf(q[d], kv_ld1(k, (size_t)d, f16), s0[l]);
        else s1[l - 8] = fmaf(q[d], kv_ld1(k, (size_t)d, f16), s1[l - 8]);
    }
    for (int l = 0; l < 8; l++) e[l] = s0[l] + s1[l];
    *out = ((e[0] + e[1]) + (e[2] + e[3])) + ((e[4] + e[5]) + (e[6] + e[7]));
}

/* The G query heads of one KV head (GQA) share every key and value row: the kernels below
 * take G heads at once, so each K/V value is loaded (and converted from fp16) once for all
 * of them. Per head the operations and their order are those stated above. */
#ifndef ATT_PF
#define ATT_PF 32   /* K/V rows prefetched ahead (into L2): 8 slots' caches stream from DRAM */
#endif

static inline void prefetch_l2(const char *p, int bytes) {
    for (int o = 0; o < bytes; o += 64) __builtin_prefetch(p + o, 0, 2);
}

#ifdef __AVX2__
/* Reduces v[0..7] (key j's lanes e[l] = s0[l] + s1[l] in v[j]) to the 8 scores, canonical order. */
static inline __attribute__((always_inline)) __m256 score_reduce8(const __m256 *v) {
    __m256 a = _mm256_hadd_ps(_mm256_hadd_ps(v[0], v[1]), _mm256_hadd_ps(v[2], v[3]));
    __m256 b = _mm256_hadd_ps(_mm256_hadd_ps(v[4], v[5]), _mm256_hadd_ps(v[6], v[7]));
    return _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
}

static inline __attribute__((always_inline)) void score8_v(const float *const *q, const int G,
                                                           const void *const *kp, const int hd, const int f16,
                                                           float *const *out) {
    __m256 v[ATT_G][8];
    for (int j = 0; j < 8; j++) {
        __m256 s0[ATT_G], s1[ATT_G];
        for (int g = 0; g < G; g++) s0[g] = s1[g] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            const __m256 k0 = kv_ld8(kp[j], (size_t)d, f16), k1 = kv_ld8(kp[j], (size_t)d + 8, f16);
            for (int g = 0; g < G; g++) {
                s0[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + d), k0, s0[g]);
                s1[g] = _mm256_fmadd_ps(_mm256_loadu_ps(q[g] + d + 8), k1, s1[g]);
            }
        }
        for (int g = 0; g < G; g++) v[g][j] = _mm256_add_ps(s0[g], s1[g]);
    }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out[g], score_reduce8(v[g]));
}
#endif

#ifdef __AVX512F__
/* 16 lanes: lane l < 8 is score_scalar's s0[l], lane l >= 8 its s1[l - 8] (the same fma chains). */
static inline __attribute__((always_inline)) __m512 kv_ld16(const void *p, size_t i, int f16) {
    return f16 ? _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)))
               : _mm512_loadu_ps((const float *)p + i);
}

static inline __attribute__((always_inline)) void score8_z(const float *const *q, const int G,
                                                           const void *const *kp, const int hd, const int f16,
                                                           float *const *out) {
    __m256 v[ATT_G][8];
    for (int j = 0; j < 8; j++) {
        __m512 s[ATT_G];
        for (int g = 0; g < G; g++) s[g] = _mm512_setzero_ps();
        for (int d = 0; d < hd; d += 16) {
            const __m512 k = kv_ld16(kp[j], (size_t)d, f16);
            for (int g = 0; g < G; g++) s[g] = _mm512_fmadd_ps(_mm512_loadu_ps(q[g] + d), k, s[g]);
        }
        for (int g = 0; g < G; g++)
            v[g][j] = _mm256_add_ps(_mm512_castps512_ps256(s[g]),
                                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s[g]), 1)));
    }
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out[g], score_reduce8(v[g]));
}
#define score8_w score8_z
#elif defined(__AVX2__)
#define score8_w score8_v
#endif

/* Scores of the G query heads q[g] against the 8 keys kp[0..7] into out[g][0..7]. */
static void score8(const float *const *q, int G, const void *const *kp, int hd, int f16, float *const *out) {
#ifdef __AVX2__
#define SCORE_G(HD, F16)                                                                     \
    switch (G) {                                                                             \
    case 1: return score8_w(q, 1, kp, HD, F16, out);                                         \
    case 2: return score8_w(q, 2, kp, HD, F16, out);                                         \
    case 3: return score8_w(q, 3, kp, HD, F16, out);                                         \
    default: return score8_w(q, 4, kp, HD, F16, out);                                        \
    }
    if (hd % 16 == 0) {
        if (f16) {
            if (hd == 64) SCORE_G(64, 1)
            SCORE_G(hd, 1)
        }
        if (hd == 64) SCORE_G(64, 0)
        if (hd == 128) SCORE_G(128, 0)
        SCORE_G(hd, 0)
    }
#undef SCORE_G
#endif
    for (int g = 0; g < G; g++)
        for (int j = 0; j < 8; j++) score_scalar(q[g], kp[j], hd, f16, out[g] + j);
}

/* o[g][0..hd) = sum over t < nt of w[g][t] * v_t (v_t = row t of vb, vst values apart) for
 * the G heads, canonical order. Columns in chunks of 32 (64 with AVX-512: 4 vectors) keep G * 4
 * accumulators; the 512-bit and 256-bit loops differ only in vector width. */
static inline __attribute__((always_inline)) void wsum_k(const float *const *w, const int G, const void *vb,
                                                         size_t vst, int nt, int hd, const int f16,
                                                         float *const *o) {
    int d = 0;
#ifdef __AVX512F__
    /* columns in chunks of 64 (4 x 16 lanes): the same fma chain per column */
    for (; d + 64 <= hd; d += 64) {
        __m512 a[ATT_G][4];
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) a[g][c] = _mm512_setzero_ps();
        for (int t = 0; t < nt; t++) {
            __m512 vt[4];
            if (d == 0 && t + ATT_PF < nt) prefetch_l2((const char *)vb + (size_t)(t + ATT_PF) * vst * (f16 ? 2 : 4), hd * (f16 ? 2 : 4));
            for (int c = 0; c < 4; c++) vt[c] = kv_ld16(vb, (size_t)t * vst + d + 16 * c, f16);
            for (int g = 0; g < G; g++) {
                const __m512 wt = _mm512_set1_ps(w[g][t]);
                for (int c = 0; c < 4; c++) a[g][c] = _mm512_fmadd_ps(wt, vt[c], a[g][c]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) _mm512_storeu_ps(o[g] + d + 16 * c, a[g][c]);
    }
#endif
#ifdef __AVX2__
    for (; d + 32 <= hd; d += 32) {
        __m256 a[ATT_G][4];
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) a[g][c] = _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            __m256 vt[4];
            if (d == 0 && t + ATT_PF < nt) prefetch_l2((const char *)vb + (size_t)(t + ATT_PF) * vst * (f16 ? 2 : 4), hd * (f16 ? 2 : 4));
            for (int c = 0; c < 4; c++) vt[c] = kv_ld8(vb, (size_t)t * vst + d + 8 * c, f16);
            for (int g = 0; g < G; g++) {
                const __m256 wt = _mm256_broadcast_ss(w[g] + t);
                for (int c = 0; c < 4; c++) a[g][c] = _mm256_fmadd_ps(wt, vt[c], a[g][c]);
            }
        }
        for (int g = 0; g < G; g++)
            for (int c = 0; c < 4; c++) _mm256_storeu_ps(o[g] + d + 8 * c, a[g][c]);
    }
    for (; d + 8 <= hd; d += 8) {
        __m256 a[ATT_G];
        for (int g = 0; g < G; g++) a[g] = _mm256_setzero_ps();
        for (int t = 0; t < nt; t++) {
            const __m256 vt = kv_ld8(vb, (size_t)t * vst + d, f16);
            for (int g = 0; g < G; g++) a[g] = _mm256_fmadd_ps(_mm256_broadcast_ss(w[g] + t), vt, a[g]);
        }
        for (int g = 0; g < G; g++) _mm256_storeu_ps(o[g] + d, a[g]);
    }
#endif
    for (; d < hd; d++)
        for (int g = 0; g < G; g++) {
            float a = 0.0f;
            for (int t = 0; t < nt; t++) a = fmaf(w[g][t], kv_ld1(vb, (size_t)t * vst + d, f16), a);
            o[g][d] = a;
        }
}

static void wsum_v(const float *const *w, int G, const void *vb, size_t vst, int nt, int hd, int f16,
                   float *const *o) {
#define WSUM_G(F16)                                                                          \
    switch (G) {                                                                             \
    case 1: wsum_k(w, 1, vb, vst, nt, hd, F16, o); break;                                    \
    case 2: wsum_k(w, 2, vb, vst, nt, hd, F16, o); break;                                    \
    case 3: wsum_k(w, 3, vb, vst, nt, hd, F16, o); break;                                    \
    default: wsum_k(w, 4, vb, vst, nt, hd, F16, o); break;                                   \
    }
    if (f16) WSUM_G(1)
    else WSUM_G(0)
#undef WSUM_G
}

/* In place over sc[0..nt): sc = scale * sc; p = exp(sc - max); sum of p in double, four
 * partial sums by t % 4 combined as (s0 + s1) + (s2 + s3); sc = p * (float)(1 / sum).
 * With a sink logit (sink != NULL, unscaled, as ggml's soft_max): max includes it and its
 * exp(sink - max) is added to the combined sum last; it has no output of its own. */
static void softmax_scores(float *sc, int nt, float scale, const float *sink) {
    int t = 0;
    float mx = -INFINITY;
#ifdef __AVX2__
    __m256 vs = _mm256_set1_ps(scale), vm = _mm256_set1_ps(-INFINITY);
    for (; t + 8 <= nt; t += 8) {
        __m256 v = _mm256_mul_ps(_mm256_loadu_ps(sc + t), vs);
        _mm256_storeu_ps(sc + t, v);
        vm = _mm256_max_ps(vm, v);
    }
    float m8[8];
    _mm256_storeu_ps(m8, vm);
    for (int j = 0; j < 8; j++) mx = m8[j] > mx ? m8[j] : mx;
#endif
    for (; t < nt; t++) {
        sc[t] *= scale;
        if (sc[t] > mx) mx = sc[t];
    }
    if (sink && *sink > mx) mx = *sink;
    double acc[4] = {0, 0, 0, 0};
    t = 0;
#ifdef __AVX2__
    __m256 vmx = _mm256_set1_ps(mx);
    __m256d a0 = _mm256_setzero_pd();
    for (; t + 8 <= nt; t += 8) {
        __m256 p = qexp_v(_mm256_sub_ps(_mm256_loadu_ps(sc + t), vmx));
        _mm256_storeu_ps(sc + t, p);
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_castps256_ps128(p)));
        a0 = _mm256_add_pd(a0, _mm256_cvtps_pd(_mm256_extractf128_ps(p, 1)));
    }
    _mm256_storeu_pd(acc, a0);
#endif
    for (; t < nt; t++) {
        sc[t] = qexp_s(sc[t] - mx);
        acc[t % 4] += sc[t];
    }
    double sum = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    if (sink) sum += qexp_s(*sink - mx);
    float inv = (float)(1.0 / sum);
    for (t = 0; t < nt; t++) sc[t] *= inv;
}

/* One task: the rows of one block x the query heads of one KV head, up to ATT_G heads per pass. */
void attn_task(void *vctx, int task) {
    const attn_ctx *A = vctx;
    kv_cache *kv = A->kv;
    const int hdk = A->hdk, hdv = A->hdv, l = A->l, kh = task % A->nkv, b = task / A->nkv;
    const int i0 = A->blk[b], i1 = A->blk[b + 1], s = A->rows[i0].slot;
    const size_t koff = (size_t)kh * hdk * kv_elt(kv), voff = (size_t)kh * hdv * kv_elt(kv);
    float *scr = A->ascr + (size_t)pool_thread_id() * ATT_G * (size_t)A->sc_len;
    for (int i = i0; i < i1; i++) {
        const int p = A->rows[i].pos, lo = A->window > 0 && p + 1 > A->window ? p + 1 - A->window : 0;
        const int nt = p + 1 - lo;      /* keys lo .. p */
        for (int g0 = 0; g0 < A->grp; g0 += ATT_G) {
            const int G = A->grp - g0 < ATT_G ? A->grp - g0 : ATT_G;
            const float *qv[ATT_G];
            float *sc[ATT_G], *o[ATT_G];
            for (int g = 0; g < G; g++) {
                const int hh = kh * A->grp + g0 + g;
                qv[g] = A->Q + (size_t)i * A->qd + (size_t)hh * hdk;
                sc[g] = scr + (size_t)g * A->sc_len;
                o[g] = A->att + (size_t)i * A->od + (size_t)hh * hdv;
            }
            for (int t0 = 0; t0 < nt; t0 += 8) {
                const void *kp[8];
                float *out[ATT_G];
                for (int j = 0; j < 8; j++) {
                    kp[j] = (const char *)kv_k(kv, s, l, lo + (t0 + j < nt ? t0 + j : nt - 1)) + koff;
                    if (g0 == 0 && t0 + j + ATT_PF < nt) prefetch_l2((const char *)kv_k(kv, s, l, lo + t0 + j + ATT_PF) + koff, hdk * (int)kv_elt(kv));
                }
                for (int g = 0; g < G; g++) out[g] = sc[g] + t0;
                score8(qv, G, kp, hdk, kv->f16, out);
            }
            for (int g = 0; g < G; g++)
                softmax_scores(sc[g], nt, A->scale, A->sinks ? A->sinks + kh * A->grp + g0 + g : NULL);
            wsum_v((const float *const *)sc, G, (const char *)kv_v(kv, s, l, lo) + voff, (size_t)kv->v_dim, nt, hdv, kv->f16, o);
        }
    }
}
