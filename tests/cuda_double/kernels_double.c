/* kernels_double.c — the backend's kernel launchers (tp_cuda_kernels.h,
 * tp_cuda_ops.h) without kernels: each launch is recorded on its stream
 * (run at once, or at every replay of a graph that captured it) and
 * counted. Only these look at data:
 *  - the embedding reports the device error the real kernel would
 *    (TP_DOUBLE_FAIL=embed_id), and breaks a rule when its ids are still
 *    the double's fill pattern (read before written); the gather reports
 *    a bad id likewise (TP_DOUBLE_FAIL=gather_id);
 *  - zero_rows (matmul_rows' unwanted rows) zeroes them, so the captured
 *    and the eager matmul_rows can be compared byte for byte;
 *  - the barrier and the one-shot all_reduce run the cross-rank protocol
 *    for real, from the same source as the device (kernels/cuda/
 *    comm_protocol.h), on the host thread that runs the stream: epochs
 *    advance in the control block's counters, arrivals are stored into
 *    every peer's flags through the double's shared memory (windows map
 *    each other's segments across the rank processes), and a wait ends as
 *    on the GPU — the peer arrived, the abort word was set, an earlier
 *    barrier failure is in the error word, or the timeout passed and the
 *    error word names the peer. So ranks that issue different barriers,
 *    a peer that never arrives and an abort in the middle of a wait show
 *    here as they would on a device. (The one-shot's sums are not
 *    computed: values are not the double's business.) */
#include <cuda_runtime_api.h>
#include <stdint.h>
#include <string.h>

#include "cuda/comm_protocol.h"
#include "cuda/tp_cuda_kernels.h"
#include "common/tp_generate.h"
#include "cuda/tp_cuda_ops.h"
#include "cuda_double.h"

static int launch(const char *name, void *stream) { return dbl_launch(stream, name); }

int tp_cuda_unary(tp_unary_fn fn, const void *x, void *y, int64_t n, tp_dtype dtype, float p, void *stream)
{
    (void)fn, (void)x, (void)y, (void)n, (void)dtype, (void)p;
    return launch("unary", stream);
}

int tp_cuda_softmax(const void *x, void *y, int64_t outer, int64_t n, int64_t inner, tp_dtype dtype, void *stream)
{
    (void)x, (void)y, (void)outer, (void)n, (void)inner, (void)dtype;
    return launch("softmax", stream);
}

int tp_cuda_layer_norm(const void *x, const void *weight, const void *bias, void *y, int64_t rows, int64_t n,
                       float eps, tp_dtype dtype, void *stream)
{
    (void)x, (void)weight, (void)bias, (void)y, (void)rows, (void)n, (void)eps, (void)dtype;
    return launch("layer_norm", stream);
}

int tp_cuda_rms_norm(const void *x, const void *weight, void *y, int64_t rows, int64_t n, float eps,
                     tp_dtype dtype, void *stream)
{
    (void)x, (void)weight, (void)y, (void)rows, (void)n, (void)eps, (void)dtype;
    return launch("rms_norm", stream);
}

int tp_cuda_copy_strided(void *dst, const void *src, const tp_layout *l, int es, void *stream)
{
    (void)dst, (void)src, (void)l, (void)es;
    return launch("copy_strided", stream);
}

int tp_cuda_binary(int op, const void *a, const void *b, void *out, const tp_layout *l, tp_dtype dtype,
                   void *stream)
{
    (void)op, (void)a, (void)b, (void)out, (void)l, (void)dtype;
    return launch("binary", stream);
}

static int run_embedding(const void *p)
{
    const tp_cuda_embedding_args *a = p;
    dbl_count_launch();
    uint32_t first;
    memcpy(&first, a->ids, sizeof first);
    if (first == 0xa5a5a5a5u)
        dbl_rule("embedding read ids from memory nobody wrote (the double's fill pattern): a GPU would read "
                 "garbage ids and fail on some ranks only");
    if (dbl_inject(DBL_FAIL_EMBED_ID) && a->err->code == TP_CUDA_ERR_NONE)
        *a->err = (tp_cuda_error){TP_CUDA_ERR_EMBED_ID, 0, a->total, 0};
    return 0;
}

