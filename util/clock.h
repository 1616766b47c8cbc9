/* clock.h — the monotonic clock, read one way by every module (it was
 * spelled six times over: nanoseconds, whole and fractional milliseconds,
 * seconds). */
#ifndef TP_CLOCK_H
#define TP_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline int64_t tp_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Whole milliseconds, for deadlines kept as integers. */
static inline int64_t tp_now_ms_int(void) { return tp_now_ns() / 1000000; }

/* A double keeps nanoseconds exact for over 100 days of uptime. */
static inline double tp_now_ms(void) { return (double)tp_now_ns() / 1e6; }
static inline double tp_now_s(void) { return (double)tp_now_ns() / 1e9; }

#endif
