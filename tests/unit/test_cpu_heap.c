/* test_cpu_heap.c — the first-fit allocator behind the shared-memory cpu
 * backend: alignment from an unaligned region, reuse, coalescing, a full
 * heap's message, zero-byte blocks and bad frees. */
#include <check.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check_main.h"
#include "cpu/heap.h"

#define A CPU_HEAP_ALIGN

static _Alignas(A) char region[64 * 1024 + 3 * A];

static cpu_heap *mk(size_t skew, size_t bytes)
{
    tp_err err = {{0}};
    cpu_heap *h = cpu_heap_create(region + skew, bytes, &err);
    ck_assert_msg(h != NULL, "%s", err.msg);
    return h;
}

static void *get(cpu_heap *h, size_t bytes)
{
    tp_err err = {{0}};
    void *p = NULL;
    ck_assert_msg(cpu_heap_alloc(h, bytes, &p, &err) == TP_OK, "alloc %zu: %s", bytes, err.msg);
    return p;
}

static void put(cpu_heap *h, void *p)
{
    tp_err err = {{0}};
    ck_assert_msg(cpu_heap_free(h, p, &err) == TP_OK, "%s", err.msg);
}

START_TEST(alignment)
{
    /* region starts 5 bytes past an aligned address: blocks start at the
     * next boundary and never leave the region */
    size_t skew = A - 5, bytes = 10 * A + 17;
    cpu_heap *h = mk(skew, bytes);
    ck_assert_uint_eq(cpu_heap_capacity(h), 10 * A); /* 5 skipped, the 17-byte tail too */
    size_t sizes[4] = {1, A, A + 1, 3 * A - 7};
    char *prev_end = NULL;
    for (int i = 0; i < 4; i++) {
        char *p = get(h, sizes[i]);
        ck_assert_uint_eq((uintptr_t)p % A, 0);
        ck_assert(p >= region + skew && p + sizes[i] <= region + skew + bytes);
        ck_assert(prev_end == NULL || p >= prev_end); /* no overlap */
        prev_end = p + sizes[i];
        memset(p, 0xab, sizes[i]);
    }
    ck_assert_uint_eq(cpu_heap_used(h), (1 + 1 + 2 + 3) * A);
    cpu_heap_destroy(h);
}
END_TEST

START_TEST(reuse_after_free)
{
    cpu_heap *h = mk(0, 16 * A);
    void *a = get(h, 2 * A), *b = get(h, 2 * A), *c = get(h, 2 * A);
    put(h, b);
    ck_assert_ptr_eq(get(h, 2 * A), b);   /* first fit: the hole */
    put(h, a);
    ck_assert_ptr_eq(get(h, A), a);       /* a smaller block splits the hole */
    ck_assert_ptr_eq(get(h, A), (char *)a + A);
    ck_assert_ptr_eq(get(h, 1), (char *)c + 2 * A); /* hole full: after c */
    cpu_heap_destroy(h);
}
END_TEST

START_TEST(coalescing)
{
    cpu_heap *h = mk(0, 8 * A);
    void *p[8];
    for (int i = 0; i < 8; i++)
        p[i] = get(h, A);
    ck_assert_int_eq(cpu_heap_blocks(h), 8);
    ck_assert_uint_eq(cpu_heap_largest_free(h), 0);
    /* free in an order that merges with the next, the previous, and both */
    put(h, p[1]);
    put(h, p[2]); /* merges with previous */
    put(h, p[5]);
    put(h, p[4]); /* merges with next */
    ck_assert_uint_eq(cpu_heap_largest_free(h), 2 * A);
    put(h, p[3]); /* merges both sides: 1..5 */
    ck_assert_uint_eq(cpu_heap_largest_free(h), 5 * A);
    ck_assert_int_eq(cpu_heap_blocks(h), 4); /* 0, free 1..5, 6, 7 */
    void *big = get(h, 5 * A);
    ck_assert_ptr_eq(big, p[1]);
    put(h, big);
    put(h, p[0]);
    put(h, p[7]);
    put(h, p[6]);
    ck_assert_int_eq(cpu_heap_blocks(h), 1);
    ck_assert_uint_eq(cpu_heap_used(h), 0);
    ck_assert_ptr_eq(get(h, 8 * A), p[0]); /* the whole region again */
    cpu_heap_destroy(h);
}
END_TEST

