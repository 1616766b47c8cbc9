/* tp_generate.h — the index and packing math of the generation ops
 * (kv_attention, argmax, argmax_index, matmul_rows' row mask), shared by the CPU and CUDA kernels
 * (TP_HD: host and device under nvcc), so the rules the CPU tests check are
 * the rules the GPU runs. docs/models.md, "Generation graphs", is the
 * reference for the ops themselves.
 *
 * argmax keys: one INT64 per row orders candidates by value, then by the
 * lowest index, under a plain signed 64-bit max, so an all_reduce "max"
 * over ranks (any backend, NCCL's ncclMax on ncclInt64 too) picks the
 * global winner:
 *   key = ((ordered_bits(value) ^ 0x80000000) << 32) | (0xFFFFFFFF - index)
 * read as two's complement. ordered_bits maps a float to a uint32 whose
 * unsigned order is the float's order (sign bit set for positives, all
 * bits flipped for negatives); the extra ^ 0x80000000 turns that unsigned
 * order into the signed order of the high word. NaN counts as -inf (it
 * never wins a row that has a number), -0.0 as +0.0 (equal floats tie, and
 * the lower index wins, as NumPy's argmax). */
#ifndef TP_GENERATE_H
#define TP_GENERATE_H

#include <stdint.h>

#include "dtype.h"
#include "tp_attn_mask.h"

/* A row with no candidate (every index at or past the limit): below every
 * real key, so any rank's candidate beats it. */
#define TP_GEN_NO_KEY INT64_MIN

TP_HD uint32_t tp_gen_float_bits(float v)
{
    union {
        float f;
        uint32_t u;
    } c;
    c.f = v;
    return c.u;
}

/* The float's order as an unsigned order; NaN as -inf, -0.0 as +0.0. */
TP_HD uint32_t tp_gen_ordered_bits(float v)
{
    if (v != v)
        return 0x007FFFFFu; /* ordered_bits(-inf) = ~0xFF800000 */
    if (v == 0.0f)
        v = 0.0f;
    uint32_t u = tp_gen_float_bits(v);
    return (u & 0x80000000u) ? ~u : (u ^ 0x80000000u);
}

TP_HD int64_t tp_gen_key(float v, uint32_t index)
{
    uint64_t u = ((uint64_t)(tp_gen_ordered_bits(v) ^ 0x80000000u) << 32) | (uint64_t)(0xFFFFFFFFu - index);
    return (int64_t)u; /* two's complement: the high word's sign is the order's */
}

/* The token id a key packs. */
TP_HD int64_t tp_gen_key_index(int64_t key)
{
    return (int64_t)(0xFFFFFFFFu - (uint32_t)((uint64_t)key & 0xFFFFFFFFu));
}

/* The largest global index argmax may report: indices are 32-bit and
 * 0xFFFFFFFF - index must stay distinct from TP_GEN_NO_KEY's low word. */
#define TP_GEN_MAX_INDEX 0xFFFFFFFEu

/* An INT32 or INT64 element (slot, pos) at element offset off. */
TP_HD int64_t tp_gen_load_index(const void *p, tp_dtype dt, int64_t off)
{
    return dt == TP_I64 ? ((const int64_t *)p)[off] : (int64_t)((const int32_t *)p)[off];
}

/* matmul_rows' row mask (a generation graph's logit_rows): whether row r
 * of a [B] INT32/INT64 mask, elements stride apart, wants its product. */
TP_HD int tp_gen_row_wanted(const void *mask, tp_dtype dt, int64_t stride, int64_t r)
{
    return tp_gen_load_index(mask, dt, r * stride) != 0;
}

/* The end (exclusive) of the run of rows from r on, of B, that share row
 * r's wanted flag: each wanted run is one GEMM, each other run one fill of
 * zeros (a server puts a step's wanted rows first: usually one of each). */
TP_HD int64_t tp_gen_row_run_end(const void *mask, tp_dtype dt, int64_t stride, int64_t r, int64_t B)
{
    int w = tp_gen_row_wanted(mask, dt, stride, r);
    while (++r < B && tp_gen_row_wanted(mask, dt, stride, r) == w)
        ;
    return r;
}

/* What a row's slot and position mean for kv_attention with S cache
 * sequences of length L and T tokens per row. */
typedef enum {
    TP_GEN_ROW_ACTIVE = 0,   /* sequence slot - 1, positions pos .. pos + T - 1 */
    TP_GEN_ROW_INACTIVE,     /* slot 0: writes nothing, outputs zeros */
    TP_GEN_ROW_BAD_SLOT,     /* slot < 0 or slot > S */
    TP_GEN_ROW_BAD_POS,      /* pos < 0 or pos + T > L */
} tp_gen_row;

TP_HD tp_gen_row tp_gen_row_check(int64_t slot, int64_t pos, int64_t S, int64_t T, int64_t L)
{
    if (slot == 0)
        return TP_GEN_ROW_INACTIVE;
    if (slot < 0 || slot > S)
        return TP_GEN_ROW_BAD_SLOT;
    if (pos < 0 || pos > L - T)
        return TP_GEN_ROW_BAD_POS;
    return TP_GEN_ROW_ACTIVE;
}

/* Element offset of cache[s, kvh, j, 0] in a contiguous [S, Hkv, L, D]
 * cache. */
TP_HD int64_t tp_gen_cache_off(int64_t s, int64_t kvh, int64_t j, int64_t Hkv, int64_t L, int64_t D)
{
    return ((s * Hkv + kvh) * L + j) * D;
}

#endif
