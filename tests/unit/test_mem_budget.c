/* test_mem_budget.c — the memory budget: takes past the limit are refused
 * (413 when one request alone passes it, 503 when the total would), what
 * was refused is never counted, releases give everything back, threads
 * taking at once never hold more than the limit together, and the default
 * is read from a cgroup v1 or v2 hierarchy (the smallest limit on the way
 * to its root) with a floor. */
#include <check.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check_main.h"
#include "mem_budget.h"
#include "testutil.h"

START_TEST(takes_refusals_and_releases)
{
    tp_mem_budget *b = tp_mem_budget_create(1000);
    tp_mem_hold a = {b, 0, TP_MEM_OK}, c = {b, 0, TP_MEM_OK};
    ck_assert_int_eq(tp_mem_take(&a, 600), TP_MEM_OK);
    ck_assert_int_eq(tp_mem_take(&c, 300), TP_MEM_OK);
    /* c alone could hold 500 more, but the total cannot: 503 */
    ck_assert_int_eq(tp_mem_take(&c, 200), TP_MEM_FULL);
    ck_assert_int_eq(c.refused, TP_MEM_FULL);
    ck_assert_int_eq(tp_mem_budget_used(b), 900);
    /* a would hold 1001 alone: it never fits, 413 */
    ck_assert_int_eq(tp_mem_take(&a, 401), TP_MEM_TOO_LARGE);
    ck_assert_int_eq(tp_mem_budget_used(b), 900);
    ck_assert_int_eq(tp_mem_take(&c, -100), TP_MEM_OK); /* given back */
    ck_assert_int_eq(c.held, 200);
    ck_assert_int_eq(tp_mem_take(&c, 200), TP_MEM_OK);
    ck_assert_int_eq(tp_mem_budget_used(b), 1000);
    uint64_t full, big;
    tp_mem_budget_refusals(b, &full, &big);
    ck_assert_uint_eq(full, 1);
    ck_assert_uint_eq(big, 1);
    tp_mem_release(&a);
    tp_mem_release(&c);
    tp_mem_release(&c); /* again: nothing */
    ck_assert_int_eq(tp_mem_budget_used(b), 0);
    /* the message names the budget and what asked */
    tp_err e;
    tp_mem_hold d = {b, 0, TP_MEM_OK};
    ck_assert_int_eq(tp_mem_take_for(&d, 2000, "request body", &e), TP_UNAVAILABLE);
    ck_assert_ptr_nonnull(strstr(e.msg, "request body"));
    ck_assert_ptr_nonnull(strstr(e.msg, "max_memory_mb"));
    /* no budget: everything fits, nothing is counted */
    tp_mem_hold none = {0};
    ck_assert_int_eq(tp_mem_take(&none, INT64_C(1) << 60), TP_MEM_OK);
    tp_mem_budget_set_limit(b, 10);
    ck_assert_int_eq(tp_mem_budget_limit(b), 10);
    tp_mem_budget_free(b);
}
END_TEST

#define TAKERS 4
#define ROUNDS 200000
static tp_mem_budget *shared;
static _Atomic int64_t holding, over;

static void *taker(void *arg)
{
    (void)arg;
    for (int i = 0; i < ROUNDS; i++) {
        tp_mem_hold h = {shared, 0, TP_MEM_OK};
        if (tp_mem_take(&h, 300) != TP_MEM_OK)
            continue;
        if (atomic_fetch_add(&holding, 300) + 300 > 1000)
            atomic_fetch_add(&over, 1);
        atomic_fetch_sub(&holding, 300);
        tp_mem_release(&h);
    }
    return NULL;
}

/* Takes are one add, undone when it passed: a refused take may show in
 * the total for an instant, but what the takers hold together never
 * passes the limit (at most 3 of 300 in 1000), and everything comes back. */
