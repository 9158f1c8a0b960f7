/* deq_dump.c — dequantization driver for the numpy comparison (not a unit test).
 *   deq_dump TYPE N IN OUT   IN holds rows of N values of ggml type number TYPE (raw bytes);
 *   OUT gets dequant_row's float32 values of every row.
 * Build: make -C native build/deq_dump (tests/native/test_kquants.py does). */
#include <stdio.h>
#include <stdlib.h>

#include "gguf.h"
#include "quant.h"

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: deq_dump TYPE N IN OUT\n");
        return 2;
    }
    uint32_t t = (uint32_t)atoi(argv[1]);
    int n = atoi(argv[2]);
    size_t rb = ggml_row_bytes(t, (uint64_t)n);
    if (rb == 0 || !ggml_type_known(t)) {
        fprintf(stderr, "deq_dump: type %s with %d values per row is not supported\n", ggml_type_name(t), n);
        return 1;
    }
    FILE *in = fopen(argv[3], "rb"), *out = fopen(argv[4], "wb");
    uint8_t *row = malloc(rb);
    float *v = malloc(sizeof(float) * (size_t)n);
    if (!in || !out || !row || !v) return 1;
    while (fread(row, 1, rb, in) == rb) {
        dequant_row(t, row, v, n);
        if (fwrite(v, sizeof(float), (size_t)n, out) != (size_t)n) return 1;
    }
    free(row);
    free(v);
    return fclose(in) != 0 || fclose(out) != 0;
}
