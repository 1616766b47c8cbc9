#include "huge_pages.h"

#include <stdint.h>
#include <sys/mman.h>

#define HUGE_PAGE ((uintptr_t)2 << 20)

int tp_advise_huge_pages(void *p, size_t bytes)
{
    if (!p || bytes < TP_HUGE_PAGES_MIN)
        return 0;
    /* Only whole huge pages inside the block: the advice covers pages, and
     * the block's first and last bytes share pages with other blocks. */
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
    return hi > lo && madvise((void *)lo, hi - lo, MADV_HUGEPAGE) == 0;
}
