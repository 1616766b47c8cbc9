/* tp_attn_mask.h — which keys an attention query sees, shared by the CPU
 * and CUDA attention kernels (TP_HD: host and device under nvcc), so the
 * rule the CPU tests check is the rule the GPU runs.
 *
 * Two restrictions combine (a key must pass both):
 * - causal, aligned to the bottom right: query s of S sees keys
 *   t <= s + (T - S), so with a KV cache (T > S) the last query sees every
 *   key; this is a prefix of the keys, whose length tp_attn_causal_keys gives;
 * - the optional key-padding mask [B, T], INT32 or INT64: key t of batch
 *   row b is attended iff mask[b, t] != 0 (the HF `attention_mask`:
 *   1 = real token, 0 = padding). It is per batch row and key, never per
 *   head, so tensor parallelism replicates it.
 * A query that sees no key gets a zero output row (defined, never NaN; an
 * exporter's Where(IsNaN(p), 0, p) after its softmax gives the same).
 * With grouped-query attention (GQA: Hkv kv heads for H query heads, H a
 * multiple of Hkv) query head h reads kv head tp_attn_kv_head. */
#ifndef TP_ATTN_MASK_H
#define TP_ATTN_MASK_H

#include <stdint.h>

#include "dtype.h"

/* Keys [0, n) that query s may see under the causal rule (T if !causal). */
TP_HD int64_t tp_attn_causal_keys(int64_t s, int64_t S, int64_t T, int causal)
{
    if (!causal)
        return T;
    int64_t n = s + (T - S) + 1;
    return n < 0 ? 0 : n > T ? T : n;
}

/* Whether the key-padding mask element at offset off (in elements) lets
 * its key be attended; mask_dtype is TP_I32 or TP_I64. */
TP_HD int tp_attn_key_on(const void *mask, tp_dtype mask_dtype, int64_t off)
{
    return mask_dtype == TP_I64 ? ((const int64_t *)mask)[off] != 0 : ((const int32_t *)mask)[off] != 0;
}

/* GQA: the kv head query head h reads, with H query and Hkv kv heads
 * (H % Hkv == 0, checked at load): each kv head serves H / Hkv
 * consecutive query heads, as Hugging Face's repeat_kv lays them out. */
TP_HD int64_t tp_attn_kv_head(int64_t h, int64_t H, int64_t Hkv) { return h / (H / Hkv); }

#endif