START_TEST(concurrent_takes_stay_within_the_limit)
{
    shared = tp_mem_budget_create(1000);
    pthread_t t[TAKERS];
    for (int i = 0; i < TAKERS; i++)
        pthread_create(&t[i], NULL, taker, NULL);
    for (int i = 0; i < TAKERS; i++)
        pthread_join(t[i], NULL);
    ck_assert_int_eq(tp_mem_budget_used(shared), 0);
    uint64_t full, big;
    tp_mem_budget_refusals(shared, &full, &big);
    ck_assert_uint_eq(big, 0);
    ck_assert_int_eq(atomic_load(&over), 0);
    tp_mem_budget_free(shared);
}
END_TEST

static void put(const char *dir, const char *rel, const char *name, const char *text)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s", dir, rel);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "mkdir -p '%s'", path);
    ck_assert_int_eq(system(cmd), 0);
    snprintf(path, sizeof path, "%s%s/%s", dir, rel, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(cgroup_limits_v1_and_v2)
{
    char dir[] = "/tmp/tp_cgroup_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char self[600];
    snprintf(self, sizeof self, "%s/self", dir);
    /* v1: the memory controller's path, its parent's limit smaller */
    put(dir, "", "self", "4:memory:/pod/ctr\n3:cpu:/pod/ctr\n0::/\n");
    put(dir, "/memory/pod/ctr", "memory.limit_in_bytes", "9223372036854771712\n");
    put(dir, "/memory/pod", "memory.limit_in_bytes", "536870912\n");
    ck_assert_int_eq(tp_mem_cgroup_limit(self, dir), INT64_C(536870912));
    /* v2 beside it (unified/), smaller still: the smallest wins */
    put(dir, "", "self", "4:memory:/pod/ctr\n0::/pod/ctr\n");
    put(dir, "/unified/pod/ctr", "memory.max", "268435456\n");
    ck_assert_int_eq(tp_mem_cgroup_limit(self, dir), INT64_C(268435456));
    /* v2 alone at the root, "max" on the way */
    char dir2[] = "/tmp/tp_cgroup_XXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir2));
    snprintf(self, sizeof self, "%s/self", dir2);
    put(dir2, "", "self", "0::/a/b\n");
    put(dir2, "/a/b", "memory.max", "max\n");
    ck_assert_int_eq(tp_mem_cgroup_limit(self, dir2), -1);
    put(dir2, "/a", "memory.max", "1073741824\n");
    ck_assert_int_eq(tp_mem_cgroup_limit(self, dir2), INT64_C(1073741824));
    /* a namespaced container sees "/" and its limit at the root */
    put(dir2, "", "self", "0::/\n");
    put(dir2, "", "memory.max", "2147483648\n");
    ck_assert_int_eq(tp_mem_cgroup_limit(self, dir2), INT64_C(2147483648));
    /* nothing readable */
    snprintf(self, sizeof self, "%s/none", dir2);
    ck_assert_int_eq(tp_mem_cgroup_limit(self, dir2), -1);
    tu_rmdir(dir);
    tu_rmdir(dir2);
}
END_TEST

START_TEST(default_budget)
{
    int64_t mib = INT64_C(1) << 20;
    ck_assert_int_eq(tp_mem_default_budget(2048 * mib, 300 * mib, 100 * mib), 1236 * mib);
    ck_assert_int_eq(tp_mem_default_budget(256 * mib, 300 * mib, 100 * mib), TP_MEM_BUDGET_FLOOR);
    ck_assert_int_gt(tp_mem_default_budget(-1, 0, 0), TP_MEM_BUDGET_FLOOR); /* the machine's memory */
    ck_assert_int_gt(tp_mem_resident(), 0);
}
END_TEST

static Suite *mem_budget_suite(void)
{
    Suite *s = suite_create("mem_budget");
    TCase *c = tcase_create("budget");
    tcase_add_test(c, takes_refusals_and_releases);
    tcase_add_test(c, concurrent_takes_stay_within_the_limit);
    tcase_add_test(c, cgroup_limits_v1_and_v2);
    tcase_add_test(c, default_budget);
    suite_add_tcase(s, c);
    return s;
}

TP_CHECK_MAIN(mem_budget_suite)
