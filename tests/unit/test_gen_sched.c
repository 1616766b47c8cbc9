/* test_gen_sched.c — server/gen_sched.h on a fake model whose next token is
 * a hash of everything its slot's cache holds up to the row's position. So
 * a row fed into the wrong slot or at the wrong position, a prompt row
 * missed or a decode row that reads a position not yet written changes the
 * tokens, and each sequence's tokens are checked against the same hash
 * computed from its own history alone. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "check_main.h"
#include "gen_sched.h"

#define VOCAB 1000
#define MAX_LEN 40
#define SLOTS 4

typedef struct {
    pthread_mutex_t mu;
    int64_t cache[SLOTS][MAX_LEN];
    int written[SLOTS][MAX_LEN]; /* the step that wrote it, 0: never */
    int steps;
    int64_t max_rows_seen;
    int fail_at; /* step number that fails, 0: none */
    int last_step[SLOTS]; /* the last step with a row of the slot */
    int max_gap;          /* the most steps between two rows of one slot */
    int first_step[SLOTS];
    int gate;             /* 1: the first step waits until the test opens it */
    pthread_cond_t opened;
    int delay_us;
    int64_t wanted_rows;  /* rows whose token the scheduler said it reads */
    int64_t prompt_len[SLOTS]; /* set by a test that classifies rows: pos < it is a prompt row */
    int calls;            /* engine calls logged in mix[] */
    struct { int prompt_rows, decode_rows, last_prompt_slot; } mix[512];
} fake_model;

static int64_t hash_prefix(const int64_t *tokens, int64_t n)
{
    uint64_t h = 1469598103u;
    for (int64_t j = 0; j < n; j++)
        h = (h ^ (uint64_t)tokens[j]) * 1099511628211u + (uint64_t)j;
    return (int64_t)(h % VOCAB);
}

/* Logs what kind of rows call `step` had (for tests that set prompt_len). */
static void log_call(fake_model *m, const int64_t *pos, const int64_t *slot, int64_t rows)
{
    if (m->calls >= (int)(sizeof m->mix / sizeof *m->mix))
        return;
    int c = m->calls++;
    for (int64_t r = 0; r < rows; r++) {
        int64_t len = m->prompt_len[slot[r] - 1];
        m->mix[c].prompt_rows += pos[r] < len;
        m->mix[c].decode_rows += pos[r] >= len;
        if (pos[r] == len - 1)
            m->mix[c].last_prompt_slot = (int)slot[r];
    }
}

/* Writes every row first, then reads, as kv_attention does. A row the
 * scheduler does not want gets -1, so a token taken from it would differ
 * from the reference. */
static tp_status fake_step(void *arg, const int64_t *ids, const int64_t *pos, const int64_t *slot,
                           const int64_t *want, int64_t rows, int64_t *next, tp_err *err)
{
    fake_model *m = arg;
    if (m->delay_us)
        usleep((useconds_t)m->delay_us);
    pthread_mutex_lock(&m->mu);
    while (m->gate)
        pthread_cond_wait(&m->opened, &m->mu);
    int step = ++m->steps;
    if (rows > m->max_rows_seen)
        m->max_rows_seen = rows;
    tp_status st = TP_OK;
    if (step == m->fail_at)
        st = tp_fail(err, TP_BACKEND, "rank 1: injected failure");
    log_call(m, pos, slot, rows);
    for (int64_t r = 0; r < rows; r++) {
        ck_assert(want[r] == 0 || want[r] == 1);
        ck_assert_msg(r == 0 || want[r] <= want[r - 1], "a wanted row after an unwanted one (row %lld)", (long long)r);
        m->wanted_rows += want[r];
    }
    for (int64_t r = 0; st == TP_OK && r < rows; r++) {
        ck_assert(slot[r] >= 1 && slot[r] <= SLOTS);
        ck_assert(pos[r] >= 0 && pos[r] < MAX_LEN);
        m->cache[slot[r] - 1][pos[r]] = ids[r];
        m->written[slot[r] - 1][pos[r]] = step;
        if (!m->first_step[slot[r] - 1])
            m->first_step[slot[r] - 1] = step;
        int *last = &m->last_step[slot[r] - 1];
        if (*last && step - *last > m->max_gap)
            m->max_gap = step - *last;
        *last = step;
    }
    for (int64_t r = 0; st == TP_OK && r < rows; r++) {
        for (int64_t j = 0; j <= pos[r]; j++)
            ck_assert_msg(m->written[slot[r] - 1][j], "slot %lld reads position %lld never written",
                          (long long)slot[r], (long long)j);
        next[r] = want[r] ? hash_prefix(m->cache[slot[r] - 1], pos[r] + 1) : -1;
    }
    pthread_mutex_unlock(&m->mu);
    return st;
}

