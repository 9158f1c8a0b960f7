/* gguf.h — read-only view of a GGUF v3 file.
 * Owns: mmap of the file, parsing of the header, metadata key/values and tensor infos.
 * Every failure is reported as a one-line reason in gguf_file.err; nothing here exits. */
#ifndef COLI_GGUF_H
#define COLI_GGUF_H
#include <stddef.h>
#include <stdint.h>

enum gguf_vtype {
    GGUF_T_UINT8 = 0, GGUF_T_INT8 = 1, GGUF_T_UINT16 = 2, GGUF_T_INT16 = 3,
    GGUF_T_UINT32 = 4, GGUF_T_INT32 = 5, GGUF_T_FLOAT32 = 6, GGUF_T_BOOL = 7,
    GGUF_T_STRING = 8, GGUF_T_ARRAY = 9, GGUF_T_UINT64 = 10, GGUF_T_INT64 = 11,
    GGUF_T_FLOAT64 = 12,
};

/* ggml tensor types we know by number (others load as "unsupported"). */
enum ggml_type {
    GGML_F32 = 0, GGML_F16 = 1, GGML_Q4_0 = 2, GGML_Q4_1 = 3, GGML_Q5_0 = 6, GGML_Q5_1 = 7, GGML_Q8_0 = 8,
    GGML_Q2_K = 10, GGML_Q3_K = 11, GGML_Q4_K = 12, GGML_Q5_K = 13, GGML_Q6_K = 14, GGML_IQ2_XXS = 16,
    GGML_IQ2_XS = 17, GGML_IQ3_XXS = 18, GGML_IQ1_S = 19, GGML_IQ4_NL = 20, GGML_IQ3_S = 21, GGML_IQ2_S = 22,
    GGML_IQ4_XS = 23, GGML_IQ1_M = 29, GGML_BF16 = 30, GGML_MXFP4 = 39,
};

typedef struct { const char *ptr; uint64_t len; } gguf_str;   /* not NUL-terminated */

typedef struct {
    gguf_str key;
    uint32_t type;          /* enum gguf_vtype */
    uint32_t arr_type;      /* element type when type == ARRAY */
    uint64_t arr_len;
    const uint8_t *data;    /* raw little-endian value (or first array element) in the map */
    uint64_t *str_off;      /* string arrays: offset of element i from data (owned by gguf.c) */
    uint8_t seen;           /* a lookup found it (gguf_find_kv): what a loader never read is not */
} gguf_kv;

typedef struct {
    gguf_str name;
    uint32_t n_dims;
    uint64_t ne[4];         /* ne[0] is the row length (input dim of a matrix) */
    uint32_t type;          /* enum ggml_type */
    uint64_t offset;        /* from the start of the data section */
    const uint8_t *data;    /* pointer into the map */
    uint64_t nbytes;
    uint64_t file_offset;   /* absolute offset in the file, for pread by the expert store */
    uint8_t seen;           /* a lookup found it (gguf_find_tensor) */
} gguf_tensor;

typedef struct {
    int fd;
    const uint8_t *map;
    size_t size;
    uint32_t version;
    uint64_t n_kv, n_tensors;
    gguf_kv *kv;
    gguf_tensor *tensors;
    uint64_t alignment;
    uint64_t data_offset;
    char path[1024];
    char err[256];
} gguf_file;

/* The file's pages over [off, off + n) read in the background, in large requests (the file has
 * no readahead: gguf_open). The caller reads every one of them before it drops them. */
void gguf_will_need(int fd, uint64_t off, size_t n);
/* n bytes at file offset off into dst: pread on fd (never touching the mapping's pages), or a
 * copy from the mapping when fd < 0. 0 ok, -1 error or out of range. */
int gguf_read_at(int fd, const uint8_t *map, size_t map_size, uint64_t off, void *dst, size_t n);
/* Drops the page cache's copy of file bytes [off, off + n) (whole pages around them): a weight
 * the engine keeps in its own buffer, or reads on use within a budget, has one owner then, not
 * the buffer plus the page cache (a cgroup counts both; at full RAM the two copies thrash). */
void gguf_drop_cache(int fd, uint64_t off, size_t n);

/* 0 on success; -1 with g->err set (file missing, bad magic, truncated, bad type, ...). */
int gguf_open(gguf_file *g, const char *path);
void gguf_close(gguf_file *g);

/* The lookups mark what they find as seen (the one change through a const file: the load's
 * check that it read every tensor and every key of its architecture). */
const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
/* Typed getters: return `def` when the key is missing or of a non-numeric type. */
int64_t gguf_get_int(const gguf_file *g, const char *key, int64_t def);
double gguf_get_float(const gguf_file *g, const char *key, double def);
/* Returns a malloc'ed NUL-terminated copy, or NULL when missing / not a string. */
char *gguf_get_string(const gguf_file *g, const char *key);
/* Array of strings: element i (0-based) as gguf_str; returns 0 if ok. */
int gguf_array_string(const gguf_kv *kv, uint64_t i, gguf_str *out);
/* Array of numbers: element i converted to double / int64. */
double gguf_array_float(const gguf_kv *kv, uint64_t i);
int64_t gguf_array_int(const gguf_kv *kv, uint64_t i);

/* Bytes of one row of n values of the given type; 0 if unsupported or n not a block multiple. */
size_t ggml_row_bytes(uint32_t type, uint64_t n);
const char *ggml_type_name(uint32_t type);
/* Whether a tensor of this type loads at all (the matmul kernels may take fewer), and the
 * list of those types for refusal lines. */
int ggml_type_known(uint32_t type);
const char *ggml_known_types(void);
#endif
