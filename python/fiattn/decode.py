"""GQA decode: fiattn's drop-in for ``flashinfer.decode.xqa_batch_decode_with_kv_cache``.

Computed per query row and head h (kv head h // (H_q / H_kv)), fiattn_run.h::

    s_j = bmm1_scale * (q . k_j),  keys j in the row's causal / window range
    out = bmm2_scale * sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink_h))

stored as out / o_scale for an fp8 output.  xqa_batch_decode_with_lse (fiattn's extension,
same arguments plus ``lse``) also returns lse = log(sum_j exp(s_j) + exp(sink_h)) (natural
log, float32 [tokens, H_q]: fiattn.merge_states' convention), for context-parallel decode
(examples/cp_decode.py).  Algorithm: fiattn's host planner (balanced
split-k, flash-decoding split-KV merge) and the GQA decode GPU family (fi_run, kind
FI_KIND_GQA_DECODE: FlashAttention-3-style producer / consumer pipeline, fp16 matmuls for
fp8 and NVFP4 KV, which are dequantised in the kernel).  CPU tensors run the C reference
executor (bf16 / fp16 / fp32 / fp8 KV; NVFP4 raises FiattnNotImplementedError there).

NVFP4 KV (the reference's kv_cache_sf): values e2m1 packed two a byte (uint8, last dim
head_dim / 2, low nibble = the even element), one e4m3 block scale per 16 elements
(kv_cache_sf, last dim head_dim / 16); element = e2m1 x scale.  The tensor-wide second
level (global) scale of NVFP4 is not an argument: as in the reference, fold K's into
bmm1_scale and V's into bmm2_scale.
"""
import os

from . import _capi as C
from . import _engine as E
from ._common import (NUM, check_block_tables, check_lengths, finite_scalar, fill_tensor, flat,
                      num_ctas_for, require_device, set_pdl, set_scale, set_sinks, sig_arg)
from ._paged import fill_paged_kv, nvfp4_dtypes, record_paged_call, unpack_kv
from ._torch import check_tensor, fi_dtype, float_dtypes, fp8_dtypes, torch
from .errors import FiattnNotImplementedError, error_for_status

__all__ = ["xqa_batch_decode_with_kv_cache", "xqa_batch_decode_with_lse"]

_FAMILY = "GQA decode"
# gqa_decode_rows8's tile_rows (executor/core/registry.c, row 2; FI_GQA_SWAP_ROWS): requests
# of at most this many rows (group x q_len_per_req) plan on that row
_ROWS8 = 8


