/* test_huge_pages.c — tp_advise_huge_pages advises exactly the whole
 * 2 MiB pages inside a large block (the kernel's VmFlags show "hg" there,
 * where the kernel takes the advice at all), and leaves small blocks,
 * NULL and blocks holding no whole huge page alone; the engine's large
 * result blocks (host_block.h) are advised, small ones not, and kept for
 * reuse once released. */
#include <check.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "check_main.h"
#include "host_block.h"
#include "huge_pages.h"

#define MIB ((size_t)1 << 20)

/* The line of /proc/self/smaps that starts with key in the mapping holding
 * addr, into line (n bytes); 0 when there is none. */
static int smaps_line_at(const void *addr, const char *key, char *line, size_t n)
{
    FILE *f = fopen("/proc/self/smaps", "r");
    ck_assert_msg(f, "cannot read /proc/self/smaps");
    char buf[512];
    int inside = 0, found = 0;
    while (fgets(buf, sizeof buf, f)) {
        unsigned long lo, hi;
        char dash;
        if (sscanf(buf, "%lx%c%lx ", &lo, &dash, &hi) == 3 && dash == '-')
            inside = (uintptr_t)addr >= lo && (uintptr_t)addr < hi;
        else if (inside && strncmp(buf, key, strlen(key)) == 0)
            found = snprintf(line, n, "%s", buf) >= 0;
    }
    fclose(f);
    return found;
}

/* Whether the mapping holding addr carries VmFlag flag. */
static int vm_flag_at(const void *addr, const char *flag)
{
    char line[512], want[8];
    snprintf(want, sizeof want, " %s", flag);
    return smaps_line_at(addr, "VmFlags:", line, sizeof line) && strstr(line, want) != NULL;
}

/* The kB of LazyFree in the mapping holding addr; -1 where smaps has no
 * such field (kernels before 4.12). */
static long lazy_free_kb_at(const void *addr)
{
    char line[512];
    return smaps_line_at(addr, "LazyFree:", line, sizeof line) ? strtol(line + 9, NULL, 10) : -1;
}

