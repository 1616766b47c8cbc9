/* numtext_exhaustive.c — `make test-numtext-exhaustive`: every one of the
 * 2^32 FP32 bit patterns that is finite goes through tp_numtext_f32 and back
 * through tp_numtext_parse_f32 and must come back bit-identical, in at most 9
 * significant digits. Split over all cores; prints the count and the time.
 * Exits 1 at the first failure. Optional argument: how many patterns (from
 * 0), for a quick partial run. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "numtext.h"

typedef struct {
    uint64_t from, to, checked;
    int failed;
} slice;

static void *run_slice(void *arg)
{
    slice *s = arg;
    char buf[TP_NUMTEXT_MAX + 1];
    for (uint64_t b = s->from; b < s->to && !s->failed; b++) {
        uint32_t u = (uint32_t)b;
        if ((u & 0x7f800000u) == 0x7f800000u)
            continue;
        float f, back;
        memcpy(&f, &u, 4);
        size_t n = tp_numtext_f32(f, buf);
        back = tp_numtext_parse_f32(buf, n);
        if (memcmp(&back, &f, 4) != 0 || tp_numtext_digits(buf, n) > 9) {
            buf[n] = '\0';
            fprintf(stderr, "FAIL: %08x -> '%s'\n", u, buf);
            s->failed = 1;
        }
        s->checked++;
    }
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
    printf("numtext FP32 round trip: %llu finite patterns of %llu checked on %d threads in %.1f s: %s\n",
           (unsigned long long)checked, (unsigned long long)total, n, sec, failed ? "FAILED" : "all exact");
    return failed;
}
