/* quant_exact.c — EXACT=1: float activations only (qact.exact), for tight oracle tests.
 * Owns: qdot_exact (8 fma lanes, one fixed reduction tree; AVX2 and portable give the same bits)
 * and mm_rows_exact (each weight row dequantized by qmat_row, dotted with every input row). */
#include "quant_impl.h"

static _Thread_local float *ex_buf;
static _Thread_local size_t ex_cap;

/* Rows [r0, r1) of a job whose activations are floats only: each weight row dequantized
 * (qmat_row: dequant_row's values, packed or not) once, dotted with every input row
 * (qdot_exact); w2: silu(a) * b. One fixed operation order per output, whatever the batch,
 * chunking or thread count. */
void mm_rows_exact(const mm_job *j, int r0, int r1)
{
    const qmat *w = j->w, *w2 = j->w2;
    const qact *x = j->x;
    const int n = x->n, cols = w->cols;
    const size_t st = (size_t)j->out_stride;
    if ((size_t)2 * cols > ex_cap) {
        free(ex_buf);
        ex_cap = (size_t)2 * cols;
        ex_buf = alloc64(ex_cap * sizeof(float));
        if (!ex_buf) {
            fprintf(stderr, "qmat_mul: out of memory\n");
            abort();
        }
    }
    float *wa = ex_buf, *wb = ex_buf + cols;
    for (int r = r0; r < r1; r++) {
        qmat_row(w, r, wa);
        if (w2) qmat_row(w2, r, wb);
        for (int i = 0; i < n; i++) {
            const float *xi = x->f + (size_t)(x->idx ? x->idx[i] : i) * (size_t)cols;
            float a = qdot_exact(wa, xi, cols);
            j->out[(size_t)i * st + r] = w2 ? qsilu_mul(a, qdot_exact(wb, xi, cols)) : a;
        }
    }
}