static fake_model *new_model(void)
{
    fake_model *m = calloc(1, sizeof *m);
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->opened, NULL);
    return m;
}

/* Lets the steps a test held back (m->gate) run. */
static void open_gate(fake_model *m)
{
    pthread_mutex_lock(&m->mu);
    m->gate = 0;
    pthread_cond_broadcast(&m->opened);
    pthread_mutex_unlock(&m->mu);
}

static tp_gen *new_gen_mode(fake_model *m, int64_t max_rows, tp_gen_prefill prefill)
{
    tp_gen_opts o = {.max_rows = max_rows, .prefill = prefill, .slots = SLOTS, .max_seq_len = MAX_LEN,
                     .vocab_size = VOCAB, .step = fake_step, .step_arg = m};
    tp_gen *g;
    tp_err err;
    ck_assert_msg(tp_gen_create(&o, &g, &err) == TP_OK, "%s", err.msg);
    return g;
}

static tp_gen *new_gen(fake_model *m, int64_t max_rows) { return new_gen_mode(m, max_rows, TP_GEN_PREFILL_MIXED); }

/* The greedy continuation of prompt by the fake model alone. */
static int64_t reference(const int64_t *prompt, int64_t n, int64_t max_tokens, const int64_t *stop, int n_stop,
                         int64_t *out)
{
    int64_t seq[MAX_LEN + 1];
    memcpy(seq, prompt, (size_t)n * sizeof *seq);
    int64_t k = 0;
    while (k < max_tokens) {
        int64_t t = hash_prefix(seq, n + k);
        out[k++] = t;
        int hit = 0;
        for (int s = 0; s < n_stop; s++)
            hit |= stop[s] == t;
        if (hit || n + k > MAX_LEN)
            break;
        seq[n + k - 1] = t;
    }
    return k;
}

/* Reads q to its end by polling. */
static int64_t read_all(tp_gen_seq *q, int64_t *out, int64_t cap, tp_gen_end *end, tp_err *err)
{
    int64_t n = 0;
    for (;;) {
        n += tp_gen_seq_read(q, n, out + n, cap - n, TP_GEN_WAKE_TOKEN, NULL, NULL, end, NULL, err);
        if (*end != TP_GEN_RUNNING) {
            n += tp_gen_seq_read(q, n, out + n, cap - n, TP_GEN_WAKE_TOKEN, NULL, NULL, end, NULL, err);
            return n;
        }
        usleep(200);
    }
}

static tp_gen_seq *submit(tp_gen *g, const int64_t *prompt, int64_t n, int64_t max_tokens)
{
    tp_gen_request rq = {.prompt = prompt, .n_prompt = n, .max_tokens = max_tokens};
    tp_gen_seq *q;
    tp_err err;
    ck_assert_msg(tp_gen_submit(g, &rq, &q, &err) == TP_OK, "%s", err.msg);
    return q;
}

static void check_tokens(tp_gen_seq *q, const int64_t *prompt, int64_t n, int64_t max_tokens, tp_gen_end want)
{
    int64_t got[MAX_LEN + 2], ref[MAX_LEN + 2];
    tp_gen_end end;
    tp_err err;
    int64_t ng = read_all(q, got, MAX_LEN + 2, &end, &err);
    int64_t nr = reference(prompt, n, max_tokens, NULL, 0, ref);
    ck_assert_int_eq(end, want);
    ck_assert_int_eq(ng, nr);
    for (int64_t i = 0; i < nr; i++)
        ck_assert_int_eq(got[i], ref[i]);
}

