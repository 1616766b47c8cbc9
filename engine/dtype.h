/* dtype.h — element types of the tpgraph format and their conversions.
 *
 * The half-precision conversions are inline and marked TP_HD so the CUDA
 * kernels and the CPU backend share exactly the same arithmetic. */
#ifndef TP_DTYPE_H
#define TP_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TP_HD __host__ __device__ __forceinline__
#else
#define TP_HD static inline
#endif

typedef enum { TP_F32 = 0, TP_F16, TP_BF16, TP_I32, TP_I64, TP_DTYPE_COUNT } tp_dtype;

size_t tp_dtype_size(tp_dtype t);
/* KServe v2 names: FP32 FP16 BF16 INT32 INT64. */
const char *tp_dtype_name(tp_dtype t);
/* safetensors names: F32 F16 BF16 I32 I64. */
const char *tp_dtype_st_name(tp_dtype t);
/* Return 0 on success, -1 if the name is unknown. */
int tp_dtype_from_name(const char *s, tp_dtype *out);
int tp_dtype_from_st_name(const char *s, tp_dtype *out);
static inline int tp_dtype_is_float(tp_dtype t) { return t == TP_F32 || t == TP_F16 || t == TP_BF16; }

TP_HD float tp_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, bits;
    if (exp == 0) {
        if (mant == 0) {
            bits = sign;
        } else { /* subnormal: normalise */
            exp = 127 - 15 + 1;
            while (!(mant & 0x400u)) { mant <<= 1; exp--; }
            mant &= 0x3ffu;
            bits = sign | (exp << 23) | (mant << 13);
        }
    } else if (exp == 31) {
        bits = sign | 0x7f800000u | (mant << 13);
    } else {
        bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

/* Round to nearest even, with overflow to inf and correct subnormals. */
TP_HD uint16_t tp_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t absx = x & 0x7fffffffu;
    if (absx >= 0x7f800000u) /* inf or nan */
        return (uint16_t)(sign | 0x7c00u | (absx > 0x7f800000u ? 0x200u : 0));
    if (absx >= 0x477ff000u) /* rounds to >= 65520: overflow */
        return (uint16_t)(sign | 0x7c00u);
    if (absx < 0x38800000u) { /* below 2^-14: subnormal half or zero */
        if (absx < 0x33000000u)
            return (uint16_t)sign;
        uint32_t e = absx >> 23, m = (absx & 0x7fffffu) | 0x800000u;
        uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift, rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u)))
            r++;
        return (uint16_t)(sign | r);
    }
    uint32_t r = ((absx - 0x38000000u) >> 13);
    uint32_t rem = absx & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u)))
        r++;
    return (uint16_t)(sign | r);
}

TP_HD float tp_bf16_to_f32(uint16_t h)
{
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

TP_HD uint16_t tp_f32_to_bf16(float f)
{
    uint32_t x;
    memcpy(&x, &f, 4);
    if ((x & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((x >> 16) | 0x40u); /* quiet nan */
    x += 0x7fffu + ((x >> 16) & 1u);
    return (uint16_t)(x >> 16);
}

/* Element i of a float-typed buffer, widened to float. */
TP_HD float tp_load_f32(const void *p, tp_dtype t, int64_t i)
{
    switch (t) {
    case TP_F32: return ((const float *)p)[i];
    case TP_F16: return tp_f16_to_f32(((const uint16_t *)p)[i]);
    case TP_BF16: return tp_bf16_to_f32(((const uint16_t *)p)[i]);
    case TP_I32: return (float)((const int32_t *)p)[i];
    case TP_I64: return (float)((const int64_t *)p)[i];
    case TP_DTYPE_COUNT: break;
    }
    return 0.0f;
}

TP_HD void tp_store_f32(void *p, tp_dtype t, int64_t i, float v)
{
    switch (t) {
    case TP_F32: ((float *)p)[i] = v; break;
    case TP_F16: ((uint16_t *)p)[i] = tp_f32_to_f16(v); break;
    case TP_BF16: ((uint16_t *)p)[i] = tp_f32_to_bf16(v); break;
    case TP_I32: ((int32_t *)p)[i] = (int32_t)v; break;
    case TP_I64: ((int64_t *)p)[i] = (int64_t)v; break;
    case TP_DTYPE_COUNT: break;
    }
}

#endif
