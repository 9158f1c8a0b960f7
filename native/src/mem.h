/* mem.h — buffers that hold weights.
 * Owns: weights_alloc, the one allocator of the engine's copies of weight bytes (packed matrices,
 * resident and scratch experts).
 *
 * Why: decode streams every weight a token needs once, gigabytes a second; with 4 KiB pages
 * that is a TLB miss and a page walk every 4 KiB read. A buffer of 2 MiB or more is placed
 * on a 2 MiB boundary and its whole 2 MiB pages are marked MADV_HUGEPAGE, so the kernel
 * (transparent huge pages in "madvise" mode, Debian's default) backs them with huge pages:
 * one TLB entry per 2 MiB. Nothing else changes: the bytes are the same, free() releases it,
 * and where THP is off the advice is ignored. */
#ifndef COLI_MEM_H
#define COLI_MEM_H

#include <stddef.h>

/* bytes (>= 1) of 64-byte-aligned memory, page-aligned from 64 KiB (an O_DIRECT read may land
 * there), huge-page-advised when large; NULL if out of memory.
 * Release with free(). */
void *weights_alloc(size_t bytes);

#endif