/* Whether this kernel takes MADV_HUGEPAGE at all (THP built in). */
static int kernel_takes_advice(void)
{
    void *m = mmap(NULL, 4 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(m != MAP_FAILED);
    void *aligned = (void *)(((uintptr_t)m + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1));
    int ok = madvise(aligned, 2 * MIB, MADV_HUGEPAGE) == 0;
    munmap(m, 4 * MIB);
    return ok;
}

START_TEST(large_block_advised_inside_only)
{
    /* A mapping of its own, so no other block shares its VmFlags: 16 MiB
     * with the block starting 64 bytes past a 2 MiB boundary. */
    char *m = mmap(NULL, 16 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(m != MAP_FAILED);
    char *base = (char *)(((uintptr_t)m + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1));
    char *block = base + 64;
    size_t bytes = 8 * MIB;
    int took = tp_advise_huge_pages(block, bytes);
    if (!kernel_takes_advice()) {
        printf("large_block_advised_inside_only: this kernel refuses MADV_HUGEPAGE; only the refusal checked\n");
        ck_assert_int_eq(took, 0);
    } else {
        ck_assert_int_eq(took, 1);
        /* whole huge pages inside: [base + 2 MiB, base + 8 MiB) */
        ck_assert_msg(vm_flag_at(base + 2 * MIB, "hg"), "the first whole huge page is not advised");
        ck_assert_msg(vm_flag_at(base + 8 * MIB - 1, "hg"), "the last whole huge page is not advised");
        /* the partial pages at either end share memory with other blocks */
        ck_assert_msg(!vm_flag_at(base, "hg"), "the block's first, partial huge page was advised");
        ck_assert_msg(!vm_flag_at(base + 8 * MIB, "hg"), "the block's last, partial huge page was advised");
    }
    memset(block, 1, bytes); /* the block works either way */
    munmap(m, 16 * MIB);
}
END_TEST

START_TEST(small_or_null_blocks_left_alone)
{
    char *m = mmap(NULL, 8 * MIB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    ck_assert(m != MAP_FAILED);
    char *base = (char *)(((uintptr_t)m + 2 * MIB - 1) & ~(uintptr_t)(2 * MIB - 1));
    ck_assert_int_eq(tp_advise_huge_pages(base, TP_HUGE_PAGES_MIN - 1), 0);
    ck_assert_msg(!vm_flag_at(base, "hg"), "a block under TP_HUGE_PAGES_MIN was advised");
    ck_assert_int_eq(tp_advise_huge_pages(NULL, 64 * MIB), 0);
    munmap(m, 8 * MIB);
}
END_TEST

/* A result block is written once, by the rank copying the outputs: on
 * 4 KiB pages each faulted on that copy (engine/host_block.c). */
START_TEST(large_result_blocks_advised)
{
    size_t bytes = 40 * MIB; /* past glibc's largest mmap threshold: a mapping of its own */
    tp_host_block *big = tp_host_block_create(bytes, 1), *small = tp_host_block_create(TP_HUGE_PAGES_MIN / 2, 1);
    ck_assert(big && small);
    char *data = tp_host_block_data(big);
    if (!kernel_takes_advice()) {
        printf("large_result_blocks_advised: this kernel refuses MADV_HUGEPAGE; nothing to check\n");
    } else {
        ck_assert_msg(vm_flag_at(data + bytes / 2, "hg"), "a 40 MiB result block is not advised");
        ck_assert_msg(!vm_flag_at(tp_host_block_data(small), "hg"), "a 2 MiB result block was advised");
    }
    memset(data, 1, bytes);
    tp_host_block_release(big);
    tp_host_block_release(small);
}
END_TEST

/* A large block released by its last holder is kept for the next one
 * of about its size (a need of at least half of it), its pages marked
 * MADV_FREE so the kernel may take them back meanwhile: a fresh block
 * faulted and zeroed every page on the ranks' copy of the outputs. At
 * most four are kept. */
START_TEST(released_large_blocks_kept_lazily)
{
    size_t bytes = 24 * MIB;
    tp_host_block *b = tp_host_block_create(bytes, 2);
    ck_assert(b);
    char *data = tp_host_block_data(b);
    memset(data, 1, bytes);
    tp_host_block_release(b);
    ck_assert_msg(lazy_free_kb_at(data + bytes / 2) <= 0, "a block still held was marked free");
    tp_host_block_release(b);
    long lazy = lazy_free_kb_at(data + bytes / 2);
    ck_assert_msg(lazy < 0 || lazy >= (long)(bytes >> 10) - 4096, "%ld kB of a released 24 MiB block lazily free",
                  lazy);
    tp_host_block *again = tp_host_block_create(bytes - 4096, 1);
    ck_assert_ptr_eq(again, b);
    memset(tp_host_block_data(again), 2, bytes - 4096); /* writable to its end (ASan checks) */
    ck_assert_int_eq(((char *)tp_host_block_data(again))[bytes - 4097], 2);
    tp_host_block_release(again);
    tp_host_block *smaller = tp_host_block_create(bytes / 2 - 4096, 1);
    ck_assert_msg(smaller != b, "a need under half its size took a kept block");
    tp_host_block_release(smaller);

    enum { N = 5 };
    tp_host_block *first[N], *second[N];
    for (int i = 0; i < N; i++)
        ck_assert((first[i] = tp_host_block_create(8 * MIB, 1)) != NULL);
    for (int i = 0; i < N; i++)
        tp_host_block_release(first[i]);
    int reused = 0;
    for (int i = 0; i < N; i++) {
        ck_assert((second[i] = tp_host_block_create(8 * MIB, 1)) != NULL);
        for (int j = 0; j < N; j++)
            reused += second[i] == first[j];
    }
    ck_assert_msg(reused >= 1 && reused <= 4, "%d of 5 released blocks came back (at most 4 are kept)", reused);
    for (int i = 0; i < N; i++)
        tp_host_block_release(second[i]);
}
END_TEST

static Suite *huge_pages_suite(void)
{
    Suite *s = suite_create("huge_pages");
    TCase *t = tcase_create("core");
    tcase_add_test(t, large_block_advised_inside_only);
    tcase_add_test(t, small_or_null_blocks_left_alone);
    tcase_add_test(t, large_result_blocks_advised);
    tcase_add_test(t, released_large_blocks_kept_lazily);
    suite_add_tcase(s, t);
    return s;
}

TP_CHECK_MAIN(huge_pages_suite)
