/* test_thread_slot.c — util/thread_slot.h: each thread gets its own zeroed
 * object, the same one on every call, freed through the slot's destroy
 * function when the thread ends; threads racing to first use all get one.
 * And util/buf_pool.h, built on it: a thread's buffers come back to it,
 * aligned, up to a bound, and stay its own. */
#include <pthread.h>
#include <stdatomic.h>

#include <stdint.h>
#include <string.h>

#include "buf_pool.h"
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

static void *take_one(void *arg)
{
    *(void **)arg = tp_buf_pool_take();
    ck_assert_int_eq(tp_buf_pool_spares(), 0); /* another thread's spares are not this one's */
    return NULL;
}

START_TEST(buffer_pool)
{
    enum { MANY = 40 };
    void *b[MANY];
    for (int i = 0; i < MANY; i++) {
        b[i] = tp_buf_pool_take();
        ck_assert_ptr_nonnull(b[i]);
        ck_assert_uint_eq((uintptr_t)b[i] % TP_BUF_POOL_ALIGN, 0);
        memset(b[i], 0xa5, TP_BUF_POOL_SIZE); /* all of it is ours (ASan checks) */
    }
    int before = tp_buf_pool_spares();
    for (int i = 0; i < MANY; i++)
        tp_buf_pool_give(b[i]);
    tp_buf_pool_give(NULL);
    /* kept up to the bound; the rest freed (LeakSanitizer would see them) */
    int kept = tp_buf_pool_spares();
    ck_assert_int_gt(kept, before);
    ck_assert_int_lt(kept, MANY);
    /* the last one given is the next one taken */
    void *again = tp_buf_pool_take();
    ck_assert_ptr_eq(again, b[kept - before - 1]);
    /* a buffer taken on another thread and given here joins these spares */
    void *theirs;
    pthread_t th;
    pthread_create(&th, NULL, take_one, &theirs);
    pthread_join(th, NULL);
    tp_buf_pool_give(again);
    tp_buf_pool_give(theirs); /* full: freed */
    ck_assert_int_eq(tp_buf_pool_spares(), kept);
}
END_TEST

static Suite *thread_slot_suite(void)
{
    Suite *s = suite_create("thread_slot");
    TCase *tc = tcase_create("slots");
    tcase_add_test(tc, per_thread_objects);
    tcase_add_test(tc, buffer_pool);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(thread_slot_suite)
