"""Context (prefill) attention: fiattn's drop-in for
``flashinfer.prefill.trtllm_batch_context_with_kv_cache``.

Computed per query row i of request b and query head h (KV head h // (H_q / H_kv)), the
request's q_len query rows aligned to the end of its kv_len keys (the last q_len tokens of
the KV range are the new ones; the rest is a cached prefix; fiattn_run.h)::

    p   = kv_len - q_len + i                      the row's position in the KV sequence
    j   in [max(0, p - window_left), p]           its keys (window_left -1: [0, p])
    s_j = bmm1_scale * (q . k_j)
    out = bmm2_scale * sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink_h))

Mixed prefill + decode is the same call: a request with q_len 1 is a decode step (its one
row sees all kv_len keys), so prompt chunks and decodes go in one batch, planned as one
work list and run in one launch.  Requests with q_len 0 (nothing to compute) and kv_len 0
(rows get zeros) are accepted too.

Algorithm: fiattn's host planner cuts every request into query tiles x KV chunks and
balances them over a persistent grid (split-k pieces merged in the same launch, in split
order: deterministic); the GPU context family runs the plan (fi_run, FI_KIND_CONTEXT);
CPU tensors run the same plan on the C reference executor (fi_ref_run).

NVFP4 KV (the reference's kv_block_scales): values e2m1 packed two a byte (uint8, last dim
head_dim / 2, low nibble = the even element), one e4m3 block scale per 16 elements
(kv_block_scales, last dim head_dim / 16); element = e2m1 x scale, converted exactly to the
query's dtype in the kernel.  The tensor-wide second level (global) scale of NVFP4 is not
an argument: as in the reference, fold K's into bmm1_scale and V's into bmm2_scale.
"""
import math
import os

from . import _capi as C
from . import _engine as E
from ._common import (NUM, check_block_tables, check_lengths, fill_tensor, finite_scalar, flat,
                      last_i32, num_ctas_for, require_device, set_pdl, set_scale, set_sinks,
                      sig_arg)
from ._paged import fill_paged_kv, nvfp4_dtypes, record_paged_call, unpack_kv
from ._torch import check_tensor, fi_dtype, float_dtypes, fp8_dtypes, torch
from .errors import FiattnNotImplementedError

__all__ = ["trtllm_batch_context_with_kv_cache", "FP4Tensor"]


class FP4Tensor:
    """An NVFP4 tensor, as FlashInfer's ``flashinfer.utils.FP4Tensor`` (same constructor):
    what trtllm_batch_context_with_kv_cache returns for out_dtype="nvfp4", and the
    preallocated `out` it accepts.

    Attributes:
        data: uint8 [num_tokens, num_qo_heads, head_dim // 2], two e2m1 codes a byte, low
            nibble first (element 2k in bits 0..3 of byte k).
        scale: float8_e4m3fn [>= scale_start_index + num_tokens, num_qo_heads * head_dim //
            16], one scale a block of 16 consecutive elements of a (token, head) row, row
            (scale_start_index + token), column head * head_dim // 16 + block.  fiattn
            writes this plain row-major (linear) layout; FlashInfer's trtllm-gen kernels
            write the 128 x 4 swizzled layout of the same shape, so these bytes are not
            interchangeable with theirs.
        scale_start_index: the scale row of token 0 (FlashInfer's, for outputs of several
            calls sharing one scale tensor).
        original_shape: the unpacked shape (the query's), or None.
    Dequantised value: e2m1(code) x float(scale) / o_sf_scale (include/fiattn_run.h)."""

    def __init__(self, data, scale, scale_start_index=0, original_shape=None):
        self.data = data
        self.scale = scale
        self.scale_start_index = scale_start_index
        self.original_shape = original_shape

_FAMILY = "context (prefill)"
# pinned host buffers (PlanEntry.host_i32 slots) of the arrays the host planner reads
_LENS = (("cum_seq_lens_q", "cum_q"), ("cum_seq_lens_kv", "cum_kv"))


