/* fiber.c — fibers on ucontext: makecontext gives each one its stack, and
 * swapcontext moves the thread from one to the next. glibc's swapcontext
 * also saves and restores the signal mask (one rt_sigprocmask call): a few
 * hundred nanoseconds, against the tens of microseconds of the thread
 * wake-up it replaces; a hand-written switch would save that but not be
 * portable C.
 *
 * Under AddressSanitizer every switch is announced
 * (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), or
 * ASan would take a fiber's stack for a corrupted one of the thread's. */
#include "fiber.h"

#include <stdlib.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define TP_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TP_FIBER_ASAN 1
#endif
#endif
#ifdef TP_FIBER_ASAN
#include <sanitizer/common_interface_defs.h>
#endif

#define DEFAULT_STACK (8u << 20)

typedef struct {
    ucontext_t uc;
    char *map;          /* guard page + stack */
    size_t map_bytes;
    int ended;
} fiber;

struct tp_fibers {
    int n;
    size_t guard;       /* bytes below each stack that fault (one page) */
    fiber *fib;
    ucontext_t home;    /* the thread's own context while the fibers run */
    const void *home_bottom; /* the thread's stack, for ASan (learned on the first switch) */
    size_t home_size;
    int current, n_ended;
    tp_fiber_fn fn;
    void *ctx;
};

/* The run in progress on this thread, NULL outside one. */
static _Thread_local tp_fibers *running;

tp_status tp_fibers_create(int n, size_t stack_bytes, tp_fibers **out, tp_err *err)
{
    if (n < 1)
        return tp_fail(err, TP_INVALID, "fibers: %d fibers", n);
    tp_fibers *f = calloc(1, sizeof *f);
    if (!f || !(f->fib = calloc((size_t)n, sizeof *f->fib))) {
        free(f);
        return tp_fail(err, TP_NOMEM, "fibers: out of memory");
    }
    f->n = n;
    size_t page = f->guard = (size_t)sysconf(_SC_PAGESIZE);
    size_t bytes = ((stack_bytes ? stack_bytes : DEFAULT_STACK) + page - 1) / page * page + page;
    for (int i = 0; i < n; i++) {
        char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK,
                       -1, 0);
        if (m == MAP_FAILED || mprotect(m, page, PROT_NONE) != 0) {
            if (m != MAP_FAILED)
                munmap(m, bytes);
            tp_fibers_free(f);
            return tp_fail(err, TP_NOMEM, "fibers: cannot map a %zu-byte stack for fiber %d", bytes, i);
        }
        f->fib[i].map = m;
        f->fib[i].map_bytes = bytes;
    }
    *out = f;
    return TP_OK;
}

void tp_fibers_free(tp_fibers *f)
{
    if (!f)
        return;
    for (int i = 0; i < f->n; i++)
        if (f->fib[i].map)
            munmap(f->fib[i].map, f->fib[i].map_bytes);
    free(f->fib);
    free(f);
}

#ifdef TP_FIBER_ASAN
/* The stack a context runs on, for ASan's bookkeeping. */
static void stack_of(const tp_fibers *f, const ucontext_t *to, const void **bottom, size_t *size)
{
    *bottom = f->home_bottom;
    *size = f->home_size;
    for (int i = 0; i < f->n; i++)
        if (to == &f->fib[i].uc) {
            *bottom = f->fib[i].uc.uc_stack.ss_sp;
            *size = f->fib[i].uc.uc_stack.ss_size;
        }
}
#endif

/* Moves the thread from `from` to `to`; `leaving` when from will never run
 * again (a fiber that returned), so ASan may drop its fake stack. */
static void switch_context(tp_fibers *f, ucontext_t *from, ucontext_t *to, int leaving)
{
#ifdef TP_FIBER_ASAN
    const void *bottom;
    size_t size;
    void *fake = NULL;
    stack_of(f, to, &bottom, &size);
    __sanitizer_start_switch_fiber(leaving ? NULL : &fake, bottom, size);
    swapcontext(from, to);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    (void)f;
    (void)leaving;
    swapcontext(from, to);
#endif
}

/* The fiber after `i` (round robin) that has not returned, or -1. */
static int next_live(const tp_fibers *f, int i)
{
    for (int k = 1; k <= f->n; k++) {
        int j = (i + k) % f->n;
        if (!f->fib[j].ended)
            return j;
    }
    return -1;
}

static void fiber_main(void)
{
    tp_fibers *f = running;
#ifdef TP_FIBER_ASAN
    /* The first fiber is entered from the thread's stack: learn its bounds
     * so the last switch home can name them. */
    const void *from_bottom;
    size_t from_size;
    __sanitizer_finish_switch_fiber(NULL, &from_bottom, &from_size);
    if (f->current == 0) {
        f->home_bottom = from_bottom;
        f->home_size = from_size;
    }
#endif
    int i = f->current;
    f->fn(f->ctx, i);
    f->fib[i].ended = 1;
    f->n_ended++;
    int j = next_live(f, i);
    f->current = j;
    switch_context(f, &f->fib[i].uc, j < 0 ? &f->home : &f->fib[j].uc, 1);
    /* never resumed: a context that returned is not switched to again */
}

/* A fresh context at fiber_main on x's stack (above its guard page). Its
 * own function: getcontext returns twice, which no loop variable survives. */
static void start_fiber(tp_fibers *f, fiber *x)
{
    getcontext(&x->uc);
    x->uc.uc_stack.ss_sp = x->map + f->guard;
    x->uc.uc_stack.ss_size = x->map_bytes - f->guard;
    x->uc.uc_link = &f->home; /* unused: fiber_main switches away itself */
    x->ended = 0;
    makecontext(&x->uc, fiber_main, 0);
}

void tp_fibers_run(tp_fibers *f, tp_fiber_fn fn, void *ctx)
{
    f->fn = fn;
    f->ctx = ctx;
    f->n_ended = 0;
    for (int i = 0; i < f->n; i++)
        start_fiber(f, &f->fib[i]);
    f->current = 0;
    running = f;
    switch_context(f, &f->home, &f->fib[0].uc, 0);
    running = NULL;
}

void tp_fiber_yield(void)
{
    tp_fibers *f = running;
    if (!f)
        return;
    int i = f->current, j = next_live(f, i);
    if (j == i)
        return;
    f->current = j;
    switch_context(f, &f->fib[i].uc, &f->fib[j].uc, 0);
}

int tp_fiber_running(void) { return running != NULL; }

int tp_fiber_ended(void) { return running ? running->n_ended : 0; }
