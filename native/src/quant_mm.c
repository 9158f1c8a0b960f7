/* quant_mm.c — the matmul dispatch: qmat_mul / qmat_mul_multi cut jobs into chunks of rows run
 * on the pool, and each chunk goes to the packed tiles, the transposed F16 tiles, the row kernels
 * or the EXACT path.
 * Owns: qmat_mul_multi, qmat_mul, qmat_mul_f32, the chunking (PAR_MIN_WORK, CHUNK_WORK), the job
 * checks, mm_rows (one chunk), mm_rows_packed (packed tiles, packing unpacked groups on the fly
 * into pk_scratch's per-thread buffer, or MXFP4's file-layout tile at decode). */
#include "quant_impl.h"
#include "quant_iq.h"
#include "quant_iqlow.h"
#include "pool.h"

/* ---- activations --------------------------------------------------------------------- */

static int is_quant(uint32_t t)
{
    return t == GGML_Q8_0 || t == GGML_Q4_0 || t == GGML_Q4_1 || t == GGML_Q5_0 || t == GGML_Q5_1 ||
           qk_is_k(t) || qiq_is_iq(t) || qiql_is(t) || t == GGML_MXFP4;
}
/* types whose kernels read the float activations */
static int is_float(uint32_t t) { return t == GGML_F32 || t == GGML_F16 || t == GGML_BF16; }

/* Per-thread buffer for packing unpacked matrices on the fly. */
static _Thread_local uint8_t *pk_buf;
static _Thread_local size_t pk_cap;

uint8_t *pk_scratch(size_t bytes)
{
    if (bytes > pk_cap) {
        free(pk_buf);
        pk_buf = alloc64(bytes);
        pk_cap = pk_buf ? bytes : 0;
    }
    return pk_buf;
}

/* Group pointer of rows r..r+7 of w: in place when packed, else packed into buf. */
static const uint8_t *pk_get(const qmat *w, int r, uint8_t *buf)
{
    const size_t gb = pk_group_bytes(w->type, w->cols);
    if (w->packed) return w->data + (size_t)(r / PK_ROWS) * gb;
    pk_group(w->type, w->cols, w->row_bytes, w->data, r, w->rows, buf);
    return buf;
}


/* nr outputs of one input row from a tile's results: a, or silu(a) * b when b is given. */
static inline void pk_store(float *o, const float *ak, const float *bk, int nr)
{
    if (bk) {
        int q = 0;
#ifdef __AVX2__
        for (; q + 8 <= nr; q += 8)
            _mm256_storeu_ps(o + q, qsilu_mul_v(_mm256_loadu_ps(ak + q), _mm256_loadu_ps(bk + q)));
#endif
        for (; q < nr; q++) o[q] = qsilu_mul(ak[q], bk[q]);
    }
    else {
        int q = 0;
#ifdef __AVX2__
        /* inline stores: a libc memcpy call per 64 bytes showed as 2 % of a batched step */
        for (; q + 8 <= nr; q += 8) _mm256_storeu_ps(o + q, _mm256_loadu_ps(ak + q));
#endif
        for (; q < nr; q++) o[q] = ak[q];
    }
}

/* Input rows up to which an MXFP4 matrix in the file's layout runs its file tile, which decodes
 * the codes for every 4 input rows, instead of packing each group once for all of them. */
#define FILE_TILE_MAX_N 4

/* Whether w (or no matrix) runs quant_tile_fp4.c's tile on the file's layout, for n input rows:
 * an MXFP4 expert streamed under a budget meets one or a few input rows per group at decode. */
static int file_tile(const qmat *w, int n)
{
#ifdef __AVX2__
    return w && !w->packed && w->type == GGML_MXFP4 && n <= FILE_TILE_MAX_N;
#else
    (void)w, (void)n;
    return 0;
#endif
}

/* The tile of groups r / 8 .. r / 8 + ng - 1 of w in the file's layout (pk_tile's res layout). */
static void tile_file(const qmat *w, int r, int ng, const qact *x, int i0, int nx, float *res)
{
#ifdef __AVX2__
    for (int g = 0; g < ng; g++) {
        const uint8_t *rows[PK_ROWS];
        for (int k = 0; k < PK_ROWS; k++) {
            const int rr = r + g * PK_ROWS + k;
            rows[k] = w->data + (size_t)(rr < w->rows ? rr : w->rows - 1) * w->row_bytes;
        }
        pk_fp4_file(rows, x, i0, nx, res + g * PK_ROWS, PK_ROWS * ng);
    }
#else
    (void)w, (void)r, (void)ng, (void)x, (void)i0, (void)nx, (void)res;
#endif
}

