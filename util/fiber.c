/* fiber.c — fibers: each has its own stack, and a switch moves the thread
 * from one to the next.
 *
 * On x86-64 a switch is a few instructions of our own (fctx_switch below:
 * the callee-saved registers and the FP control words pushed on the old
 * stack, the stack pointer swapped, popped from the new one). glibc's
 * ucontext, used before and still elsewhere, also saves and restores the
 * signal mask at every swapcontext and getcontext: an rt_sigprocmask system
 * call each, 3% of the server's CPU at 32 connections (two fibers a step,
 * several switches each), for a mask no fiber changes.
 *
 * Under AddressSanitizer every switch is announced
 * (__sanitizer_start_switch_fiber / __sanitizer_finish_switch_fiber), or
 * ASan would take a fiber's stack for a corrupted one of the thread's. */
#include "fiber.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#if defined(__SANITIZE_ADDRESS__)
#define TP_FIBER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TP_FIBER_ASAN 1
#endif
#endif
#ifdef TP_FIBER_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

static void fiber_main(void);

#if defined(__x86_64__)
/* A context is its saved stack pointer; everything else is on that stack. */
typedef struct {
    void *sp;
} fctx;

/* fctx_switch(&from->sp, to->sp): System V x86-64 keeps rbx, rbp, r12-r15,
 * MXCSR's control bits and the x87 control word across calls; the rest the
 * caller of a function has already saved. */
void tp_fctx_switch(void **save_sp, void *load_sp);
__asm__(".text\n"
        ".globl tp_fctx_switch\n"
        ".type tp_fctx_switch, @function\n"
        "tp_fctx_switch:\n"
        "    pushq %rbp\n"
        "    pushq %rbx\n"
        "    pushq %r12\n"
        "    pushq %r13\n"
        "    pushq %r14\n"
        "    pushq %r15\n"
        "    subq $8, %rsp\n"
        "    stmxcsr (%rsp)\n"
        "    fnstcw 4(%rsp)\n"
        "    movq %rsp, (%rdi)\n"
        "    movq %rsi, %rsp\n"
        "    ldmxcsr (%rsp)\n"
        "    fldcw 4(%rsp)\n"
        "    addq $8, %rsp\n"
        "    popq %r15\n"
        "    popq %r14\n"
        "    popq %r13\n"
        "    popq %r12\n"
        "    popq %rbx\n"
        "    popq %rbp\n"
        "    ret\n"
        ".size tp_fctx_switch, .-tp_fctx_switch\n");

static void fctx_swap(fctx *from, fctx *to) { tp_fctx_switch(&from->sp, to->sp); }

/* A context that starts fiber_main on [lo, lo + size): the frame
 * tp_fctx_switch pops (control words as this thread's, zero registers),
 * returning into fiber_main as if called from an address 0 that it never
 * returns to; the stack 16-byte aligned at that call as the ABI wants. */
static void fctx_start(fctx *c, char *lo, size_t size)
{
    uintptr_t top = ((uintptr_t)lo + size) & ~(uintptr_t)15;
    uint64_t *sp = (uint64_t *)top;
    *--sp = 0;                                /* fiber_main's return address */
    *--sp = (uint64_t)(uintptr_t)fiber_main; /* tp_fctx_switch's */
    for (int r = 0; r < 6; r++)
        *--sp = 0; /* rbp rbx r12 r13 r14 r15 */
    uint32_t mxcsr = 0;
    uint16_t fpcw = 0;
    __asm__ volatile("stmxcsr %0\n\tfnstcw %1" : "=m"(mxcsr), "=m"(fpcw));
    *--sp = (uint64_t)mxcsr | (uint64_t)fpcw << 32;
    c->sp = sp;
}
#else
#include <ucontext.h>
/* Elsewhere: glibc's ucontext (a signal-mask system call per switch). */
typedef struct {
    ucontext_t uc;
} fctx;

static void fctx_swap(fctx *from, fctx *to) { swapcontext(&from->uc, &to->uc); }

static void fctx_start(fctx *c, char *lo, size_t size)
{
    getcontext(&c->uc);
    c->uc.uc_stack.ss_sp = lo;
    c->uc.uc_stack.ss_size = size;
    c->uc.uc_link = NULL; /* unused: fiber_main switches away itself */
    makecontext(&c->uc, fiber_main, 0);
}
#endif

#define DEFAULT_STACK (8u << 20)

typedef struct {
    fctx ctx;
    char *map;          /* guard page + stack */
    size_t map_bytes;
    int ended;
} fiber;

struct tp_fibers {
    int n;
    size_t guard;       /* bytes below each stack that fault (one page) */
    fiber *fib;
    fctx home;          /* the thread's own context while the fibers run */
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
static void stack_of(const tp_fibers *f, const fctx *to, const void **bottom, size_t *size)
{
    *bottom = f->home_bottom;
    *size = f->home_size;
    for (int i = 0; i < f->n; i++)
        if (to == &f->fib[i].ctx) {
            *bottom = f->fib[i].map + f->guard;
            *size = f->fib[i].map_bytes - f->guard;
        }
}
#endif

/* Moves the thread from `from` to `to`; `leaving` when from will never run
 * again (a fiber that returned), so ASan may drop its fake stack. */
static void switch_context(tp_fibers *f, fctx *from, fctx *to, int leaving)
{
#ifdef TP_FIBER_ASAN
    const void *bottom;
    size_t size;
    void *fake = NULL;
    stack_of(f, to, &bottom, &size);
    __sanitizer_start_switch_fiber(leaving ? NULL : &fake, bottom, size);
    fctx_swap(from, to);
    __sanitizer_finish_switch_fiber(fake, NULL, NULL);
#else
    (void)f;
    (void)leaving;
    fctx_swap(from, to);
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
    switch_context(f, &f->fib[i].ctx, j < 0 ? &f->home : &f->fib[j].ctx, 1);
    /* never resumed: a context that returned is not switched to again */
}

/* A fresh context at fiber_main on x's stack (above its guard page). */
static void start_fiber(tp_fibers *f, fiber *x)
{
    x->ended = 0;
#ifdef TP_FIBER_ASAN
    /* the last run's frames never returned, so ASan still marks their
     * redzones: clear the top, where fctx_start writes the first frame
     * (instrumented code re-marks each frame it lays below) */
    __asan_unpoison_memory_region(x->map + x->map_bytes - 4096, 4096);
#endif
    fctx_start(&x->ctx, x->map + f->guard, x->map_bytes - f->guard);
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
    switch_context(f, &f->home, &f->fib[0].ctx, 0);
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
    switch_context(f, &f->fib[i].ctx, &f->fib[j].ctx, 0);
}

int tp_fiber_running(void) { return running != NULL; }

int tp_fiber_ended(void) { return running ? running->n_ended : 0; }
