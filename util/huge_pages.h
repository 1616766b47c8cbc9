/* huge_pages.h — large blocks of memory asked onto transparent huge pages,
 * and pages nothing will read again given back (tp_release_pages).
 *
 * A block glibc serves from mmap (the server sets the threshold at
 * 1 MiB) is fresh memory: its first touch faults once per 4 KiB page,
 * zeroing each. Loading GPT-2 (475 MB of weights, packed once at load)
 * spent a third of its samples in those faults; on this kind of VM a
 * 4 KiB fault costs ~4 us, a 2 MiB one as much as ~100 4 KiB ones less.
 * Advising the block before its first touch lets the kernel back it with
 * 2 MiB pages where THP is enabled ("always" or "madvise"); elsewhere the
 * advice is refused and the block stays as it was. */
#ifndef TP_HUGE_PAGES_H
#define TP_HUGE_PAGES_H

#include <stddef.h>

/* Blocks smaller than this are left alone: a huge page they do not fill
 * would only cost memory. */
#define TP_HUGE_PAGES_MIN ((size_t)4 << 20)

/* Advises the 2 MiB-aligned pages inside [p, p + bytes) for huge pages,
 * when bytes >= TP_HUGE_PAGES_MIN. Best effort: returns 1 when the
 * kernel took the advice, 0 when it was refused or not given. */
int tp_advise_huge_pages(void *p, size_t bytes);

/* Gives the whole pages inside [p, p + bytes) back to the kernel: memory
 * nothing will read again, which then reads as zeros. MADV_REMOVE frees a
 * shared mapping's pages (ranks as processes allocate from shared
 * memory); private memory refuses it and takes MADV_DONTNEED. Best
 * effort: pages the kernel keeps only cost what they did before. */
void tp_release_pages(void *p, size_t bytes);

#endif