START_TEST(one_sequence_equals_reference)
{
    fake_model *m = new_model();
    tp_gen *g = new_gen_mode(m, 8, (tp_gen_prefill)_i);
    int64_t prompt[] = {5, 17, 3};
    tp_gen_seq *q = submit(g, prompt, 3, 12);
    check_tokens(q, prompt, 3, 12, TP_GEN_LENGTH);
    tp_gen_seq_release(q);
    tp_gen_stats s;
    tp_gen_get_stats(g, &s);
    ck_assert_int_eq(s.output_tokens, 12);
    ck_assert_int_eq(s.prompt_tokens, 3);
    ck_assert_int_eq(s.steps, 12); /* the prompt in one step, then 11 decodes */
    ck_assert_int_eq(s.slots_in_use, 0);
    ck_assert_int_eq(m->wanted_rows, 12); /* the prompt's first two rows give no token */
    tp_gen_free(g);
    free(m);
}
END_TEST

/* Prompts longer than a step, sequences joining while others decode: each
 * sequence's tokens are its own history's, whatever shared its steps. */
START_TEST(concurrent_and_chunked_prefill)
{
    fake_model *m = new_model();
    m->delay_us = 300;
    tp_gen *g = new_gen_mode(m, 5, (tp_gen_prefill)_i);
    int64_t p[SLOTS][12];
    int64_t len[SLOTS] = {1, 7, 12, 3};
    tp_gen_seq *q[SLOTS];
    for (int s = 0; s < SLOTS; s++) {
        for (int i = 0; i < len[s]; i++)
            p[s][i] = (s * 131 + i * 17) % VOCAB;
        q[s] = submit(g, p[s], len[s], 10 + s);
        usleep(700); /* each joins a running batch */
    }
    int64_t tokens = 0;
    for (int s = 0; s < SLOTS; s++) {
        check_tokens(q[s], p[s], len[s], 10 + s, TP_GEN_LENGTH);
        tp_gen_seq_release(q[s]);
        tokens += 10 + s;
    }
    ck_assert_int_le(m->max_rows_seen, 5);
    ck_assert_int_eq(m->wanted_rows, tokens);
    tp_gen_free(g);
    free(m);
}
END_TEST

/* Mixed prefill, more sequences than an engine call takes: every running
 * sequence has a row in every step (which runs in calls of at most 2
 * rows), and the waiting prompts still get theirs. The first call waits
 * until all four are in (its rows may have been chosen with the first
 * alone). */
START_TEST(every_sequence_gets_its_turn)
{
    fake_model *m = new_model();
    m->gate = 1;
    tp_gen *g = new_gen(m, 2);
    int64_t p[SLOTS][1];
    tp_gen_seq *q[SLOTS];
    for (int s = 0; s < SLOTS; s++) {
        p[s][0] = 100 + s;
        q[s] = submit(g, p[s], 1, 12);
    }
    open_gate(m);
    for (int s = 0; s < SLOTS; s++) {
        check_tokens(q[s], p[s], 1, 12, TP_GEN_LENGTH);
        tp_gen_seq_release(q[s]);
    }
    /* prompts: up to 2 rows, then 1 a step (a quarter of 2, rounded up);
     * decodes: all. So a step is at most 4 decode rows and a prompt row,
     * 3 calls, and slot 4 starts by call 6 (call 1 may have been chosen
     * with slot 1 alone). Capping a step's decodes at 2 rows would start
     * slot 3 only after 12 steps. */
    for (int s = 0; s < SLOTS; s++)
        ck_assert_msg(m->first_step[s] >= 1 && m->first_step[s] <= 6, "slot %d first ran in call %d", s + 1,
                      m->first_step[s]);
    ck_assert_msg(m->max_gap <= 3, "a running sequence waited %d calls for its next row", m->max_gap);
    tp_gen_free(g);
    free(m);
}
END_TEST

/* Separate prefill: a call is all prompt rows or all decode rows, and
 * while a sequence decodes, prefill calls alternate with decode calls. */
