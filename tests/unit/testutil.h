/* testutil.h — fixtures shared by the unit tests: temporary graphs with
 * their weights, deterministic data, engines with passes on or off, and the
 * comparison metric of graphs/README.md. */
#ifndef TP_TESTUTIL_H
#define TP_TESTUTIL_H

#include <jansson.h>

#include "engine.h"
#include "graph.h"
#include "passes.h"
#include "safetensors.h"

/* Writes g.json (json) and w.safetensors (items) into a new temp dir named
 * in dir (>= 64 bytes); returns the JSON path in path (>= 128 bytes). */
void tu_write_graph(char *dir, char *path, const char *json, const st_write_item *items, int n);
void tu_rmdir(const char *dir);
/* Deterministic values in [-1, 1). */
void tu_fill(float *p, int64_t n, unsigned seed);
/* An engine with every pass (passes=1) or none (passes=0); eager skips capture. */
tp_engine *tu_engine(const char *path, int passes, int eager);
/* The graph at path with its ranks as `tpserve worker` processes ($TPSERVE,
 * as `make unit` sets it; else build/tpserve), passes on. */
tp_engine *tu_engine_processes(const char *path);
/* Runs e on inputs; aborts the test on failure. */
tp_host_tensor *tu_infer(tp_engine *e, const tp_host_tensor *in, int n_in, int *n_out);
/* The metric of graphs/README.md, max|out-ref| / max(max|ref|, 1e-6);
 * dtypes and shapes must match. */
/* The one tolerance for two FP32 computations of the same values whose
 * floating-point operations run in another order: another batch size or
 * another CPU makes OpenBLAS pick other GEMM kernels (other blocking, FMA or
 * not), a fused node sums its chunks in another order, a ring reduces in
 * another order than a one-shot. Each output is a sum of at most a few
 * hundred products of values of magnitude <= ~1 (the test data and example
 * weights); reordering such a sum moves it by a few units in the last place
 * (rounding errors add like a random walk, ~sqrt(K) * 2^-24 = 1e-6 for
 * K = 256), so 1e-5 keeps a 10x margin yet still catches a wrong row, a
 * missed chunk or a wrong scale (errors of 1e-2 and more). Where the code
 * runs the same operations in the same order the tests compare bit for bit
 * and say why. */
#define TU_RTOL_REORDER 1e-5
double tu_rel_error(const tp_host_tensor *out, const tp_host_tensor *ref);
/* The worst tu_rel_error over n outputs, paired by position (same names). */
double tu_rel_diff(const tp_host_tensor *a, const tp_host_tensor *b, int n);
/* Every output within rtol of the reference tensor of its name. */
void tu_check_outputs(const char *path, const tp_host_tensor *out, int n_out, const tp_host_tensor *ref, int n_ref,
                      double rtol);
/* Every output has the name, dtype and shape of its reference (for the
 * cuda double, which records kernels without running them). */
void tu_check_shapes(const char *path, const tp_host_tensor *out, int n_out, const tp_host_tensor *ref, int n_ref);
/* Loads path, infers at batch, runs the passes of po (default when NULL). */
tp_graph *tu_load_passed(const char *path, int64_t batch, const tp_pass_opts *po);
int tu_count_op(const tp_graph *g, tp_op op);
/* Calls fn for every example graph of $TP_GRAPHS/manifest.json (default
 * build/graphs) with the paths of its graph, inputs and reference. */
typedef void (*tu_example_fn)(const char *json, const char *inputs, const char *ref, double rtol);
void tu_foreach_example(tu_example_fn fn);
/* The generation example's schedules ($TP_GRAPHS/gen_decoder.steps.json:
 * "batched", "alone_a", each a list of steps of token rows with the
 * reference's next tokens); json_decref it. */
json_t *tu_gen_steps(void);
/* Runs each step of steps through e (a generation engine; its logit_rows
 * from the step's) and, with check_tokens, fails naming what, the step and
 * the row unless every wanted row's next token is the reference's and
 * every other row's is 0 (gen_decoder's argmax of a skipped row). */
void tu_gen_schedule(tp_engine *e, json_t *steps, const char *what, int check_tokens);
/* Every tensor of a safetensors file, copied (free with tp_host_tensors_free). */
tp_host_tensor *tu_load_tensors(const char *path, int *n);

/* Row b of t along dim 0, as a batch-1 tensor aliasing t's data. */
tp_host_tensor tu_batch_row(const tp_host_tensor *t, int64_t b);
/* A tensor of dtype over data (caller-owned), nbytes from the shape. */
tp_host_tensor tu_tensor(const char *name, tp_dtype dtype, void *data, int ndim, const int64_t *shape);
/* Global FP32 input tensor over data. */
tp_host_tensor tu_f32(const char *name, float *data, int ndim, const int64_t *shape);

/* Writes n bytes to a new temporary file; its name in path (>= 64 bytes).
 * The caller unlinks it. */
void tu_write_tmp(char *path, const void *bytes, size_t n);

/* A settings endpoint's answer (Triton's logging and trace extensions):
 * with st TP_OK, doc must be the settings now in force (now, as a GET
 * would answer them); otherwise there is no doc. Frees both. */
void tu_expect_settings_answer(tp_status st, char *doc, char *now);

/* The scheduler state of thread tid (of any process) ('R' running or
 * runnable, 'S' sleeping, ...; '?' when gone). tu_thread_reaches waits up to
 * timeout_ms for it to be `state`; tu_thread_stays checks it is `state`
 * at every look for ms (a spinning waiter stays 'R', a sleeping one 'S'). */
char tu_thread_state(int tid);
int tu_thread_reaches(int tid, char state, int timeout_ms);
int tu_thread_stays(int tid, char state, int ms);

/* The first (at most max) CPUs this thread may run on, in cpu[]; how many. */
int tu_allowed_cpus(int *cpu, int max);

#endif