/* Rows [r0, r1) of a packable job (r0 a multiple of 8). */
static int mm_rows_packed(const mm_job *j, int r0, int r1)
{
    const qmat *w = j->w, *w2 = j->w2;
    const int n = j->x->n, rows = w->rows;
    const size_t st = (size_t)j->out_stride, gb = pk_group_bytes(w->type, w->cols);
    const int fa = file_tile(w, n), fb = file_tile(w2, n);
    uint8_t *buf = NULL;
    if ((!w->packed && !fa) || (w2 && !w2->packed && !fb)) {
        buf = pk_scratch(4 * gb);
        if (!buf) return -1;
    }
    float a[PK_NX * 16], b[PK_NX * 16];
    for (int r = r0; r < r1; r += 2 * PK_ROWS) {
        const int ng = r1 - r > PK_ROWS ? 2 : 1;
        const uint8_t *g1[2], *g2[2];
        for (int g = 0; g < ng; g++) {
            if (!fa) g1[g] = pk_get(w, r + g * PK_ROWS, buf ? buf + g * gb : NULL);
            if (w2 && !fb) g2[g] = pk_get(w2, r + g * PK_ROWS, buf ? buf + (2 + g) * gb : NULL);
        }
        const int nr = (rows - r < ng * PK_ROWS ? rows - r : ng * PK_ROWS);
        /* F16 with 2 groups keeps 4 accumulators per input row: at most 2 rows a tile */
        int nxmax = w->type == GGML_F16 && ng == 2 ? 2 : 4;
#ifdef PK_ZMM
        if (ng == 2 && w->type != GGML_F16) nxmax = PK_NX;
#endif
        if (w->type == GGML_BF16) nxmax = PK_BF16_NX;
        for (int i0 = 0; i0 < n; i0 += nxmax) {
            const int nx = n - i0 < nxmax ? n - i0 : nxmax;
            if (fa) tile_file(w, r, ng, j->x, i0, nx, a);
            else pk_tile(w->type, g1, ng, j->x, i0, nx, a);
            if (w2 && fb) tile_file(w2, r, ng, j->x, i0, nx, b);
            else if (w2) pk_tile(w2->type, g2, ng, j->x, i0, nx, b);
            for (int k = 0; k < nx; k++)
                pk_store(j->out + (size_t)(i0 + k) * st + r, a + k * 8 * ng, w2 ? b + k * 8 * ng : NULL, nr);
        }
    }
    return 0;
}

/* ---- matrix x rows ------------------------------------------------------------------- */

#define PAR_MIN_WORK (1L << 15)    /* multiply-adds below which threads cost more than they give */
#define CHUNK_WORK (1L << 17)      /* multiply-adds per chunk (at least one weight row) */

static int job_packed(const mm_job *j)
{
    return qpack_ok(j->w->type, j->w->rows, j->w->cols) && (!j->w2 || j->w2->type == j->w->type);
}

/* A gate/up job whose two matrices have different types (llama-quantize --tensor-type, the
 * "UD" dynamic mixes): each matrix goes its own way, so the job is fused only when they agree. */
static int job_mixed(const mm_job *j) { return j->w2 && j->w2->type != j->w->type; }

/* Chunks of a job start on whole tiles of whichever of its matrices runs tiled. */
static int job_row_align(const mm_job *j)
{
    int align = 1;
    const qmat *ws[2] = {j->w, j->w2};
    for (int k = 0; k < 2 && ws[k]; k++) {
        if (!qpack_ok(ws[k]->type, ws[k]->rows, ws[k]->cols)) continue;
        const int a = tp_shape(ws[k]->type, ws[k]->rows, ws[k]->cols) ? TP_ROWS : 16;
        if (a > align) align = a;
    }
    return align;          /* 1, 16 or TP_ROWS (a multiple of 16) */
}

/* Rows [r0, r1) of a job that is not packed: the row kernels, a window of at most 16 activation
 * rows at a time. */
