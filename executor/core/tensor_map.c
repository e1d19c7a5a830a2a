/*
 * executor/core/tensor_map.c - TMA tensor maps of 16-bit and fp8 tensors (tensor_map.h).
 */
#include "executor/core/tensor_map.h"

#include <cuda_runtime_api.h>

typedef CUresult (*encode_tiled_fn)(CUtensorMap *, CUtensorMapDataType, cuuint32_t, void *,
                                   const cuuint64_t *, const cuuint64_t *, const cuuint32_t *,
                                   const cuuint32_t *, CUtensorMapInterleave, CUtensorMapSwizzle,
                                   CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

/* cuTensorMapEncodeTiled, looked up once; NULL without a driver that has it.  Two host
 * threads racing here both store the same pointer. */
static encode_tiled_fn encode_tiled(void) {
    static encode_tiled_fn fn;
    if (!fn) {
        void *f = NULL;
        enum cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (encode_tiled_fn)f;
        else
            (void)cudaGetLastError(); /* leave no sticky error for the caller's next call */
    }
    return fn;
}

/* The driver's code for an L2 promotion of `bytes` into *out: 1, or 0 for a size it has no
 * code for (the one list of accepted sizes). */
static int l2_promotion_code(uint32_t bytes, CUtensorMapL2promotion *out) {
    switch (bytes) {
    case 0: *out = CU_TENSOR_MAP_L2_PROMOTION_NONE; return 1;
    case 64: *out = CU_TENSOR_MAP_L2_PROMOTION_L2_64B; return 1;
    case 128: *out = CU_TENSOR_MAP_L2_PROMOTION_L2_128B; return 1;
    case 256: *out = CU_TENSOR_MAP_L2_PROMOTION_L2_256B; return 1;
    default: return 0;
    }
}

int fi_tensor_map_args_ok(fi_dtype dt, const void *base, int rank, const uint64_t *strides,
                          const uint32_t *box, uint32_t swizzle, uint32_t l2_promotion) {
    const uint32_t esize = dt == FI_DTYPE_BF16 || dt == FI_DTYPE_F16 ? 2 : dt == FI_DTYPE_E4M3 ? 1 : 0;
    CUtensorMapL2promotion l2;
    if (esize == 0 || rank < 2 || rank > 5 || (uintptr_t)base % 16 != 0 ||
        (swizzle != 128 && swizzle != 64) || box[0] * esize != swizzle ||
        !l2_promotion_code(l2_promotion, &l2))
        return 0;
    for (int i = 0; i + 1 < rank; i++)
        if (strides[i] == 0 || strides[i] % 16 != 0 || strides[i] >= ((uint64_t)1 << 40))
            return 0;
    return 1;
}

int fi_tensor_map(CUtensorMap *m, fi_dtype dt, const void *base, int rank, const uint64_t *dims,
                  const uint64_t *strides, const uint32_t *box, uint32_t swizzle, uint32_t l2_promotion) {
    if (!fi_tensor_map_args_ok(dt, base, rank, strides, box, swizzle, l2_promotion))
        return -1;
    const encode_tiled_fn fn = encode_tiled(); /* after the checks: no driver call for a refusal */
    if (!fn)
        return -1;
    cuuint64_t d[5], s[4];
    cuuint32_t b[5], unit[5];
    for (int i = 0; i < rank; i++) {
        d[i] = dims[i];
        b[i] = box[i];
        unit[i] = 1;
        if (i + 1 < rank)
            s[i] = strides[i];
    }
    const CUtensorMapDataType type = dt == FI_DTYPE_BF16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16
                                     : dt == FI_DTYPE_F16 ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                                          : CU_TENSOR_MAP_DATA_TYPE_UINT8;
    CUtensorMapL2promotion l2 = CU_TENSOR_MAP_L2_PROMOTION_NONE;
    (void)l2_promotion_code(l2_promotion, &l2); /* accepted by fi_tensor_map_args_ok */
    const CUresult r = fn(m, type, (cuuint32_t)rank, (void *)base, d, s, b, unit,
                          CU_TENSOR_MAP_INTERLEAVE_NONE,
                          swizzle == 128 ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_64B, l2,
                          CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return r == CUDA_SUCCESS ? 0 : -1;
}
