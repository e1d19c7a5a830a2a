/*
 * executor/core/tensor_map.h - TMA tensor maps of 16-bit and fp8 tensors, encoded on the host
 * for the families whose producers copy by tensor map (context: the k / v views; MLA wgmma:
 * the ckv / kpe caches, 16-bit or fp8).  Not installed.
 */
#ifndef FIATTN_EXECUTOR_TENSOR_MAP_H
#define FIATTN_EXECUTOR_TENSOR_MAP_H

#include <cuda.h>
#include <stdint.h>

#include "fiattn_run.h"

/* Encode *m as a tiled map of a bf16 / fp16 / fp8 e4m3 tensor (dt) at `base`: `rank` (2..5)
 * dims innermost first (elements; dims[0] the contiguous one), strides[0 .. rank - 2] the
 * byte strides of dims 1 .. rank - 1, box[0 .. rank - 1] the box in elements, `swizzle`
 * bytes (128 or 64; a box row, box[0] elements, must be exactly that wide: the panels the
 * wgmma bodies read), L2 promotion of `l2_promotion` bytes (0: none, 64, 128 or 256: the
 * sector run L2 fetches for each piece a box reads), no out-of-bounds fill.  The driver's
 * cuTensorMapEncodeTiled through the runtime's entry point (no link to libcuda); host
 * work only, nothing is launched.
 * @return 0; -1 when TMA cannot take the tensor (no driver entry point, another dtype or
 *   swizzle or promotion, base not 16-byte aligned, a stride 0, not a multiple of 16 or
 *   >= 2^40, a box the driver refuses); *m is then unspecified and the caller copies
 *   another way. */
int fi_tensor_map(CUtensorMap *m, fi_dtype dt, const void *base, int rank, const uint64_t *dims,
                  const uint64_t *strides, const uint32_t *box, uint32_t swizzle, uint32_t l2_promotion);

/* The rules fi_tensor_map checks before it asks the driver (dtype, rank, base alignment,
 * swizzle and box row, promotion, strides), with its arguments: 1 when all hold, else 0.
 * Pure. */
int fi_tensor_map_args_ok(fi_dtype dt, const void *base, int rank, const uint64_t *strides,
                          const uint32_t *box, uint32_t swizzle, uint32_t l2_promotion);

#endif /* FIATTN_EXECUTOR_TENSOR_MAP_H */