static void mm_rows_rowk(const mm_job *j, int r0, int r1)
{
    const int n = j->x->n, cols = j->x->cols;
    const size_t st = (size_t)j->out_stride;
    qkern k1 = kern_for(j->w->type), k2 = j->w2 ? kern_for(j->w2->type) : NULL;
    float a[QDOT_MAX * 4], b[QDOT_MAX * 4];
    for (int i0 = 0; i0 < n; i0 += QDOT_MAX * 4) {
        /* a window of at most 16 activation rows against every weight row of the chunk */
        qact xw = *j->x;
        const int nw = n - i0 < QDOT_MAX * 4 ? n - i0 : QDOT_MAX * 4;
        xw.n = nw;
        xw.f += (size_t)i0 * cols;
        if (cols % QK == 0) {
            xw.q += (size_t)i0 * cols;
            xw.qd += (size_t)i0 * (cols / QK);
            xw.qs += (size_t)i0 * (cols / QK);
        }
        float *out = j->out + (size_t)i0 * st;
        if (nw == 1 && !j->w2 && !k1) {
            const uint8_t *wr = j->w->data + (size_t)r0 * j->w->row_bytes;
            if (j->w->type == GGML_F16)
                for (int r = r0; r < r1; r++, wr += j->w->row_bytes) out[r] = dot_f16(wr, xw.f, cols);
            else
                for (int r = r0; r < r1; r++, wr += j->w->row_bytes)
                    out[r] = dot_f32((const float *)(const void *)wr, xw.f, cols);
            continue;
        }
        for (int r = r0; r < r1; r++) {
            row_all(j->w, &xw, k1, r, a);
            if (j->w2) {
                row_all(j->w2, &xw, k2, r, b);
                for (int i = 0; i < nw; i++) out[(size_t)i * st + r] = qsilu_mul(a[i], b[i]);
            } else {
                for (int i = 0; i < nw; i++) out[(size_t)i * st + r] = a[i];
            }
        }
    }
}

static void mm_rows(const mm_job *j, int r0, int r1);

static _Thread_local float *mx_buf;
static _Thread_local size_t mx_cap;

/* Rows [r0, r1) of a mixed-type gate/up job: a = w x into the output, b = w2 x into a
 * per-thread buffer (index i * (r1 - r0) + r, r in [r0, r1)), then silu(a) * b — the products
 * the fused tiles give when both matrices share a type, in the same operations. */
static void mm_rows_mixed(const mm_job *j, int r0, int r1)
{
    const int n = j->x->n, nr = r1 - r0;
    const size_t need = (size_t)n * (size_t)nr + (size_t)r0, st = (size_t)j->out_stride;
    if (need > mx_cap) {
        free(mx_buf);
        mx_buf = alloc64(need * sizeof(float));
        mx_cap = mx_buf ? need : 0;
        if (!mx_buf) {
            fprintf(stderr, "qmat_mul: out of memory\n");
            abort();
        }
    }
    const mm_job a = {j->w, NULL, j->x, j->out, j->out_stride}, b = {j->w2, NULL, j->x, mx_buf, nr};
    mm_rows(&a, r0, r1);
    mm_rows(&b, r0, r1);
    for (int i = 0; i < n; i++) {
        float *o = j->out + (size_t)i * st;
        const float *bv = mx_buf + (size_t)i * (size_t)nr;
        for (int r = r0; r < r1; r++) o[r] = qsilu_mul(o[r], bv[r]);
    }
}

static void mm_rows(const mm_job *j, int r0, int r1)
{
    if (j->x->exact) {
        mm_rows_exact(j, r0, r1);
        return;
    }
    if (job_mixed(j)) {
        mm_rows_mixed(j, r0, r1);
        return;
    }
    if (job_packed(j)) {
        if ((tp_shape(j->w->type, j->w->rows, j->w->cols) ? mm_rows_tp(j, r0, r1) : mm_rows_packed(j, r0, r1)) != 0) {
            fprintf(stderr, "qmat_mul: out of memory\n");
            abort();
        }
        return;
    }
    mm_rows_rowk(j, r0, r1);
}

typedef struct { int job, r0, r1; } mm_chunk;
typedef struct { const mm_job *jobs; const mm_chunk *ch; } mm_ctx;

