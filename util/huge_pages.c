#include "huge_pages.h"

#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

#define HUGE_PAGE ((uintptr_t)2 << 20)

/* The pages of `page` bytes (a power of two) wholly inside [p, p + bytes)
 * into [*lo, *hi); 0 when there is none. Advice covers whole pages, and a
 * block's first and last bytes share pages with other blocks. */
static int whole_pages(void *p, size_t bytes, uintptr_t page, uintptr_t *lo, uintptr_t *hi)
{
    *lo = ((uintptr_t)p + page - 1) & ~(page - 1);
    *hi = ((uintptr_t)p + bytes) & ~(page - 1);
    return *hi > *lo;
}

int tp_advise_huge_pages(void *p, size_t bytes)
{
    uintptr_t lo, hi;
    if (!p || bytes < TP_HUGE_PAGES_MIN || !whole_pages(p, bytes, HUGE_PAGE, &lo, &hi))
        return 0;
    return madvise((void *)lo, hi - lo, MADV_HUGEPAGE) == 0;
}

void tp_release_pages(void *p, size_t bytes)
{
    long page = sysconf(_SC_PAGESIZE);
    uintptr_t lo, hi;
    if (!p || page <= 0 || !whole_pages(p, bytes, (uintptr_t)page, &lo, &hi))
        return;
    if (madvise((void *)lo, hi - lo, MADV_REMOVE) != 0)
        (void)madvise((void *)lo, hi - lo, MADV_DONTNEED);
}
