"""fiattn: plan-once, run-many paged attention for NVIDIA Hopper, from Python.

Drop-in functions with the reference (FlashInfer) signatures:

- fiattn.mla.trtllm_batch_decode_with_kv_cache_mla, fiattn.mla.BatchMLAPagedAttentionWrapper
- fiattn.xqa.xqa_mla
- fiattn.decode.xqa_batch_decode_with_kv_cache
- fiattn.prefill.trtllm_batch_context_with_kv_cache
- fiattn.merge_state / fiattn.merge_states (natural-log LSE; base=2 for FlashInfer's)

and fiattn's extension fiattn.decode.xqa_batch_decode_with_lse (the GQA decode above, also
returning the natural-log LSE that merge_states takes: context-parallel decode).

They take torch tensors (imported on first use: ``import fiattn`` works without torch, and
so do the C-level helpers fiattn.capi, fiattn.status_name, fiattn.workspace_size).
CUDA tensors run fi_run on torch.cuda.current_stream(); CPU tensors run the C reference
executor (fi_ref_run) on a host plan: the same plan, fp32 merge, for checks without a GPU.

Plans live in the caller's workspace_buffer and are cached per buffer
(fiattn.release_workspace / fiattn.clear_plan_cache drop them).  Plans are host work and
cannot be made during CUDA graph capture: plan outside (or under fiattn.plan_only()),
capture the run, re-plan before each replay.

Library: $FIATTN_LIBRARY, else the bundled libfiattn.so, else the source tree's build/.
"""
from . import _capi as capi
from ._capi import library_path, status_name
from ._engine import (clear_plan_cache, device_plan_status, device_planning, plan_only,
                      release_workspace)
from ._version import version as __version__
from .errors import (FiattnError, FiattnNotImplementedError, FiattnValueError,
                     WorkspaceTooSmallError)
from . import decode, merge, mla, prefill, xqa  # noqa: E402  (no torch import at load)
from .merge import merge_state, merge_states
from .prefill import FP4Tensor

__all__ = ["capi", "library_path", "status_name", "workspace_size", "clear_plan_cache",
           "plan_only", "device_planning", "device_plan_status", "release_workspace",
           "FiattnError", "FiattnNotImplementedError",
           "FiattnValueError", "WorkspaceTooSmallError", "decode", "merge", "mla",
           "prefill", "xqa", "merge_state", "merge_states", "FP4Tensor", "__version__"]

_KINDS = {"mla_decode": capi.FI_KIND_MLA_DECODE, "gqa_decode": capi.FI_KIND_GQA_DECODE,
          "context": capi.FI_KIND_CONTEXT}
_DT = {"float32": capi.FI_DTYPE_F32, "float16": capi.FI_DTYPE_F16,
       "bfloat16": capi.FI_DTYPE_BF16, "float8_e4m3fn": capi.FI_DTYPE_E4M3}


def workspace_size(kind, max_batch, max_q_tokens, num_qo_heads, num_kv_heads=1, head_dim=None,
                   page_size=64, num_pages=1, dtype="bfloat16", num_ctas=132, variant=0):
    """Bytes of workspace_buffer a plan of these capacities needs (fi_workspace_size).

    Args:
        kind: "mla_decode", "gqa_decode" or "context".
        max_batch, max_q_tokens: largest batch / sum of query tokens planned.  The
            functional APIs round both up to powers of two (>= 8) when the buffer allows.
        num_qo_heads, num_kv_heads: heads (MLA: kv heads 1).
        head_dim: GQA / context head dim (qk = vo); MLA uses 576 / 512.
        page_size, num_pages: cache geometry.  page_size can pick the tile table row
            (heads 16 on a 16-bit cache: 16-row tiles from 64-token pages on, 64-row ones
            below), and with it the size: pass the one the calls will use.
        dtype: torch dtype name of q / kv / out.
        num_ctas: persistent grid (the GPU's SM count: 132 on an H100 / H200).
    Returns: int bytes.  Pure host computation; no torch, no GPU needed.
    Raises: FiattnValueError for unsupported caps (status name in the message).
    """
    c = capi.fi_caps()
    c.kind = _KINDS[kind]
    c.max_batch, c.max_q_tokens = max_batch, max_q_tokens
    c.num_pages, c.page_size = num_pages, page_size
    c.num_qo_heads, c.num_kv_heads = num_qo_heads, num_kv_heads
    if kind == "mla_decode":
        c.head_dim_qk, c.head_dim_vo = 576, 512
    else:
        c.head_dim_qk = c.head_dim_vo = head_dim
    c.q_dtype = c.kv_dtype = c.o_dtype = _DT[str(dtype).replace("torch.", "")]
    c.num_ctas, c.variant = num_ctas, variant
    return capi.workspace_size(c)
