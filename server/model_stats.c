#include "model_stats.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "json_tensor.h"

typedef struct {
    uint64_t count, ns;
} duration;

typedef struct {
    duration input, infer, output;
} batch_times;

struct tp_model_stats {
    pthread_mutex_t mu;
    duration success, fail, queue, input, infer, output;
    uint64_t inference_count, execution_count, last_inference_ms;
    int64_t max_rows;
    batch_times *by_size; /* [rows - 1], rows 1..max_rows (grown on demand) */
};

tp_model_stats *tp_model_stats_create(void)
{
    tp_model_stats *s = calloc(1, sizeof *s);
    if (s)
        pthread_mutex_init(&s->mu, NULL);
    return s;
}

void tp_model_stats_free(tp_model_stats *s)
{
    if (!s)
        return;
    pthread_mutex_destroy(&s->mu);
    free(s->by_size);
    free(s);
}

static void add(duration *d, double seconds)
{
    d->count++;
    d->ns += seconds > 0 ? (uint64_t)(seconds * 1e9) : 0;
}

/* Milliseconds since the epoch for last_inference, from the coarse clock
 * (a tick, 1-4 ms, behind; a precise read costs 7x as much, per request). */
static uint64_t epoch_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME_COARSE, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void tp_model_stats_success(tp_model_stats *s, const tp_request_times *t)
{
    uint64_t now = epoch_ms();
    pthread_mutex_lock(&s->mu);
    add(&s->success, t->total);
    add(&s->queue, t->queue);
    add(&s->input, t->input);
    add(&s->infer, t->infer);
    add(&s->output, t->output);
    s->last_inference_ms = now;
    pthread_mutex_unlock(&s->mu);
}

void tp_model_stats_fail(tp_model_stats *s, double total)
{
    uint64_t now = epoch_ms();
    pthread_mutex_lock(&s->mu);
    add(&s->fail, total);
    s->last_inference_ms = now;
    pthread_mutex_unlock(&s->mu);
}

void tp_model_stats_execution(tp_model_stats *s, int64_t rows, double input, double infer,
                              double output)
{
    pthread_mutex_lock(&s->mu);
    s->execution_count++;
    s->inference_count += rows > 0 ? (uint64_t)rows : 0;
    if (rows > s->max_rows) {
        batch_times *grown = realloc(s->by_size, (size_t)rows * sizeof *grown);
        if (grown) {
            memset(grown + s->max_rows, 0, (size_t)(rows - s->max_rows) * sizeof *grown);
            s->by_size = grown;
            s->max_rows = rows;
        }
    }
    if (rows >= 1 && rows <= s->max_rows) {
        batch_times *b = &s->by_size[rows - 1];
        add(&b->input, input);
        add(&b->infer, infer);
        add(&b->output, output);
    }
    pthread_mutex_unlock(&s->mu);
}

static void write_duration(tp_jbuf *b, const char *key, duration d, int comma)
{
    if (comma)
        tp_jbuf_raw(b, ",", 1);
    tp_jbuf_str(b, key);
    tp_jbuf_lit(b, ":{\"count\":");
    tp_jbuf_i64(b, (int64_t)d.count);
    tp_jbuf_lit(b, ",\"ns\":");
    tp_jbuf_i64(b, (int64_t)d.ns);
    tp_jbuf_raw(b, "}", 1);
}

static void write_counter(tp_jbuf *b, const char *key, uint64_t v)
{
    tp_jbuf_raw(b, ",", 1);
    tp_jbuf_str(b, key);
    tp_jbuf_raw(b, ":", 1);
    tp_jbuf_i64(b, (int64_t)v);
}

static void write_batch_stats(tp_jbuf *b, const tp_model_stats *s)
{
    int first = 1;
    tp_jbuf_lit(b, ",\"batch_stats\":[");
    for (int64_t rows = 1; rows <= s->max_rows; rows++) {
        const batch_times *t = &s->by_size[rows - 1];
        if (!t->infer.count)
            continue;
        tp_jbuf_lit(b, first ? "{\"batch_size\":" : ",{\"batch_size\":");
        first = 0;
        tp_jbuf_i64(b, rows);
        write_duration(b, "compute_input", t->input, 1);
        write_duration(b, "compute_infer", t->infer, 1);
        write_duration(b, "compute_output", t->output, 1);
        tp_jbuf_raw(b, "}", 1);
    }
    tp_jbuf_raw(b, "]", 1);
}

char *tp_model_stats_json(tp_model_stats *s, const char *name, const char *version)
{
    tp_jbuf b = {0};
    pthread_mutex_lock(&s->mu);
    tp_jbuf_lit(&b, "{\"model_stats\":[{\"name\":");
    tp_jbuf_str(&b, name);
    tp_jbuf_lit(&b, ",\"version\":");
    tp_jbuf_str(&b, version);
    write_counter(&b, "last_inference", s->last_inference_ms);
    write_counter(&b, "inference_count", s->inference_count);
    write_counter(&b, "execution_count", s->execution_count);
    tp_jbuf_lit(&b, ",\"inference_stats\":{");
    write_duration(&b, "success", s->success, 0);
    write_duration(&b, "fail", s->fail, 1);
    write_duration(&b, "queue", s->queue, 1);
    write_duration(&b, "compute_input", s->input, 1);
    write_duration(&b, "compute_infer", s->infer, 1);
    write_duration(&b, "compute_output", s->output, 1);
    write_duration(&b, "cache_hit", (duration){0, 0}, 1);
    write_duration(&b, "cache_miss", (duration){0, 0}, 1);
    tp_jbuf_raw(&b, "}", 1);
    write_batch_stats(&b, s);
    pthread_mutex_unlock(&s->mu);
    tp_jbuf_lit(&b, "}]}");
    tp_jbuf_raw(&b, "", 1);
    if (b.oom) {
        free(b.p);
        return NULL;
    }
    return b.p;
}