static void mm_chunk_fn(void *vctx, int c)
{
    const mm_ctx *m = vctx;
    mm_rows(&m->jobs[m->ch[c].job], m->ch[c].r0, m->ch[c].r1);
}

static int job_ok(const mm_job *j)
{
    const qmat *w = j->w;
    const uint32_t type = w->type;
    int ok = j->x->cols == w->cols && (is_float(type) || (is_quant(type) && w->cols % QK == 0));
    if (ok && j->w2)
        ok = j->w2->rows == w->rows && j->w2->cols == w->cols &&
             (is_float(j->w2->type) || (is_quant(j->w2->type) && w->cols % QK == 0));
    if (!ok) {
        fprintf(stderr, "qmat_mul: unsupported case (type %u, cols %d, act cols %d)\n", type,
                w->cols, j->x->cols);
        for (int i = 0; i < j->x->n; i++)
            for (int r = 0; r < w->rows; r++) j->out[(size_t)i * j->out_stride + r] = 0.0f;
    }
    return ok;
}

static int job_ok_quiet(const mm_job *j)
{
    const qmat *w = j->w;
    int ok = j->x->cols == w->cols && (is_float(w->type) || (is_quant(w->type) && w->cols % QK == 0));
    if (ok && j->w2)
        ok = j->w2->rows == w->rows && j->w2->cols == w->cols &&
             (is_float(j->w2->type) || (is_quant(j->w2->type) && w->cols % QK == 0));
    return ok;
}

/* Every job on the calling thread (small work, one thread, or no memory for the chunk list). */
static void mm_serial(const mm_job *jobs, int cnt)
{
    for (int j = 0; j < cnt; j++)
        if (jobs[j].w->rows > 0 && jobs[j].x->n > 0 && job_ok_quiet(&jobs[j]))
            mm_rows(&jobs[j], 0, jobs[j].w->rows);
}

void qmat_mul_multi(const mm_job *jobs, int cnt)
{
    long total = 0;
    int nch = 0;
    mm_chunk stack_ch[512], *ch = stack_ch;
    for (int pass = 0; pass < 2; pass++) {
        for (int j = 0; j < cnt; j++) {
            const mm_job *J = &jobs[j];
            if (J->w->rows <= 0 || J->x->n <= 0) continue;
            if (pass == 0 && !job_ok(J)) continue;
            long per_row = (long)J->w->cols * J->x->n * (J->w2 ? 2 : 1);
            int rpc = (int)(CHUNK_WORK / (per_row > 0 ? per_row : 1));
            if (rpc < 1) rpc = 1;
            const int align = job_row_align(J);              /* whole tiles */
            rpc = (rpc + align - 1) / align * align;
            if (pass == 0) {
                total += per_row * J->w->rows;
                nch += (J->w->rows + rpc - 1) / rpc;
                continue;
            }
            if (!job_ok_quiet(J)) continue;
            for (int r = 0; r < J->w->rows; r += rpc) {
                ch[nch].job = j;
                ch[nch].r0 = r;
                ch[nch].r1 = r + rpc < J->w->rows ? r + rpc : J->w->rows;
                nch++;
            }
        }
        if (pass == 0) {
            if (nch == 0) return;
            if (total < PAR_MIN_WORK || pool_threads() == 1) {
                mm_serial(jobs, cnt);
                return;
            }
            if (nch > (int)(sizeof stack_ch / sizeof stack_ch[0])) {
                ch = malloc(sizeof *ch * (size_t)nch);
                if (!ch) {
                    mm_serial(jobs, cnt);
                    return;
                }
            }
            nch = 0;
        }
    }
    mm_ctx m = {jobs, ch};
    pool_run(mm_chunk_fn, &m, nch);
    if (ch != stack_ch) free(ch);
}

void qmat_mul(const qmat *w, const qact *x, float *out, int out_stride)
{
    mm_job j = {w, NULL, x, out, out_stride};
    qmat_mul_multi(&j, 1);
}

void qmat_mul_f32(const qmat *w, const float *x, int n, float *out, int out_stride)
{
    qact a = {0};
    qact_prepare(&a, w->type, x, n, w->cols);
    qmat_mul(w, &a, out, out_stride);
    qact_free(&a);
}
