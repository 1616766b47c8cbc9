/* test_thread_slot.c — util/thread_slot.h: each thread gets its own zeroed
 * object, the same one on every call, freed through the slot's destroy
 * function when the thread ends; threads racing to first use all get one. */
#include <pthread.h>
#include <stdatomic.h>

#include "check_main.h"
#include "thread_slot.h"

typedef struct {
    int uses;
    char pad[1000];
} obj;

static atomic_int destroyed;

static void destroy(void *p)
{
    atomic_fetch_add(&destroyed, 1);
    free(p);
}

static tp_thread_slot slot = TP_THREAD_SLOT(destroy, sizeof(obj));

static void *use_slot(void *arg)
{
    obj *o = tp_thread_slot_get(&slot);
    ck_assert_ptr_nonnull(o);
    ck_assert_int_eq(o->uses, 0); /* zeroed, and no other thread's */
    ck_assert_int_eq(o->pad[999], 0);
    o->uses++;
    ck_assert_ptr_eq(tp_thread_slot_get(&slot), o);
    *(obj **)arg = o;
    return NULL;
}

START_TEST(per_thread_objects)
{
    enum { N = 8 };
    pthread_t th[N];
    obj *got[N];
    for (int i = 0; i < N; i++) /* all at once: the key is created by one of them */
        pthread_create(&th[i], NULL, use_slot, &got[i]);
    for (int i = 0; i < N; i++)
        pthread_join(th[i], NULL);
    ck_assert_int_eq(atomic_load(&destroyed), N);
    /* this thread's own, kept across calls */
    obj *mine = tp_thread_slot_get(&slot);
    mine->uses = 7;
    ck_assert_int_eq(((obj *)tp_thread_slot_get(&slot))->uses, 7);
}
END_TEST

static Suite *thread_slot_suite(void)
{
    Suite *s = suite_create("thread_slot");
    TCase *tc = tcase_create("slots");
    tcase_add_test(tc, per_thread_objects);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(thread_slot_suite)