def trtllm_batch_context_with_kv_cache(query, kv_cache, workspace_buffer, block_tables,
                                       seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
                                       batch_size, cum_seq_lens_q, cum_seq_lens_kv,
                                       window_left=-1, out=None, out_dtype=None,
                                       o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND",
                                       enable_pdl=None, sinks=None, kv_block_scales=None,
                                       skip_softmax_threshold_scale_factor=None,
                                       uses_shared_paged_kv_idx=True):
    """Causal context attention over a paged KV cache (cumulative-lengths form): prefill,
    chunked prefill over a cached prefix, and mixed prefill + decode batches.

    A batch of B requests; request b has q_len = cum_seq_lens_q[b + 1] - cum_seq_lens_q[b]
    query rows (query rows cum_seq_lens_q[b] ...) and kv_len = cum_seq_lens_kv[b + 1] -
    cum_seq_lens_kv[b] keys in its pages, the new tokens' K / V already written there;
    q_len <= kv_len unless kv_len is 0.  Mixed batch: decoding requests are requests with
    q_len 1 (and kv_len = their context + 1); put them beside prompt chunks in one call.

    Args:
        query: [num_tokens, num_qo_heads, head_dim], num_tokens >= cum_seq_lens_q[-1]
            (rows past it are not read, and not written in out).  GPU: bf16 / fp16,
            head_dim 64 / 128 / 256, num_qo_heads = group x num_kv_heads with group 1..16;
            CPU: fp32 / fp16 / bf16 (fp8 e4m3 / e5m2 dequantised exactly).  Last dim
            contiguous; token and head strides free.
        kv_cache: one tensor [num_pages, 1 or 2, H_kv, page_size, head_dim] (HND) or
            [num_pages, 1 or 2, page_size, H_kv, head_dim] (NHD) (1: K and V are the same
            tensor), or a tuple (k_cache, v_cache) of [num_pages, H_kv, page_size,
            head_dim] (HND) / [num_pages, page_size, H_kv, head_dim] (NHD); read in place
            through its strides (page and head strides free, head_dim contiguous).  dtype:
            query's or fp8 e4m3 on the GPU (converted exactly to the query's dtype for the
            matmuls; its dequantisation scale folded into bmm1_scale / bmm2_scale by the
            caller), or NVFP4 on the GPU: uint8 (or float4_e2m1fn_x2) with last dim
            head_dim / 2 bytes, two e2m1 values a byte, low nibble first, kv_block_scales
            required; fp32 / fp16 / bf16 / fp8 on the CPU (NVFP4 there:
            FiattnNotImplementedError).  page_size 16 / 32 / 64 / 128 (the CPU also 1).
        workspace_buffer: CUDA buffer (any dtype) for the plan and split partials, >=
            fiattn.workspace_size("context", ...) bytes (about 18 MiB at 32 heads, d128,
            16k query tokens, 132 CTAs; WorkspaceTooSmallError otherwise), 256-byte aligned,
            need not be zeroed; its plan is cached, keep using the same buffer.  CPU: any
            tensor (the plan cache's key).
        block_tables: int32 [batch_size, max_pages_per_seq] (uses_shared_paged_kv_idx=True)
            or [batch_size, 2, max_pages_per_seq] (False: K pages in [:, 0], V pages in
            [:, 1]), contiguous.  On the query's device: read by the kernel only (no copy,
            no sync; page indices not checked on the host, an index >= num_pages is the
            caller's error as in FlashInfer); a CPU table is checked by the planner.
        seq_lens: int32 / uint32 [batch_size] kv_len per request (tokens, the new ones
            included); must equal the cum_seq_lens_kv differences (FiattnValueError
            FI_ERR_INCONSISTENT_LENGTHS).  Any device: read on the host.
        max_q_len, max_kv_len: accepted for compatibility; not needed.
        bmm1_scale: float or one-element float32 tensor on the query's device (read at run
            time, may change between graph replays): the logit scale in natural units
            (softmax scale and any q / k dequantisation).
        bmm2_scale: float or one-element float32 tensor: multiplies the output (an fp8
            output's 1 / o_scale goes here, as in the reference).
        batch_size: int, number of requests (block_tables' first dim).
        cum_seq_lens_q, cum_seq_lens_kv: int32 / uint32 [batch_size + 1] prefix sums of
            q_len and kv_len (first entry 0, non-decreasing).  Read on the host: CPU
            tensors cost nothing, CUDA tensors one device-to-host copy and a stream
            synchronisation per call (pass CPU copies to avoid it).
        window_left: -1, or keys p - window_left .. p for the row at position p.
        out: optional [num_tokens, num_qo_heads, head_dim], written in place (rows up to
            cum_seq_lens_q[-1]); dtype out_dtype when given; the query's dtype or fp8 e4m3
            on the GPU, fp32 / fp16 / bf16 on the CPU.  Or an FP4Tensor (NVFP4 output, GPU
            only): data uint8 [num_tokens, num_qo_heads, head_dim // 2] (last dim
            contiguous), scale float8_e4m3fn [>= scale_start_index + num_tokens,
            num_qo_heads * head_dim // 16] (last dim contiguous; the linear layout, see
            FP4Tensor), both on the query's device.  Allocated when None.
        out_dtype: None (out's dtype, else query's; bf16 for an fp8 query; "nvfp4" for an
            FP4Tensor out), a torch dtype or its name ("bfloat16", "float8_e4m3fn", ...),
            or "nvfp4" (NVFP4 output, GPU only: on CPU tensors NotImplementedError).
            ValueError when it disagrees with out's dtype.
        o_sf_scale: NVFP4 output: the global scale g, a finite float > 0 (required):
            block scale s = e4m3((amax / 6) x g), codes e2m1(x x g / s) (fiattn_run.h,
            TensorRT-LLM's recipe), so x ~ e2m1 x s / g.  ValueError when missing or not
            positive; with another output NotImplementedError ("NVFP4") when given.
        o_sf_vec_size: NVFP4 output: None or 16 (ValueError otherwise).
        kv_layout: "HND" (default) or "NHD".
        enable_pdl: programmatic dependent launch; None = on for CUDA.
        sinks: optional float32 [num_qo_heads] (or a one-element list of it) on the query's
            device: per-head logits added to the softmax denominator only.
        kv_block_scales: NVFP4 KV only (ValueError with another cache, or when an NVFP4
            cache comes without them): the e4m3 block scales, one per 16 elements of
            head_dim: a tuple (k_scales, v_scales) of [num_pages, H_kv, page_size,
            head_dim / 16] (HND) / [num_pages, page_size, H_kv, head_dim / 16] (NHD), or
            one tensor [num_pages, 2, ...] (K at [:, 0], V at [:, 1]) in kv_cache's
            layout; float8_e4m3fn or uint8 (e4m3 bits); on the query's device.  Element d
            of a row = e2m1(d) x scale[d // 16].  Read in place through strides (no copy,
            NHD included): base and page / token / head strides must be multiples of
            head_dim / 16 bytes (FiattnValueError FI_ERR_MISALIGNED_POINTER /
            FI_ERR_BAD_STRIDE otherwise); a shape that disagrees with the cache:
            ValueError; another dtype: TypeError.
        skip_softmax_threshold_scale_factor: None or 0: exact attention.  A float > 0:
            skip-softmax sparsity (BLASST, arXiv 2512.12087, as TensorRT-LLM's skip softmax):
            for each 64-row half of a 128-row tile, a block of 128 keys (64 at head_dim
            256) whose max term is under factor / kv_len of every row's running max
            (kv_len: the request's) is skipped (no exponentials, no P V); a row loses at
            most `factor` of its softmax mass relative to its largest term.  Larger is
            faster and less exact.  Negative, NaN or inf: ValueError.
        uses_shared_paged_kv_idx: see block_tables.

    Returns: out, [num_tokens, num_qo_heads, head_dim]; for NVFP4 output an FP4Tensor
        (data, scale, scale_start_index, original_shape = query.shape): the one passed as
        out, or a new one (scale [num_tokens, num_qo_heads * head_dim // 16], start 0).

    Raises: TypeError / ValueError before any C call (dtype, device, shape, a last dim not
        contiguous, out_dtype vs out, cum_seq_lens_q[-1] > num_tokens);
        FiattnValueError for a batch the planner refuses (fi_status name + request:
        lengths not matching, q_len > kv_len, more pages than the table row holds, ...);
        WorkspaceTooSmallError; NotImplementedError (FiattnNotImplementedError where the C
        library says so) for NVFP4 KV or NVFP4 output on the CPU, e5m2 KV on the GPU, a
        dtype combination the executor lacks; FiattnError for runtime failures.  Nothing
        is written on error.

    CUDA graphs: plan outside the capture, capture the call, then before each replay write
    the step's lengths into the same cum_seq_lens_q / cum_seq_lens_kv / seq_lens tensors
    and call again under ``with fiattn.plan_only():`` (re-plans, launches nothing); the
    captured kernel reads the new plan.  Capture with a query / out as large as the
    largest step (a later plan with more query tokens raises).  fiattn.device_planning()
    does not apply here: context batches are planned on the host.

    Repeat calls: a call with the same tensor layouts and options as an earlier successful
    one on the same workspace_buffer reuses the descriptors recorded then (data addresses,
    scalar scales and the lengths refreshed; the lengths still checked by the planner); it
    allocates nothing unless out is None.
    """
    skip = _skip_factor(skip_softmax_threshold_scale_factor)
    key = None
    if (type(bmm1_scale) in NUM and type(bmm2_scale) in NUM and o_sf_scale is None
            and o_sf_vec_size is None):
        sig = E.tensor_sig
        try:
            key = ("context", sig(query), sig_arg(kv_cache, sig), sig(block_tables),
                   sig(seq_lens), sig(cum_seq_lens_q), sig(cum_seq_lens_kv),
                   None if out is None else sig(out), sig_arg(sinks, sig),
                   sig_arg(kv_block_scales, sig), out_dtype, batch_size, window_left,
                   kv_layout, enable_pdl, uses_shared_paged_kv_idx)
            entry, fast = E.lookup(workspace_buffer, key)
        except (AttributeError, TypeError):
            key = fast = None
        if fast is not None and (fast.cuda or fast.env == os.environ.get("FIATTN_CPU_CTAS")):
            a = fast.args
            a.bmm1_scale = finite_scalar(bmm1_scale, "bmm1_scale")
            a.bmm2_scale = finite_scalar(bmm2_scale, "bmm2_scale")
            a.skip_softmax_threshold_scale_factor = skip
            ts = ((query,) + flat(kv_cache) + (block_tables, seq_lens, cum_seq_lens_q,
                                               cum_seq_lens_kv) + flat(sinks)
                  + flat(kv_block_scales) + (out,))
            return E.fast_call(entry, fast, ts)
    return _checked(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
                    bmm2_scale, batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left, out,
                    out_dtype, o_sf_scale, o_sf_vec_size, kv_layout, enable_pdl, sinks,
                    kv_block_scales, uses_shared_paged_kv_idx, key, skip)