START_TEST(separate_prefill_steps_alternate)
{
    fake_model *m = new_model();
    m->delay_us = 200;
    tp_gen *g = new_gen_mode(m, 8, TP_GEN_PREFILL_SEPARATE);
    int64_t p[SLOTS][20];
    int64_t len[SLOTS] = {3, 20, 20, 20};
    for (int s = 0; s < SLOTS; s++) {
        m->prompt_len[s] = len[s];
        for (int i = 0; i < len[s]; i++)
            p[s][i] = (s * 37 + i * 11) % VOCAB;
    }
    tp_gen_seq *q[SLOTS];
    q[0] = submit(g, p[0], len[0], 30);
    int64_t got[MAX_LEN + 2];
    tp_gen_end end;
    while (tp_gen_seq_read(q[0], 0, got, 1, TP_GEN_WAKE_TOKEN, NULL, NULL, &end, NULL, NULL) == 0)
        usleep(100); /* slot 1 decodes before the others come */
    for (int s = 1; s < SLOTS; s++)
        q[s] = submit(g, p[s], len[s], 5);
    for (int s = 0; s < SLOTS; s++) {
        check_tokens(q[s], p[s], len[s], s ? 5 : 30, TP_GEN_LENGTH);
        tp_gen_seq_release(q[s]);
    }
    int prefill_calls = 0;
    for (int c = 0; c < m->calls; c++) {
        ck_assert_msg(!m->mix[c].prompt_rows || !m->mix[c].decode_rows, "call %d mixes %d prompt and %d decode rows",
                      c + 1, m->mix[c].prompt_rows, m->mix[c].decode_rows);
        prefill_calls += m->mix[c].prompt_rows > 0;
    }
    ck_assert_int_eq(prefill_calls, 1 + 60 / 8 + 1); /* slot 1's, then 60 rows in calls of 8 */
    ck_assert_msg(m->max_gap <= 2, "slot 1 waited %d calls for its next row", m->max_gap);
    tp_gen_free(g);
    free(m);
}
END_TEST

/* Prompts are fed oldest first: the first of three 12-token prompts is
 * done after 12 rows (three calls of 5), whatever arrived after it. */
START_TEST(prompts_first_come_first_served)
{
    fake_model *m = new_model();
    m->gate = 1;
    tp_gen *g = new_gen_mode(m, 5, (tp_gen_prefill)_i);
    int64_t p[3][12];
    tp_gen_seq *q[3];
    for (int s = 0; s < 3; s++) {
        m->prompt_len[s] = 12;
        for (int i = 0; i < 12; i++)
            p[s][i] = (s * 7 + i) % VOCAB;
        q[s] = submit(g, p[s], 12, 2);
    }
    open_gate(m);
    for (int s = 0; s < 3; s++) {
        check_tokens(q[s], p[s], 12, 2, TP_GEN_LENGTH);
        tp_gen_seq_release(q[s]);
    }
    int done_at[4] = {0};
    for (int c = 0; c < m->calls; c++)
        if (m->mix[c].last_prompt_slot)
            done_at[m->mix[c].last_prompt_slot] = c + 1;
    ck_assert_int_eq(done_at[1], 3);
    ck_assert_msg(done_at[1] < done_at[2] && done_at[2] < done_at[3], "prompts done at calls %d, %d, %d",
                  done_at[1], done_at[2], done_at[3]);
    tp_gen_free(g);
    free(m);
}
END_TEST

START_TEST(stop_id_and_cache_full)
{
    fake_model *m = new_model();
    tp_gen *g = new_gen(m, 8);
    int64_t prompt[] = {9, 8, 7};
    int64_t ref[MAX_LEN];
    reference(prompt, 3, 6, NULL, 0, ref);
    int64_t stop[] = {ref[3], 999999};
    tp_gen_request rq = {.prompt = prompt, .n_prompt = 3, .max_tokens = 30, .stop_ids = stop, .n_stop = 2};
    tp_gen_seq *q;
    tp_err err;
    ck_assert(tp_gen_submit(g, &rq, &q, &err) == TP_OK);
    int64_t got[MAX_LEN + 2];
    tp_gen_end end;
    int64_t n = read_all(q, got, MAX_LEN + 2, &end, &err);
    int64_t first = 0; /* the first occurrence of ref[3] ends it (it may come earlier) */
    while (ref[first] != ref[3])
        first++;
    ck_assert_int_eq(end, TP_GEN_STOP);
    ck_assert_int_eq(n, first + 1);
    ck_assert_int_eq(got[n - 1], ref[3]);
    tp_gen_seq_release(q);

    /* 38 prompt tokens leave MAX_LEN - 38 + 1 = 3 */
    int64_t longp[38];
    for (int i = 0; i < 38; i++)
        longp[i] = i;
    q = submit(g, longp, 38, 100);
    check_tokens(q, longp, 38, 3, TP_GEN_CACHE_FULL);
    tp_gen_seq_release(q);
    tp_gen_free(g);
    free(m);
}
END_TEST

