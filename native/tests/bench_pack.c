/* bench_pack.c — packing speed of an expert-sized matrix (not a unit test): GB/s of file bytes
 * qpack turns into the tiles' layout, per type. Build: make -C native build/bench_pack */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "gguf.h"
#include "quant.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    const int rows = argc > 1 ? atoi(argv[1]) : 768, cols = argc > 2 ? atoi(argv[2]) : 2048;
    const uint32_t types[] = {GGML_Q4_K, GGML_Q6_K, GGML_Q8_0, GGML_Q4_1, GGML_MXFP4, GGML_IQ1_S, GGML_IQ2_XXS, GGML_IQ2_XS,
                              GGML_IQ3_S};
    for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
        const uint32_t t = types[k];
        if (!qpack_ok(t, rows, cols)) continue;     /* the K and IQ types need cols % 256 == 0 */
        const size_t rb = ggml_row_bytes(t, cols), bytes = rb * rows;
        uint8_t *src = malloc(bytes), *dst = malloc(qpack_bytes(t, rows, cols));
        for (size_t i = 0; i < bytes; i++) src[i] = (uint8_t)(i * 2654435761u >> 13);
        qmat m = {t, rows, cols, rb, src, 0};
        double best = 1e9;
        for (int rep = 0; rep < 20; rep++) {
            double t0 = now();
            qpack(&m, dst);
            double dt = now() - t0;
            if (dt < best) best = dt;
        }
        printf("%-5s %dx%d: %.2f MB, qpack %.3f ms, %.2f GB/s\n", ggml_type_name(t), rows, cols, bytes / 1e6, best * 1e3,
               bytes / best / 1e9);
        free(src);
        free(dst);
    }
    return 0;
}
