/* bench_codec — `make bench-codec`: what the JSON tensor codec costs per
 * request of the example graph (one FP32 input of 256 numbers, one output
 * of 256), in the spellings clients send. Prints a table; never asserts
 * (tests check the codec's answers, this measures its speed).
 *
 * Rows: finding the data arrays in the body (tp_json_data_spans), jansson
 * on the rest of the document (tp_json_load_outside_spans), decoding the
 * array into the tensor (tp_json_tensor_read), and writing an output array
 * (tp_json_tensor_write). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "json_tensor.h"
#include "spin_wait.h"

#define N 256

static double now_ns(void) { return (double)tp_now_ns(); }

/* Values like the example's: uniform in (-1, 1), FP32. */
static void values(float *v)
{
    unsigned s = 12345u;
    for (int i = 0; i < N; i++) {
        s = s * 1103515245u + 12345u;
        v[i] = (float)((s >> 8) & 0xffffff) / (float)(1 << 23) - 1.0f;
    }
}

/* A KServe request body with v spelled by fmt ("%.17g": Python's repr of
 * the float as a double; "%.9g": FP32's round-trip digits; "%.3f": short). */
static size_t body(char *buf, size_t cap, const float *v, const char *fmt)
{
    size_t n = (size_t)snprintf(buf, cap, "{\"inputs\":[{\"name\":\"x\",\"shape\":[1,8,32],\"datatype\":\"FP32\","
                                          "\"data\":[");
    for (int i = 0; i < N; i++) {
        if (i)
            n += (size_t)snprintf(buf + n, cap - n, ", ");
        n += (size_t)snprintf(buf + n, cap - n, fmt, (double)v[i]);
    }
    n += (size_t)snprintf(buf + n, cap - n, "]}]}");
    return n;
}

typedef struct {
    double spans, jansson, read;
} read_cost;

/* Many short rounds: on a noisy VM the best of a few long ones still
 * held a preemption or two, and runs of one build differed by a third. */
#define ROUNDS 100
#define REPS 50

/* ns per request for each stage, best of `rounds` rounds of `reps`. */
static read_cost time_read(const char *b, size_t len, int rounds, int reps)
{
    read_cost best = {1e30, 1e30, 1e30};
    for (int r = 0; r < rounds; r++) {
        double t_spans = 0, t_json = 0, t_read = 0;
        for (int k = 0; k < reps; k++) {
            tp_json_span *sp;
            int n_sp;
            size_t n_values;
            double a = now_ns();
            tp_json_data_spans(b, len, 0, &sp, &n_sp, &n_values);
            double c = now_ns();
            json_error_t jerr;
            json_t *doc = tp_json_load_outside_spans(b, len, sp, n_sp, 0, &jerr);
            double d = now_ns();
            tp_host_tensor t = {.name = "x", .dtype = TP_F32, .ndim = 3, .shape = {1, 8, 32}};
            tp_err err;
            if (!doc || n_sp != 1 || tp_json_tensor_read(b + sp[0].start, sp[0].end - sp[0].start, &t, &err) != TP_OK) {
                fprintf(stderr, "bench_codec: the body does not decode\n");
                exit(1);
            }
            double e = now_ns();
            t_spans += c - a;
            t_json += d - c;
            t_read += e - d;
            free(t.data);
            free(sp);
            json_decref(doc);
        }
        if (t_spans / reps < best.spans)
            best.spans = t_spans / reps;
        if (t_json / reps < best.jansson)
            best.jansson = t_json / reps;
        if (t_read / reps < best.read)
            best.read = t_read / reps;
    }
    return best;
}

static double time_write(const float *v, int rounds, int reps)
{
    double best = 1e30;
    tp_host_tensor t = {.name = "y", .dtype = TP_F32, .ndim = 3, .shape = {1, 8, 32}, .data = (void *)v,
                        .nbytes = N * sizeof(float)};
    for (int r = 0; r < rounds; r++) {
        tp_jbuf b = {0};
        double t0 = now_ns();
        for (int k = 0; k < reps; k++) {
            tp_err err;
            b.len = 0;
            tp_json_tensor_write(&b, &t, &err);
        }
        double ns = (now_ns() - t0) / reps;
        best = ns < best ? ns : best;
        free(b.p);
    }
    return best;
}

int main(void)
{
    static float v[N];
    static char buf[N * 32 + 256];
    values(v);
    const struct {
        const char *what, *fmt;
    } spellings[] = {
        {"17 digits (Python's repr of the value as a double)", "%.17g"},
        {"9 digits (FP32 round trip, %.9g)", "%.9g"},
        {"6 digits (%.6g, the wrk scripts' spelling)", "%.6g"},
        {"short (%.3f)", "%.3f"},
    };
    printf("JSON tensor codec, %d FP32 numbers per array, best of %d rounds of %d (ns per request / per number):\n\n", N, ROUNDS, REPS);
    printf("| numbers in | body bytes | find arrays | jansson (rest) | decode array | total in | per number |\n");
    printf("| --- | ---: | ---: | ---: | ---: | ---: | ---: |\n");
    for (size_t k = 0; k < sizeof spellings / sizeof spellings[0]; k++) {
        size_t len = body(buf, sizeof buf, v, spellings[k].fmt);
        read_cost c = time_read(buf, len, ROUNDS, REPS);
        double total = c.spans + c.jansson + c.read;
        printf("| %s | %zu | %.0f | %.0f | %.0f | %.0f | %.1f |\n", spellings[k].what, len, c.spans, c.jansson,
               c.read, total, total / N);
    }
    double w = time_write(v, ROUNDS, REPS);
    printf("\n| numbers out | total out | per number |\n| --- | ---: | ---: |\n");
    printf("| FP32, shortest round-trip spelling | %.0f | %.1f |\n", w, w / N);
    return 0;
}