START_TEST(bad_requests_and_full_slots)
{
    fake_model *m = new_model();
    m->delay_us = 2000;
    tp_gen *g = new_gen(m, 8);
    tp_err err;
    tp_gen_seq *q;
    int64_t ok[] = {1, 2}, neg[] = {1, -3}, big[] = {VOCAB};
    int64_t longp[MAX_LEN + 1] = {0};
    tp_gen_request rq = {.prompt = ok, .n_prompt = 0, .max_tokens = 4};
    ck_assert_int_eq(tp_gen_submit(g, &rq, &q, &err), TP_INVALID);
    ck_assert(strstr(err.msg, "empty"));
    rq = (tp_gen_request){.prompt = neg, .n_prompt = 2, .max_tokens = 4};
    ck_assert_int_eq(tp_gen_submit(g, &rq, &q, &err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "input_ids[1] = -3"), "%s", err.msg);
    rq = (tp_gen_request){.prompt = big, .n_prompt = 1, .max_tokens = 4};
    ck_assert_int_eq(tp_gen_submit(g, &rq, &q, &err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "[0, 1000)"), "%s", err.msg);
    rq = (tp_gen_request){.prompt = longp, .n_prompt = MAX_LEN + 1, .max_tokens = 4};
    ck_assert_int_eq(tp_gen_submit(g, &rq, &q, &err), TP_INVALID);
    ck_assert_msg(strstr(err.msg, "max_seq_len 40"), "%s", err.msg);
    rq = (tp_gen_request){.prompt = ok, .n_prompt = 2, .max_tokens = 0};
    ck_assert_int_eq(tp_gen_submit(g, &rq, &q, &err), TP_INVALID);

    tp_gen_seq *held[SLOTS];
    for (int s = 0; s < SLOTS; s++)
        held[s] = submit(g, ok, 2, 1000);
    rq = (tp_gen_request){.prompt = ok, .n_prompt = 2, .max_tokens = 4};
    ck_assert_int_eq(tp_gen_submit(g, &rq, &q, &err), TP_UNAVAILABLE);
    ck_assert_msg(strstr(err.msg, "all 4 sequence slots"), "%s", err.msg);
    /* a client that goes frees its slot at the next step */
    tp_gen_seq_release(held[0]);
    tp_gen_stats s;
    for (int i = 0; i < 1000; i++) {
        tp_gen_get_stats(g, &s);
        if (s.slots_in_use < SLOTS)
            break;
        usleep(1000);
    }
    ck_assert_int_eq(s.slots_in_use, SLOTS - 1);
    ck_assert_int_eq(s.cancelled, 1);
    q = submit(g, ok, 2, 3);
    check_tokens(q, ok, 2, 3, TP_GEN_LENGTH);
    tp_gen_seq_release(q);
    for (int i = 1; i < SLOTS; i++)
        tp_gen_seq_release(held[i]);
    tp_gen_free(g);
    free(m);
}
END_TEST

START_TEST(step_failure_ends_its_sequences)
{
    fake_model *m = new_model();
    m->fail_at = 3;
    tp_gen *g = new_gen(m, 8);
    int64_t prompt[] = {4, 4};
    tp_gen_seq *q = submit(g, prompt, 2, 20);
    int64_t got[32];
    tp_gen_end end;
    tp_err err = {0};
    int64_t n = read_all(q, got, 32, &end, &err);
    ck_assert_int_eq(end, TP_GEN_FAILED);
    ck_assert_int_eq(n, 2); /* steps 1 and 2 gave a token each */
    ck_assert_msg(strstr(err.msg, "injected failure"), "%s", err.msg);
    tp_status st = TP_OK;
    tp_gen_seq_read(q, n, got, 32, TP_GEN_WAKE_END, NULL, NULL, &end, &st, NULL);
    ck_assert_int_eq(st, TP_BACKEND);
    tp_gen_seq_release(q);
    /* the scheduler goes on with the next sequence */
    q = submit(g, prompt, 2, 4);
    check_tokens(q, prompt, 2, 4, TP_GEN_LENGTH);
    tp_gen_seq_release(q);
    tp_gen_free(g);
    free(m);
}
END_TEST