def _skip_factor(f):
    """skip_softmax_threshold_scale_factor as the C field: None -> 0.0 (exact); else a
    finite float >= 0 (ValueError otherwise)."""
    if f is None:
        return 0.0
    v = float(f)
    if not math.isfinite(v) or v < 0.0:
        raise ValueError(f"fiattn: skip_softmax_threshold_scale_factor must be a finite float "
                         f">= 0, got {f!r}")
    return v


def _is_fp4(out, out_dtype):
    """NVFP4 output asked for: out_dtype "nvfp4", or an FP4Tensor-like out (.data + .scale:
    fiattn's or FlashInfer's class)."""
    fp4_out = (out is not None and not isinstance(out, torch().Tensor)
               and hasattr(out, "data") and hasattr(out, "scale"))
    return (isinstance(out_dtype, str) and out_dtype == "nvfp4") or fp4_out


def _not_nvfp4_out(out, out_dtype, o_sf_scale, o_sf_vec_size):
    """FiattnNotImplementedError for the NVFP4 output arguments given for another output
    (NVFP4 output on the CPU: _checked, after its arguments are checked)."""
    if not _is_fp4(out, out_dtype) and (o_sf_scale is not None or o_sf_vec_size is not None):
        raise FiattnNotImplementedError(
            "fiattn: o_sf_scale / o_sf_vec_size belong to NVFP4 output (out_dtype 'nvfp4'); "
            "another output has no NVFP4 block scales")


