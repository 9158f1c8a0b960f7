/* mem.c — weights_alloc (mem.h). */
#include "mem.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

#define HUGE_PAGE ((size_t)2 << 20)

void *weights_alloc(size_t bytes) {
    if (bytes < ((size_t)64 << 10)) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    if (bytes < HUGE_PAGE) return aligned_alloc(4096, (bytes + 4095) & ~(size_t)4095);   /* O_DIRECT's alignment */
    /* glibc serves this from its own mmap; the alignment's slack before the buffer is never
     * touched, so it costs address space, not memory */
    const size_t rounded = (bytes + 4095) & ~(size_t)4095;
    void *p = aligned_alloc(HUGE_PAGE, rounded);
    if (p) {
#ifdef MADV_HUGEPAGE
        madvise(p, rounded & ~(HUGE_PAGE - 1), MADV_HUGEPAGE);  /* advice only: failure is harmless */
#endif
    }
    return p;
}