def check_causal_mask(mask, q_len):
    """Accept the speculative-decoding mask only when it is the causal one fiattn computes.

    Forms: bool / uint8 [..., q_len, q_len] (True / 1 = may attend), or bit-packed integer
    rows [..., q_len, W] (uint16 / int16 with W >= q_len / 16, uint32 / int32 with
    W >= q_len / 32), bit c of row r (least significant first) set when row r attends
    draft token c.  The causal mask is row r attending tokens 0..r.  Any other mask raises
    FiattnNotImplementedError.  Reads the mask on the host (a device mask costs a sync)."""
    if mask is None:
        return
    t = torch()
    m = mask.detach().to("cpu")
    if m.dim() < 2 or m.shape[-2] != q_len:
        raise ValueError(f"fiattn: mask must be [..., {q_len}, ...], got {tuple(mask.shape)}")
    causal = t.ones(q_len, q_len, dtype=t.bool).tril()
    if m.dtype in (t.bool, t.uint8) and m.shape[-1] == q_len:
        dense = m.to(t.bool)
    elif m.dtype in (t.int16, t.int32, t.int64) + tuple(
            getattr(t, n) for n in ("uint16", "uint32") if hasattr(t, n)):
        bits = {t.int16: 16, t.int32: 32, t.int64: 64}.get(m.dtype, 16 if "16" in str(m.dtype) else 32)
        if m.shape[-1] * bits < q_len:
            raise ValueError(f"fiattn: packed mask rows of {m.shape[-1]} x {bits} bits cannot "
                             f"hold {q_len} tokens")
        w = m.to(t.int64) & ((1 << bits) - 1)
        cols = []
        for c in range(q_len):
            cols.append(((w[..., c // bits] >> (c % bits)) & 1).bool())
        dense = t.stack(cols, dim=-1)
    else:
        raise TypeError(f"fiattn: mask dtype {m.dtype} not understood")
    if not bool((dense == causal).all()):
        raise FiattnNotImplementedError("fiattn: only the causal speculative-decoding mask "
                                        "is implemented (row r attends draft tokens 0..r)")


def xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens,
                                   max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1,
                                   out=None, sinks=None, kv_layout="NHD", enable_pdl=None,
                                   q_len_per_req=1, o_scale=1.0, mask=None, kv_cache_sf=None):
    """GQA decode over a paged KV cache (block-table form), XQA-style.

    Args:
        query: [batch_size * q_len_per_req, num_qo_heads, head_dim]; bf16 / fp16 (GPU),
            fp32 / fp16 / bf16 (CPU); head_dim 64 / 128 / 256; num_qo_heads a multiple of
            num_kv_heads with group size 1..16.  Last dim contiguous.
        kv_cache: one tensor [num_pages, 1 or 2, page_size, H_kv, W] (NHD) or
            [num_pages, 1 or 2, H_kv, page_size, W] (HND) (1: K and V are the same),
            or a tuple (k_cache, v_cache) of [num_pages, page_size, H_kv, W] (NHD) /
            [num_pages, H_kv, page_size, W] (HND); read in place through strides (no copy).
            dtype: query's, fp8 e4m3 (GPU; its dequantisation scale folded into bmm1 /
            bmm2), or NVFP4: uint8 (or float4_e2m1fn_x2) with W = head_dim / 2 bytes, two
            e2m1 values a byte, low nibble first, kv_cache_sf required.  Otherwise
            W = head_dim.  page_size 1 / 16 / 32 / 64 / 128.
        workspace_buffer: device buffer holding the plan and split partials, at least
            fiattn.workspace_size(...) bytes (WorkspaceTooSmallError otherwise), 256-byte
            aligned; plan cached per buffer; caller-owned.
        block_tables: int32 [batch_size, max_pages_per_seq], contiguous, on the device
            (read by the kernel only: no copy, no sync; its page indices are not checked
            on the host, an index >= the cache's pages is the caller's error as in
            FlashInfer) or on the CPU (the planner checks the used indices).
        seq_lens: uint32 / int32 [batch_size] KV lengths (tokens, query rows included);
            read on the host (device tensor: one copy + stream sync).
        max_seq_len: accepted for compatibility; not needed.
        bmm1_scale / bmm2_scale: float or one-element float32 device tensor (run-time),
            logit scale and output scale, natural units: s = bmm1_scale * q.k over the
            dequantised K, out = bmm2_scale * sum p v over the dequantised V.
        window_left: -1 or the left window: the query at position p sees [p - window_left, p].
        out: optional [batch_size * q_len_per_req, num_qo_heads, head_dim] (query's dtype,
            or fp8 e4m3 on the GPU), written in place; allocated (query's dtype) when None.
        sinks: optional float32 [num_qo_heads] logits added to the denominator.
        kv_layout: "NHD" or "HND".  enable_pdl: None = on for CUDA.
        q_len_per_req: query rows per request (MTP / speculative depth) 1..8, causal.
        o_scale: fp8 output only: stored = out / o_scale.
        mask: None, or the causal speculative mask (see check_causal_mask); another mask
            raises FiattnNotImplementedError.  Not inspected during CUDA graph capture.
        kv_cache_sf: NVFP4 KV only (ValueError otherwise): the e4m3 block scales, one per
            16 elements of head_dim, in kv_cache's form and layout with last dim
            head_dim / 16: one tensor [num_pages, 1 or 2, page_size, H_kv, D / 16] (NHD) /
            [num_pages, 1 or 2, H_kv, page_size, D / 16] (HND), or a tuple (k_sf, v_sf) of
            4-D tensors; uint8 (e4m3 bits, the reference's dtype) or float8_e4m3fn.
            Element d of a row = e2m1(d) x sf[d // 16]; the global scale goes into
            bmm1_scale (K) / bmm2_scale (V).  Base and page / token / head strides must be
            multiples of D / 16 bytes (FiattnValueError FI_ERR_MISALIGNED_POINTER /
            FI_ERR_BAD_STRIDE otherwise).

    Returns: out.
    Raises: TypeError / ValueError (before any C call), FiattnValueError (rejected batch or
        layout: fi_status name + request), FiattnNotImplementedError (a dtype combination
        the executor lacks, e.g. NVFP4 or fp8 out on the CPU reference), FiattnError.
        Nothing is written on error.
    Graphs: as trtllm_batch_decode_with_kv_cache_mla (fiattn.plan_only() before replays).
    Repeat calls: a call with the same tensor layouts and options as an earlier successful
    one on the same workspace_buffer reuses the descriptors recorded then (only data
    addresses, scalar scales and the lengths are refreshed; lengths and mask still checked).
    Kernel: group x q_len_per_req <= 8 rows a request run on tiles of 8 rows (the kernel
    of the transposed consumers alone), more on 64-row tiles; the plan is made for one of
    the two, so a call of the other kind re-plans (outside graph capture).
    LSE: fiattn.decode.xqa_batch_decode_with_lse (same arguments) also returns it.
    """
    return _decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
                   bmm2_scale, window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req,
                   o_scale, mask, kv_cache_sf, None)


def xqa_batch_decode_with_lse(query, kv_cache, workspace_buffer, block_tables, seq_lens,
                              max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1,
                              out=None, sinks=None, kv_layout="NHD", enable_pdl=None,
                              q_len_per_req=1, o_scale=1.0, mask=None, kv_cache_sf=None, *,
                              lse=None):
    """GQA decode that also returns each row's log-sum-exp (fiattn's extension; the
    reference xqa_batch_decode_with_kv_cache returns no LSE).  One implementation with
    xqa_batch_decode_with_kv_cache: same arguments, checks, plan cache, GPU / CPU paths.

    Args:
        query ... kv_cache_sf: as xqa_batch_decode_with_kv_cache (positional order and
            defaults identical, so a call converts by renaming the function).
        lse: optional float32 [batch_size * q_len_per_req, num_qo_heads] on query's device,
            last dim contiguous, caller-owned, written in place (not read); allocated when
            None.

    The LSE (fiattn_run.h, the convention of fiattn.merge_states): per query row and
    head h, natural log, float32,

        lse = log(sum_j exp(s_j) + exp(sink_h)),   s_j = bmm1_scale * (q . k_j)

    over the row's keys (causal / window range), in logit units (bmm1_scale applied,
    bmm2_scale and o_scale not); a row with no key and no sink has lse = -inf and out = 0.
    fiattn.merge_states(v, s) (base "e", the default) takes it as is; FlashInfer's
    base-2 LSE is lse / ln 2.

    Context parallelism (examples/cp_decode.py): run each GPU's disjoint part of every
    request's pages and merge the (out, lse) pairs with fiattn.merge_states.  The merge
    equals the whole-KV call when every part's rows see all its keys: q_len_per_req 1 and
    window_left -1 (the causal and window ranges are aligned to the end of each part's own
    keys), and sinks passed to one part only (each part's lse counts the sinks it gets).

    Returns: (out, lse): out as xqa_batch_decode_with_kv_cache returns it, lse the given or
        allocated tensor.  Under fiattn.plan_only() neither is written.
    Raises: as xqa_batch_decode_with_kv_cache; for lse before any C call: TypeError (not a
        tensor, not float32), ValueError (another device, last dim not contiguous), and
        FiattnValueError with status_name FI_ERR_SHAPE_MISMATCH (not [rows, num_qo_heads]).
        Nothing is written on error.
    """
    if lse is None:
        t = torch()
        check_tensor(query, "query", float_dtypes() + fp8_dtypes(), None, 3)
        lse = t.empty(tuple(query.shape[:2]), dtype=t.float32, device=query.device)
    out = _decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
                  bmm2_scale, window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req,
                  o_scale, mask, kv_cache_sf, lse)
    return out, lse


def _decode(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
            bmm2_scale, window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req,
            o_scale, mask, kv_cache_sf, lse):
    """Both public functions: the recorded fast path of a repeat call, else _checked.
    lse: None (not written) or a float32 tensor the caller checks in _checked."""
    qlen = 1 if q_len_per_req is None else q_len_per_req
    key = None
    if type(bmm1_scale) in NUM and type(bmm2_scale) in NUM and (
            o_scale is None or type(o_scale) in NUM):
        sig = E.tensor_sig
        try:
            key = ("gqa", sig(query), sig_arg(kv_cache, sig), sig(block_tables),
                   sig(seq_lens), None if out is None else sig(out),
                   sig_arg(sinks, sig), sig_arg(kv_cache_sf, sig), None if mask is None
                   else sig(mask), None if lse is None else sig(lse), window_left,
                   kv_layout, enable_pdl, qlen, E._device_planning())
            entry, fast = E.lookup(workspace_buffer, key)
        except (AttributeError, TypeError):
            key = fast = None
        if fast is not None and (fast.cuda or fast.env == os.environ.get("FIATTN_CPU_CTAS")):
            if mask is not None and qlen > 1 and not (
                    fast.cuda and E.cuda().capturing()):
                check_causal_mask(mask, qlen)
            a = fast.args
            a.bmm1_scale = finite_scalar(bmm1_scale, "bmm1_scale")
            a.bmm2_scale = finite_scalar(bmm2_scale, "bmm2_scale")
            a.o_scale = 1.0 if o_scale is None else float(o_scale)  # fi_run checks it
            ts = ((query,) + flat(kv_cache) + (block_tables, seq_lens) + flat(sinks)
                  + flat(kv_cache_sf) + flat(lse) + (out,))
            return E.fast_call(entry, fast, ts)
    return _checked(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
                    bmm2_scale, window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req,
                    o_scale, mask, kv_cache_sf, lse, key)


def _check_lse(lse, rows, heads, device):
    """lse: float32 [rows, heads] on device, last dim contiguous (fi_check_lse's rules,
    raised before any C call)."""
    t = torch()
    check_tensor(lse, "lse", (t.float32,), device, 2)
    if tuple(lse.shape) != (rows, heads):
        name = C.status_name(C.FI_ERR_SHAPE_MISMATCH)
        raise error_for_status(C.FI_ERR_SHAPE_MISMATCH, name,
                               f"fiattn: lse must be [{rows}, {heads}] (query rows, query "
                               f"heads), got {list(lse.shape)} ({name})")


def _checked(query, kv_cache, workspace_buffer, block_tables, seq_lens, bmm1_scale,
             bmm2_scale, window_left, out, sinks, kv_layout, enable_pdl, q_len_per_req,
             o_scale, mask, kv_cache_sf, lse, key):
    """The checked call; records a FastCall under `key` (when not None) on success."""
    t = torch()
    check_tensor(query, "query", float_dtypes() + fp8_dtypes(), None, 3)
    device = query.device
    require_device(device)
    qlen = 1 if q_len_per_req is None else int(q_len_per_req)
    if qlen < 1:
        raise ValueError(f"fiattn: q_len_per_req must be >= 1, got {q_len_per_req}")
    rows, H, D = query.shape
    if rows % qlen:
        raise ValueError(f"fiattn: query has {rows} rows, not a multiple of q_len_per_req {qlen}")
    B = rows // qlen
    kpart, vpart = unpack_kv(kv_cache, kv_layout, device,
                             float_dtypes() + fp8_dtypes() + nvfp4_dtypes())
    num_pages, page_size, Hkv, _ = kpart[1]
    if H % Hkv:
        raise ValueError(f"fiattn: {H} query heads are not a multiple of {Hkv} KV heads")
    check_block_tables(block_tables, "block_tables", device, B)
    seq_lens_arg = seq_lens
    seq_lens = check_lengths(seq_lens, "seq_lens", B)
    if not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"fiattn: window_left must be an int >= -1, got {window_left}")
    out_alloc = None
    if out is None:
        o_dt = query.dtype if query.dtype in float_dtypes() else t.bfloat16
        out_alloc = ((rows, H, D), o_dt)
        out = t.empty((rows, H, D), dtype=o_dt, device=device)
    else:
        check_tensor(out, "out", float_dtypes() + fp8_dtypes(), device, 3)
        if tuple(out.shape) != (rows, H, D):
            raise ValueError(f"fiattn: out must be {(rows, H, D)}, got {tuple(out.shape)}")
    if lse is not None:
        _check_lse(lse, rows, H, device)
    if qlen > 1 and not (device.type == "cuda" and E.cuda().capturing()):
        check_causal_mask(mask, qlen)
    args = C.fi_attn_args()
    fill_tensor(args.q, query, [rows, H, D], query.stride())
    nvfp4, sf_parts = fill_paged_kv(args, kpart, vpart, kv_cache_sf, kv_layout, device, D)
    kv_fi = C.FI_DTYPE_E2M1 if nvfp4 else fi_dtype(kpart[0].dtype)
    fill_tensor(args.page_table, block_tables, list(block_tables.shape), block_tables.stride())
    args.page_table.dtype = C.FI_DTYPE_I32
    fill_tensor(args.out, out, [rows, H, D], out.stride())
    if lse is not None:
        fill_tensor(args.lse, lse, [rows, H], lse.stride())
    keep = (set_scale(args, "bmm1_scale", bmm1_scale, device, "bmm1_scale"),
            set_scale(args, "bmm2_scale", bmm2_scale, device, "bmm2_scale"),
            set_sinks(args, sinks, H, device), sf_parts)
    args.o_scale = 1.0 if o_scale is None else float(o_scale)
    set_pdl(args, enable_pdl, device)
    caps = C.fi_caps()
    caps.kind = C.FI_KIND_GQA_DECODE
    caps.num_pages, caps.page_size = num_pages, page_size
    caps.num_qo_heads, caps.num_kv_heads = H, Hkv
    caps.head_dim_qk = caps.head_dim_vo = D
    caps.q_dtype, caps.kv_dtype, caps.o_dtype = fi_dtype(query.dtype), kv_fi, fi_dtype(out.dtype)
    caps.num_ctas = num_ctas_for(device)
    # the tile table row, by number: the rows-8 row (gqa_decode_rows8, the faster kernel)
    # while group x q_len_per_req fits its tiles, else the 64-row one; named here rather than
    # left to caps.variant 0 (which infers q_len from the rounded capacities) so that a
    # cached plan keeps its row only for calls of the same depth
    caps.variant = 2 if (H // Hkv) * qlen <= _ROWS8 else 3

    b = C.fi_batch()
    built = []

    def make_batch(entry):
        built.append(1)
        held = E.block_table_batch(b, entry, block_tables, seq_lens, B, qlen, window_left,
                                   block_tables.shape[1])
        return b, rows, held

    dts = (query.dtype, kpart[0].dtype if not nvfp4 else "nvfp4", out.dtype)
    def record(entry, dev=None):
        if not built and dev is None:  # never planned here (captured call): slow path
            return
        # the tensor order of the fast path: query, kv_cache (1 or 2), block_tables,
        # seq_lens, sinks (0 or 1), kv_cache_sf (0, 1 or 2), lse (0 or 1), out
        ts = ((query,) + flat(kv_cache) + (block_tables, seq_lens_arg) + flat(sinks)
              + flat(kv_cache_sf) + flat(lse) + (out,))
        record_paged_call(entry, key, args, b, ts, kpart, vpart, block_tables,
                          seq_lens_arg, sinks, rows, min(rows, out.shape[0]), out_alloc,
                          _FAMILY, dts, device, sf_parts, dev, lse=lse)
    E.launch(workspace_buffer, caps, B, rows, device, make_batch, args, _FAMILY,
             dts, min(rows, out.shape[0]), record=None if key is None else record,
             make_device_batch=E.block_table_device_batch(
                 device, block_tables, seq_lens, B, qlen, window_left, rows))
    del keep
    return out