def _fp4_out(out, out_dtype, o_sf_scale, o_sf_vec_size, shape, device):
    """The NVFP4 output: (FP4Tensor, data, scale view [rows, H, D / 16] of its scale rows,
    g).  ValueError / TypeError for a wrong argument (nothing written)."""
    t = torch()
    rows, H, D = shape
    if out_dtype is not None and not (isinstance(out_dtype, str) and out_dtype == "nvfp4"):
        raise ValueError(f"fiattn: out is an FP4Tensor but out_dtype is {out_dtype!r}")
    if isinstance(out, t.Tensor):
        raise ValueError("fiattn: out_dtype 'nvfp4' takes an FP4Tensor out (data + scale), "
                         "got a torch.Tensor")
    if o_sf_vec_size not in (None, 16):
        raise ValueError(f"fiattn: o_sf_vec_size must be 16 (or None) for NVFP4 output, got "
                         f"{o_sf_vec_size!r}")
    if o_sf_scale is None:
        raise ValueError("fiattn: NVFP4 output needs o_sf_scale (the global scale)")
    g = finite_scalar(o_sf_scale, "o_sf_scale")
    if not g > 0.0:
        raise ValueError(f"fiattn: o_sf_scale must be > 0, got {g}")
    nb = H * D // 16
    if out is None:
        data = t.empty((rows, H, D // 2), dtype=t.uint8, device=device)
        scale = t.empty((rows, nb), dtype=t.float8_e4m3fn, device=device)
        out = FP4Tensor(data, scale, 0, tuple(shape))
    data, scale, start = out.data, out.scale, out.scale_start_index
    check_tensor(data, "out.data", (t.uint8,), device, 3)
    if tuple(data.shape) != (rows, H, D // 2):
        raise ValueError(f"fiattn: out.data must be {(rows, H, D // 2)}, got {tuple(data.shape)}")
    check_tensor(scale, "out.scale", (t.float8_e4m3fn,), device, 2)
    if not isinstance(start, int) or start < 0:
        raise ValueError(f"fiattn: out.scale_start_index must be an int >= 0, got {start!r}")
    if scale.shape[1] != nb or scale.shape[0] < start + rows:
        raise ValueError(f"fiattn: out.scale must be [>= {start + rows}, {nb}] (scale_start_index "
                         f"{start} + {rows} tokens, H * head_dim / 16), got {tuple(scale.shape)}")
    sview = scale[start:start + rows].unflatten(1, (H, D // 16))
    return out, data, sview, g


def _out_dtype(query, out, out_dtype):
    """The output dtype by the reference's rule: out_dtype, else out's, else query's (bf16
    for an fp8 query).  TypeError for an unknown name; ValueError when out_dtype and out's
    dtype disagree."""
    t = torch()
    if isinstance(out_dtype, str):
        dt = getattr(t, out_dtype.replace("torch.", ""), None)
        if not isinstance(dt, t.dtype):
            raise TypeError(f"fiattn: unknown out_dtype {out_dtype!r}")
        out_dtype = dt
    elif out_dtype is not None and not isinstance(out_dtype, t.dtype):
        raise TypeError(f"fiattn: out_dtype must be a torch dtype or its name, got "
                        f"{type(out_dtype).__name__}")
    if out is not None and isinstance(out, t.Tensor):
        if out_dtype is not None and out.dtype != out_dtype:
            raise ValueError(f"fiattn: out has dtype {out.dtype} but out_dtype is {out_dtype}")
        return out.dtype
    if out_dtype is not None:
        return out_dtype
    return query.dtype if query.dtype in float_dtypes() else t.bfloat16


def _checked(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale, bmm2_scale,
             batch_size, cum_seq_lens_q, cum_seq_lens_kv, window_left, out, out_dtype,
             o_sf_scale, o_sf_vec_size, kv_layout, enable_pdl, sinks, kv_block_scales,
             uses_shared_paged_kv_idx, key, skip=0.0):
    """The checked call; records a FastCall under `key` (when not None) on success."""
    t = torch()
    check_tensor(query, "query", float_dtypes() + fp8_dtypes(), None, 3)
    device = query.device
    require_device(device)
    _not_nvfp4_out(out, out_dtype, o_sf_scale, o_sf_vec_size)
    rows, H, D = query.shape
    fp4 = _is_fp4(out, out_dtype)
    if fp4:
        fp4_res, out, o_sf, o_sf_g = _fp4_out(out, out_dtype, o_sf_scale, o_sf_vec_size,
                                              (rows, H, D), device)
        if device.type != "cuda":
            raise FiattnNotImplementedError(
                "fiattn: NVFP4 output runs on the GPU only (the CPU reference has no NVFP4 "
                "store)")
        o_dt = t.uint8
    else:
        o_dt = _out_dtype(query, out, out_dtype)
    B = int(batch_size)
    kpart, vpart = unpack_kv(kv_cache, kv_layout, device,
                             float_dtypes() + fp8_dtypes() + nvfp4_dtypes())
    num_pages, page_size, Hkv, _ = kpart[1]
    if H % Hkv:
        raise ValueError(f"fiattn: {H} query heads are not a multiple of {Hkv} KV heads")
    split = not uses_shared_paged_kv_idx
    check_block_tables(block_tables, "block_tables", device, B, 3 if split else 2)
    if split and block_tables.shape[1] != 2:
        raise ValueError("fiattn: a 3-D block_tables must be [batch_size, 2, max_pages]")
    sl = check_lengths(seq_lens, "seq_lens", B)
    cq = check_lengths(cum_seq_lens_q, "cum_seq_lens_q", B + 1)
    ck = check_lengths(cum_seq_lens_kv, "cum_seq_lens_kv", B + 1)
    if not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"fiattn: window_left must be an int >= -1, got {window_left}")
    out_alloc = None
    if fp4:
        pass  # out is the FP4Tensor's data, checked by _fp4_out
    elif out is None:
        if o_dt not in float_dtypes() + fp8_dtypes():
            raise TypeError(f"fiattn: out_dtype {o_dt} is not supported")
        out_alloc = ((rows, H, D), o_dt)
        out = t.empty((rows, H, D), dtype=o_dt, device=device)
    else:
        check_tensor(out, "out", float_dtypes() + fp8_dtypes(), device, 3)
        if tuple(out.shape) != (rows, H, D):
            raise ValueError(f"fiattn: out must be {(rows, H, D)}, got {tuple(out.shape)}")
    args = C.fi_attn_args()
    fill_tensor(args.q, query, [rows, H, D], query.stride())
    nvfp4, sf_parts = fill_paged_kv(args, kpart, vpart, kv_block_scales, kv_layout, device, D,
                                    ("kv_block_scales", "k_scales", "v_scales"))
    kv_fi = C.FI_DTYPE_E2M1 if nvfp4 else fi_dtype(kpart[0].dtype)
    fill_tensor(args.page_table, block_tables, list(block_tables.shape), block_tables.stride())
    args.page_table.dtype = C.FI_DTYPE_I32
    if fp4:  # e2m1 codes described in bytes; scales [rows, H, D / 16] e4m3 bytes
        args.out.set(out.data_ptr(), C.FI_DTYPE_E2M1, [rows, H, D // 2], out.stride())
        fill_tensor(args.o_sf, o_sf, [rows, H, D // 16], o_sf.stride())
        args.o_sf_scale = o_sf_g
        args.o_sf_vec_size = 16
    else:
        fill_tensor(args.out, out, [rows, H, D], out.stride())
    keep = (set_scale(args, "bmm1_scale", bmm1_scale, device, "bmm1_scale"),
            set_scale(args, "bmm2_scale", bmm2_scale, device, "bmm2_scale"),
            set_sinks(args, sinks, H, device), sf_parts)
    args.o_scale = 1.0  # the reference folds an fp8 output's scale into bmm2_scale
    args.skip_softmax_threshold_scale_factor = skip
    set_pdl(args, enable_pdl, device)
    caps = C.fi_caps()
    caps.kind = C.FI_KIND_CONTEXT
    caps.num_pages, caps.page_size = num_pages, page_size
    caps.num_qo_heads, caps.num_kv_heads = H, Hkv
    caps.head_dim_qk = caps.head_dim_vo = D
    caps.q_dtype, caps.kv_dtype = fi_dtype(query.dtype), kv_fi
    caps.o_dtype = C.FI_DTYPE_E2M1 if fp4 else fi_dtype(out.dtype)
    caps.num_ctas = num_ctas_for(device)

    b = C.fi_batch()
    built = []

    def make_batch(entry):
        built.append(1)
        bt = entry.host_page_table(block_tables)
        hl = entry.host_i32("seq_lens", sl)
        hq, hk = (entry.host_i32(slot, x) for (_, slot), x in zip(_LENS, (cq, ck)))
        entry.sync()
        b.form = C.FI_FORM_CUM_SEQ_LENS
        b.batch_size = B
        # an empty batch's empty arrays have no address: any valid one (nothing is read)
        b.block_tables = bt.data_ptr() or hq.data_ptr()
        b.max_pages_per_seq = block_tables.shape[-1]
        b.kv_split_pages = 1 if split else 0
        b.seq_lens = hl.data_ptr() or hq.data_ptr()
        b.cum_seq_lens_q = hq.data_ptr()
        b.cum_seq_lens_kv = hk.data_ptr()
        b.causal = 1
        b.window_left = window_left
        total = last_i32(hq)
        if total > rows:
            raise E.q_rows_error(total, rows)
        return b, total, (bt, hl, hq, hk)

    dts = (query.dtype, "nvfp4" if nvfp4 else kpart[0].dtype, out.dtype)
    if rows == 0:  # nothing to compute (an empty tensor has no address): the batch checked
        if not (device.type == "cuda" and E.cuda().capturing()):
            with E.plan_only():
                E.launch(workspace_buffer, caps, B, 1, device, make_batch, args, _FAMILY, dts, 0)
        return fp4_res if fp4 else out
    # recorded for repeat calls (an empty batch always takes this path)
    def record(entry, dev=None):
        if not built:  # never planned here (a captured call): the slow path stays
            return
        # the tensor order of the fast path: query, kv_cache (1 or 2), block_tables,
        # seq_lens, cum_seq_lens_q, cum_seq_lens_kv, sinks (0 or 1), kv_block_scales (0, 1
        # or 2), out
        ts = ((query,) + flat(kv_cache) + (block_tables, seq_lens, cum_seq_lens_q,
                                           cum_seq_lens_kv) + flat(sinks)
              + flat(kv_block_scales) + (out,))
        lens = tuple((field, x, slot) for (field, slot), x in
                     zip(_LENS, (cum_seq_lens_q, cum_seq_lens_kv)))
        record_paged_call(entry, key, args, b, ts, kpart, vpart, block_tables, seq_lens,
                          sinks, rows, rows, out_alloc, _FAMILY, dts, device, sf_parts,
                          lens=lens, total_from=0)
    E.launch(workspace_buffer, caps, B, max(rows, 1), device, make_batch, args, _FAMILY, dts,
             rows, record=record if key is not None and B > 0 and not fp4 else None)
    del keep
    return fp4_res if fp4 else out
