/* numtext_exhaustive.c — `make test-numtext-exhaustive`: every one of the
 * 2^32 FP32 bit patterns that is finite goes through tp_numtext_f32 and
 * must (1) read back through tp_numtext_parse_f32 bit-identical and (2)
 * have exactly the digits and exponent of the C++ standard library's
 * shortest round-trip form (numtext_oracle.cc): fewest digits, and the
 * nearest such decimal. tpserve writes FP32 with its own Schubfach
 * (server/numtext.c); this is what holds it to the library. (3) The list
 * writer (tp_numtext_f32_list, what JSON answers use) spells every run of
 * 256 finite patterns as the single-value writer does. (4) The array
 * reader (tp_numtext_read_f32) reads back bit-identical whatever it
 * takes. Split over all cores; prints the count and the time. Exits 1 at
 * the first failure.
 * Optional argument: how many patterns (from 0), for a quick partial run. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "numtext.h"

int numtext_oracle_f32(float v, char *digits, int *exp10);

/* The significant digits and decimal exponent of a writer's text: "-0.00123"
 * -> "123", -3; "1.5e-7" -> "15", -7. Zero: "0", 0. */
static int text_digits(const char *s, size_t n, char *digits, int *exp10)
{
    char raw[TP_NUMTEXT_MAX];
    int m = 0, before_point = -1;
    size_t i = s[0] == '-';
    for (; i < n && s[i] != 'e'; i++) {
        if (s[i] == '.')
            before_point = m;
        else
            raw[m++] = s[i];
    }
    if (before_point < 0)
        before_point = m;
    int lead = 0;
    while (lead < m && raw[lead] == '0')
        lead++;
    int nd = m - lead;
    while (nd > 0 && raw[lead + nd - 1] == '0')
        nd--;
    if (nd == 0) {
        digits[0] = '0';
        *exp10 = 0;
        return 1;
    }
    memcpy(digits, raw + lead, (size_t)nd);
    int e = 0, e_neg = i + 1 < n && s[i + 1] == '-';
    for (i += 1 + e_neg; i < n; i++) /* the writer leaves bytes after the text: stop at n */
        e = e * 10 + (s[i] - '0');
    *exp10 = before_point - 1 - lead + (e_neg ? -e : e);
    return nd;
}

typedef struct {
    uint64_t from, to, checked;
    int failed;
} slice;

enum { RUN = 256 };

/* A run of finite patterns and their single-value texts joined by ','. */
typedef struct {
    uint32_t bits[RUN];
    char text[RUN * (TP_NUMTEXT_MAX + 1)], list[RUN * (TP_NUMTEXT_MAX + 1)];
    size_t n, len;
} run;

/* The list writer over the run against its joined texts; empties it. */
static int check_run(run *r)
{
    size_t written, len = tp_numtext_f32_list(r->bits, r->n, r->list, &written);
    int ok = written == r->n && len == r->len && memcmp(r->list, r->text, len) == 0;
    if (!ok)
        fprintf(stderr, "FAIL: the list writer from %08x (%zu values): '%.*s' against '%.*s'\n",
                r->bits[0], r->n, (int)len, r->list, (int)r->len, r->text);
    r->n = r->len = 0;
    return ok;
}

static void *run_slice(void *arg)
{
    slice *s = arg;
    char buf[TP_NUMTEXT_MAX + 1];
    static __thread run r; /* 17 KB: off the thread's stack */
    for (uint64_t b = s->from; b < s->to && !s->failed; b++) {
        uint32_t u = (uint32_t)b;
        if ((u & 0x7f800000u) == 0x7f800000u)
            continue;
        float f, back;
        memcpy(&f, &u, 4);
        size_t n = tp_numtext_f32(f, buf);
        back = tp_numtext_parse_f32(buf, n);
        /* the array's reader, which may read ahead (buf has the room), on
         * what it takes: the short, vector and wide readers' paths */
        float fast = 0;
        if (n + TP_NUMTEXT_READ_AHEAD > sizeof buf ||
            (tp_numtext_read_f32(buf, n, &fast) && memcmp(&fast, &f, 4) != 0)) {
            buf[n] = '\0';
            fprintf(stderr, "FAIL: %08x -> '%s': no room to read ahead, or reads back as %a through "
                    "tp_numtext_read_f32\n", u, buf, fast);
            s->failed = 1;
        }
        char got[TP_NUMTEXT_MAX], want[TP_NUMTEXT_MAX] = "0";
        int got_exp, want_exp = 0, want_n = 1;
        int got_n = text_digits(buf, n, got, &got_exp);
        if (u & 0x7fffffffu)
            want_n = numtext_oracle_f32(f, want, &want_exp);
        if (memcmp(&back, &f, 4) != 0 || got_n != want_n || got_exp != want_exp || memcmp(got, want, (size_t)got_n)) {
            buf[n] = '\0';
            fprintf(stderr, "FAIL: %08x -> '%s' (the library: %.*se%d)\n", u, buf, want_n, want, want_exp);
            s->failed = 1;
        }
        s->checked++;
        if (r.n)
            r.text[r.len++] = ',';
        memcpy(r.text + r.len, buf, n);
        r.len += n;
        r.bits[r.n++] = u;
        if (r.n == RUN && !check_run(&r))
            s->failed = 1;
    }
    if (r.n && !check_run(&r))
        s->failed = 1;
    return NULL;
}

int main(int argc, char **argv)
{
    uint64_t total = argc > 1 ? strtoull(argv[1], NULL, 0) : (uint64_t)1 << 32;
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    int n = ncpu > 0 && ncpu < 64 ? (int)ncpu : 1;
    slice s[64];
    pthread_t th[64];
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) {
        s[i] = (slice){total * (uint64_t)i / (uint64_t)n, total * (uint64_t)(i + 1) / (uint64_t)n, 0, 0};
        pthread_create(&th[i], NULL, run_slice, &s[i]);
    }
    uint64_t checked = 0;
    int failed = 0;
    for (int i = 0; i < n; i++) {
        pthread_join(th[i], NULL);
        checked += s[i].checked;
        failed |= s[i].failed;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double sec = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
    printf("numtext FP32 round trip, std::to_chars digits and the list writer: %llu finite patterns of %llu checked on %d threads in %.1f s: %s\n",
           (unsigned long long)checked, (unsigned long long)total, n, sec, failed ? "FAILED" : "all exact");
    return failed;
}