/* The notify runs once a token comes after an armed read, with no lost
 * wake-up: a reader that waits only for notifies sees every token. */
typedef struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int woken;
} waiter;

static void on_notify(void *arg)
{
    waiter *w = arg;
    pthread_mutex_lock(&w->mu);
    w->woken = 1;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

START_TEST(notify_wakes_an_armed_reader)
{
    fake_model *m = new_model();
    m->delay_us = 100;
    tp_gen *g = new_gen(m, 8);
    waiter w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};
    int64_t prompt[] = {1, 2, 3, 4};
    for (int wake = TP_GEN_WAKE_TOKEN; wake <= TP_GEN_WAKE_END; wake++) {
        tp_gen_request rq = {.prompt = prompt, .n_prompt = 4, .max_tokens = 15, .notify = on_notify,
                             .notify_arg = &w};
        tp_gen_seq *q;
        tp_err err;
        ck_assert(tp_gen_submit(g, &rq, &q, &err) == TP_OK);
        int64_t got[16], n = 0, reads = 0;
        tp_gen_end end = TP_GEN_RUNNING;
        while (end == TP_GEN_RUNNING) {
            pthread_mutex_lock(&w.mu);
            w.woken = 0;
            pthread_mutex_unlock(&w.mu);
            int64_t k = tp_gen_seq_read(q, n, got + n, 16 - n, (tp_gen_wake)wake, NULL, NULL, &end, NULL, &err);
            n += k;
            reads++;
            if (k == 0 && end == TP_GEN_RUNNING) {
                pthread_mutex_lock(&w.mu);
                while (!w.woken)
                    pthread_cond_wait(&w.cv, &w.mu);
                pthread_mutex_unlock(&w.mu);
            }
        }
        ck_assert_int_eq(n, 15);
        if (wake == TP_GEN_WAKE_END)
            ck_assert_int_le(reads, 3); /* woken at the end, not per token */
        tp_gen_seq_release(q);
    }
    tp_gen_free(g);
    free(m);
}
END_TEST

/* Freeing the scheduler ends what still runs. */
START_TEST(free_ends_running_sequences)
{
    fake_model *m = new_model();
    m->delay_us = 1000;
    tp_gen *g = new_gen(m, 8);
    int64_t prompt[] = {1};
    tp_gen_seq *q = submit(g, prompt, 1, 1000);
    usleep(3000);
    tp_gen_free(g);
    int64_t got[MAX_LEN + 2];
    tp_gen_end end;
    tp_err err;
    tp_gen_seq_read(q, 0, got, MAX_LEN + 2, TP_GEN_WAKE_END, NULL, NULL, &end, NULL, &err);
    ck_assert(end == TP_GEN_FAILED || end == TP_GEN_CACHE_FULL);
    tp_gen_seq_release(q);
    free(m);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("gen_sched");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 60);
    tcase_add_loop_test(tc, one_sequence_equals_reference, TP_GEN_PREFILL_MIXED, TP_GEN_PREFILL_SEPARATE + 1);
    tcase_add_loop_test(tc, concurrent_and_chunked_prefill, TP_GEN_PREFILL_MIXED, TP_GEN_PREFILL_SEPARATE + 1);
    tcase_add_test(tc, every_sequence_gets_its_turn);
    tcase_add_test(tc, separate_prefill_steps_alternate);
    tcase_add_loop_test(tc, prompts_first_come_first_served, TP_GEN_PREFILL_MIXED, TP_GEN_PREFILL_SEPARATE + 1);
    tcase_add_test(tc, stop_id_and_cache_full);
    tcase_add_test(tc, bad_requests_and_full_slots);
    tcase_add_test(tc, step_failure_ends_its_sequences);
    tcase_add_test(tc, notify_wakes_an_armed_reader);
    tcase_add_test(tc, free_ends_running_sequences);
    suite_add_tcase(s, tc);
    return s;
}

TP_CHECK_MAIN(suite)