int tp_cuda_embedding(const tp_cuda_embedding_args *a, void *stream)
{
    return dbl_enqueue(stream, "embedding", run_embedding, a, sizeof *a, NULL);
}

int tp_cuda_attention(const tp_cuda_attn_args *a, void *stream)
{
    (void)a;
    return launch("attention", stream);
}

int tp_cuda_kv_attention(const tp_cuda_kv_args *a, void *stream)
{
    (void)a;
    return launch("kv_attention", stream);
}

int tp_cuda_argmax(const tp_cuda_argmax_args *a, void *stream)
{
    (void)a;
    return launch("argmax", stream);
}

int tp_cuda_argmax_index(const int64_t *keys, int64_t *out, const tp_layout *l, void *stream)
{
    (void)keys, (void)out, (void)l;
    return launch("argmax_index", stream);
}

typedef struct {
    char *out;
    size_t row_bytes;
    int64_t rows, mask_stride;
    const void *mask;
    tp_dtype mask_dtype;
} zero_rows_args;

static int run_zero_rows(const void *p)
{
    const zero_rows_args *a = p;
    dbl_count_launch();
    for (int64_t r = 0; r < a->rows; r++)
        if (!tp_gen_row_wanted(a->mask, a->mask_dtype, a->mask_stride, r))
            memset(a->out + (size_t)r * a->row_bytes, 0, a->row_bytes);
    return 0;
}

int tp_cuda_zero_rows(void *out, tp_dtype dtype, int64_t rows, int64_t row_elems, const void *mask,
                      tp_dtype mask_dtype, int64_t mask_stride, void *stream)
{
    zero_rows_args a = {out, (size_t)row_elems * tp_dtype_size(dtype), rows, mask_stride, mask, mask_dtype};
    int e = dbl_enqueue(stream, "zero_rows", run_zero_rows, &a, sizeof a, NULL);
    cudaError_t pending = cudaGetLastError(); /* as dbl_launch */
    return e ? e : (int)pending;
}

int tp_cuda_block_pack(const void *src, void *dst, int64_t outer, int64_t len, int64_t inner, int d, int es,
                       int to_packed, void *stream)
{
    (void)src, (void)dst, (void)outer, (void)len, (void)inner, (void)d, (void)es, (void)to_packed;
    return launch("block_pack", stream);
}

int tp_cuda_reduce_chunks(const void *own, const void *stage, void *out, int64_t count, int rank, int d, int red,
                          tp_dtype dtype, void *stream)
{
    (void)own, (void)stage, (void)out, (void)count, (void)rank, (void)d, (void)red, (void)dtype;
    return launch("reduce_chunks", stream);
}

int tp_cuda_finish_avg(void *p, int64_t count, int d, tp_dtype dtype, void *stream)
{
    (void)p, (void)count, (void)d, (void)dtype;
    return launch("finish_avg", stream);
}

/* A block's meet (comm_kernels.cu meet()): on the device thread p
 * arrives at peer p and waits for it, all threads at once; one host thread
 * makes every arrival first, then every wait, which a peer sees the same
 * way. The fences stand for __threadfence_system. */
static void meet_host(const tp_cuda_sync *s, int slot, int block, unsigned long long e)
{
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (int p = 0; p < s->world; p++)
        tp_sync_arrive(s, slot, block, p, e);
    for (int p = 0; p < s->world; p++)
        (void)tp_sync_wait(s, slot, block, p, e);
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
}

typedef struct {
    tp_cuda_sync s;
    int slot;
} barrier_args;

static int run_barrier(const void *p)
{
    const barrier_args *a = p;
    dbl_count_launch();
    unsigned long long e = *tp_sync_counter(&a->s, a->slot, 0) + 1;
    meet_host(&a->s, a->slot, 0, e);
    *tp_sync_counter(&a->s, a->slot, 0) = e;
    return 0;
}

/* What a real launcher returns: the launch's error, else cudaGetLastError
 * (an earlier failure nobody cleared is reported as this launch's). */