START_TEST(full)
{
    cpu_heap *h = mk(0, 4 * A);
    tp_err err = {{0}};
    void *p = (void *)1;
    ck_assert_int_eq(cpu_heap_alloc(h, 4 * A + 1, &p, &err), TP_NOMEM);
    ck_assert_ptr_null(p);
    ck_assert_msg(strstr(err.msg, "heap of 256 bytes cannot fit 257 more bytes"), "%s", err.msg);
    void *a = get(h, A), *b = get(h, 2 * A);
    (void)b;
    ck_assert_int_eq(cpu_heap_alloc(h, 2 * A, &p, &err), TP_NOMEM);
    ck_assert_msg(strstr(err.msg, "192 in use") && strstr(err.msg, "largest free block 64"), "%s", err.msg);
    /* fragmented: 2 free blocks of A that are not adjacent */
    put(h, a);
    ck_assert_int_eq(cpu_heap_alloc(h, 2 * A, &p, &err), TP_NOMEM);
    /* sizes near SIZE_MAX do not wrap around into a small request */
    ck_assert_int_eq(cpu_heap_alloc(h, SIZE_MAX, &p, &err), TP_NOMEM);
    ck_assert_int_eq(cpu_heap_alloc(h, SIZE_MAX - A + 2, &p, &err), TP_NOMEM);
    cpu_heap_destroy(h);
    /* a region without one aligned block */
    ck_assert_ptr_null(cpu_heap_create(region + 1, A, &err));
    ck_assert_msg(strstr(err.msg, "no 64-byte aligned block"), "%s", err.msg);
    ck_assert_ptr_null(cpu_heap_create(NULL, 1 << 20, &err));
}
END_TEST

START_TEST(zero_bytes)
{
    cpu_heap *h = mk(0, 4 * A);
    void *a = get(h, 0), *b = get(h, 0);
    ck_assert_ptr_ne(a, b);
    ck_assert_uint_eq((uintptr_t)a % A, 0);
    ck_assert_uint_eq(cpu_heap_used(h), 2 * A);
    put(h, a);
    put(h, b);
    ck_assert_int_eq(cpu_heap_blocks(h), 1);
    cpu_heap_destroy(h);
}
END_TEST

START_TEST(bad_free)
{
    cpu_heap *h = mk(0, 8 * A);
    tp_err err = {{0}};
    char *a = get(h, 2 * A);
    ck_assert_int_eq(cpu_heap_free(h, a + A, &err), TP_INVALID); /* interior */
    ck_assert_msg(strstr(err.msg, "not a live block"), "%s", err.msg);
    ck_assert_int_eq(cpu_heap_free(h, a + 4 * A, &err), TP_INVALID); /* free block */
    ck_assert_int_eq(cpu_heap_free(h, region + sizeof region - 1, &err), TP_INVALID); /* outside */
    ck_assert_msg(strstr(err.msg, "not in the region"), "%s", err.msg);
    put(h, a);
    ck_assert_int_eq(cpu_heap_free(h, a, &err), TP_INVALID); /* double free */
    ck_assert_int_eq(cpu_heap_blocks(h), 1);
    cpu_heap_destroy(h);
}
END_TEST

/* Random alloc/free against a shadow: blocks never overlap, stay in the
 * region, and a fully freed heap is one block again. */
START_TEST(random_ops)
{
    size_t bytes = 64 * 1024;
    cpu_heap *h = mk(0, bytes);
    enum { N = 64 };
    char *p[N] = {0};
    size_t sz[N] = {0};
    unsigned seed = 7;
    for (int it = 0; it < 20000; it++) {
        seed = seed * 1103515245u + 12345u;
        int k = (int)((seed >> 16) % N);
        if (p[k]) {
            size_t i = 0;
            while (i < sz[k] && (unsigned char)p[k][i] == (unsigned)k)
                i++;
            ck_assert_msg(i == sz[k], "block %d overwritten at byte %zu", k, i);
            put(h, p[k]);
            p[k] = NULL;
            continue;
        }
        size_t want = (seed >> 4) % 3000;
        tp_err err;
        void *q;
        if (cpu_heap_alloc(h, want, &q, &err) != TP_OK)
            continue; /* full or fragmented: fine */
        p[k] = q;
        sz[k] = want;
        ck_assert(p[k] >= region && p[k] + want <= region + bytes);
        memset(p[k], k, want);
    }
    for (int k = 0; k < N; k++)
        if (p[k])
            put(h, p[k]);
    ck_assert_int_eq(cpu_heap_blocks(h), 1);
    ck_assert_uint_eq(cpu_heap_used(h), 0);
    cpu_heap_destroy(h);
}
END_TEST

static Suite *heap_suite(void)
{
    Suite *s = suite_create("cpu_heap");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, alignment);
    tcase_add_test(tc, reuse_after_free);
    tcase_add_test(tc, coalescing);
    tcase_add_test(tc, full);
    tcase_add_test(tc, zero_bytes);
    tcase_add_test(tc, bad_free);
    tcase_add_test(tc, random_ops);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(heap_suite)