static int launched(int e)
{
    cudaError_t pending = cudaGetLastError();
    return e ? e : (int)pending;
}

int tp_cuda_barrier(const tp_cuda_sync *s, int slot, void *stream)
{
    if (tp_sync_check(s) != 0 || slot < 0 || slot >= TP_CUDA_SYNC_SLOTS)
        return cudaErrorInvalidValue;
    barrier_args a = {*s, slot};
    return launched(dbl_enqueue(stream, "barrier", run_barrier, &a, sizeof a, NULL));
}

typedef struct {
    tp_cuda_sync s;
} oneshot_args;

/* The grid's blocks one after another: every rank runs them in the same
 * order, so block b of each rank still meets only block b of its peers. */
static int run_oneshot(const void *p)
{
    const oneshot_args *a = p;
    dbl_count_launch();
    for (int b = 0; b < TP_CUDA_SYNC_BLOCKS; b++) {
        unsigned long long e_in = *tp_sync_counter(&a->s, TP_CUDA_SLOT_ONESHOT_IN, b) + 1;
        unsigned long long e_out = *tp_sync_counter(&a->s, TP_CUDA_SLOT_ONESHOT_OUT, b) + 1;
        meet_host(&a->s, TP_CUDA_SLOT_ONESHOT_IN, b, e_in);
        meet_host(&a->s, TP_CUDA_SLOT_ONESHOT_OUT, b, e_out);
        *tp_sync_counter(&a->s, TP_CUDA_SLOT_ONESHOT_IN, b) = e_in;
        *tp_sync_counter(&a->s, TP_CUDA_SLOT_ONESHOT_OUT, b) = e_out;
    }
    return 0;
}

int tp_cuda_oneshot_all_reduce(const tp_cuda_sync *s, const tp_cuda_peers *in, void *out, int64_t count,
                               tp_dtype dtype, int red, void *stream)
{
    int known = dtype == TP_F32 || dtype == TP_F16 || dtype == TP_BF16 || dtype == TP_I32 || dtype == TP_I64;
    if (tp_sync_check(s) != 0 || !in || !out || count < 0 || red < 0 || red > 2 || !known)
        return cudaErrorInvalidValue;
    for (int p = 0; p < s->world; p++)
        if (!in->p[p])
            return cudaErrorInvalidValue;
    oneshot_args a = {*s};
    return launched(dbl_enqueue(stream, "oneshot_all_reduce", run_oneshot, &a, sizeof a, NULL));
}

int tp_cuda_reduce(const void *x, void *out, const tp_reduce_plan *p, int64_t n_out, int mean, tp_dtype dtype,
                   void *stream)
{
    (void)x, (void)out, (void)p, (void)n_out, (void)mean, (void)dtype;
    return launch("reduce", stream);
}

static int run_gather(const void *p)
{
    const tp_cuda_gather_args *a = p;
    dbl_count_launch();
    if (dbl_inject(DBL_FAIL_GATHER_ID) && a->err->code == TP_CUDA_ERR_NONE)
        *a->err = (tp_cuda_error){TP_CUDA_ERR_GATHER_ID, 0, -99, 0};
    return 0;
}

int tp_cuda_gather(const tp_cuda_gather_args *a, int64_t n_out, void *stream)
{
    (void)n_out;
    return launched(dbl_enqueue(stream, "gather", run_gather, a, sizeof *a, NULL));
}

int tp_cuda_where(const void *cond, tp_dtype cond_dtype, const void *x, const void *y, void *out,
                  const tp_layout *l, int es, void *stream)
{
    (void)cond, (void)cond_dtype, (void)x, (void)y, (void)out, (void)l, (void)es;
    return launch("where", stream);
}

int tp_cuda_rope(const tp_cuda_rope_args *a, void *stream)
{
    (void)a;
    return launch("rope", stream);
}

int tp_cuda_cast(const void *x, tp_dtype x_dtype, void *out, tp_dtype out_dtype, const tp_layout *l, void *stream)
{
    (void)x, (void)x_dtype, (void)out, (void)out_dtype, (void)l;
    return launch("cast", stream);
}
