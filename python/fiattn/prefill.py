"""Context (prefill) attention: fiattn's drop-in for
``flashinfer.prefill.trtllm_batch_context_with_kv_cache``.

Computed per query row and head (causal, query block aligned to the end of each request's
KV range; fiattn_run.h)::

    s_j = bmm1_scale * (q . k_j),  out = bmm2_scale * softmax-weighted sum of v_j (+ sink)

The planner and the CPU reference run it today; the GPU context family is not written yet,
so CUDA tensors raise FiattnNotImplementedError naming it (never a wrong result).
"""
from . import _capi as C
from . import _engine as E
from ._common import (check_block_tables, check_lengths, dtypes_text, fill_tensor, num_ctas_for,
                      require_device, set_pdl, set_scale, set_sinks)
from ._paged import fill_kv, unpack_kv
from ._torch import check_tensor, fi_dtype, float_dtypes, fp8_dtypes, torch

__all__ = ["trtllm_batch_context_with_kv_cache"]

_FAMILY = "context (prefill)"


def trtllm_batch_context_with_kv_cache(query, kv_cache, workspace_buffer, block_tables,
                                       seq_lens, max_q_len, max_kv_len, bmm1_scale, bmm2_scale,
                                       batch_size, cum_seq_lens_q, cum_seq_lens_kv,
                                       window_left=-1, out=None, out_dtype=None,
                                       o_sf_scale=None, o_sf_vec_size=None, kv_layout="HND",
                                       enable_pdl=None, sinks=None, kv_block_scales=None,
                                       skip_softmax_threshold_scale_factor=None,
                                       uses_shared_paged_kv_idx=True):
    """Causal context attention over a paged KV cache (cumulative-lengths form).

    Args:
        query: [num_tokens, num_qo_heads, head_dim] (num_tokens >= cum_seq_lens_q[-1]);
            fp32 / fp16 / bf16 on the CPU; head_dim 64 / 128 / 256.
        kv_cache: as xqa_batch_decode_with_kv_cache (single [pages, 1 or 2, ...] tensor or a
            (K, V) tuple), default layout HND; query's dtype.
        workspace_buffer: plan + partials, >= fiattn.workspace_size(...) bytes (GPU); any
            tensor on the CPU path (used as the plan cache key).
        block_tables: int32 [batch_size, max_pages] (uses_shared_paged_kv_idx=True) or
            [batch_size, 2, max_pages] (False: K pages in [:, 0], V pages in [:, 1]); a
            device tensor is read by the kernel only (page indices not checked on the
            host), a CPU one is checked by the planner.
        seq_lens: uint32 / int32 [batch_size] KV lengths; must equal the cum_seq_lens_kv
            differences.
        max_q_len, max_kv_len: accepted for compatibility; not needed.
        bmm1_scale, bmm2_scale: float or one-element float32 tensor (run-time).
        batch_size: number of requests (must match block_tables).
        cum_seq_lens_q, cum_seq_lens_kv: int32 / uint32 [batch_size + 1] prefix sums of the
            query and KV lengths, read on the host.
        window_left: -1 or the left window (positions p - window_left .. p).
        out: optional [num_tokens, num_qo_heads, head_dim], written in place.
        out_dtype: None (query's dtype), a torch float dtype or its name; "nvfp4":
            NotImplementedError.  o_sf_scale / o_sf_vec_size: NVFP4 output only
            (NotImplementedError when given).
        kv_layout: "HND" (default) or "NHD".  enable_pdl: None = on for CUDA.
        sinks: optional float32 [num_qo_heads] (or a one-element list).
        kv_block_scales: NVFP4 KV: NotImplementedError.
        skip_softmax_threshold_scale_factor: accepted and ignored: fiattn computes the exact
            softmax (the limit of a threshold of 0).
        uses_shared_paged_kv_idx: see block_tables.

    Returns: out.
    Raises: TypeError / ValueError before any C call; FiattnValueError for a rejected
        batch; FiattnNotImplementedError (GPU context family, NVFP4); FiattnError.
    """
    t = torch()
    check_tensor(query, "query", float_dtypes() + fp8_dtypes(), None, 3)
    device = query.device
    require_device(device)
    if kv_block_scales is not None:
        raise NotImplementedError("fiattn: NVFP4 KV cache (kv_block_scales) is not implemented yet")
    if isinstance(out_dtype, str):
        if out_dtype == "nvfp4":
            raise NotImplementedError("fiattn: NVFP4 output is not implemented yet")
        out_dtype = getattr(t, out_dtype, None)
        if out_dtype is None:
            raise TypeError("fiattn: unknown out_dtype name")
    if o_sf_scale is not None or o_sf_vec_size is not None:
        raise NotImplementedError("fiattn: NVFP4 output (o_sf_scale / o_sf_vec_size) is not "
                                  "implemented yet")
    rows, H, D = query.shape
    B = int(batch_size)
    kpart, vpart = unpack_kv(kv_cache, kv_layout, device, float_dtypes() + fp8_dtypes())
    num_pages, page_size, Hkv, Dk = kpart[1]
    if Dk != D or vpart[1][3] != D:
        raise ValueError(f"fiattn: head_dim of query ({D}) and caches ({Dk}, {vpart[1][3]}) differ")
    if H % Hkv:
        raise ValueError(f"fiattn: {H} query heads are not a multiple of {Hkv} KV heads")
    split = not uses_shared_paged_kv_idx
    check_block_tables(block_tables, "block_tables", device, B, 3 if split else 2)
    if split and block_tables.shape[1] != 2:
        raise ValueError("fiattn: a 3-D block_tables must be [batch_size, 2, max_pages]")
    seq_lens = check_lengths(seq_lens, "seq_lens", B)
    cq = check_lengths(cum_seq_lens_q, "cum_seq_lens_q", B + 1)
    ck = check_lengths(cum_seq_lens_kv, "cum_seq_lens_kv", B + 1)
    if not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"fiattn: window_left must be an int >= -1, got {window_left}")
    o_dt = out_dtype if out_dtype is not None else (
        query.dtype if query.dtype in float_dtypes() else t.bfloat16)
    if out is None:
        if o_dt not in float_dtypes() + fp8_dtypes():
            raise TypeError(f"fiattn: out_dtype {o_dt} is not supported")
        out = t.empty((rows, H, D), dtype=o_dt, device=device)
    else:
        check_tensor(out, "out", float_dtypes() + fp8_dtypes(), device, 3)
        if tuple(out.shape) != (rows, H, D):
            raise ValueError(f"fiattn: out must be {(rows, H, D)}, got {tuple(out.shape)}")
    args = C.fi_attn_args()
    fill_tensor(args.q, query, [rows, H, D], query.stride())
    fill_kv(args, kpart, vpart)
    fill_tensor(args.page_table, block_tables, list(block_tables.shape), block_tables.stride())
    args.page_table.dtype = C.FI_DTYPE_I32
    fill_tensor(args.out, out, [rows, H, D], out.stride())
    keep = (set_scale(args, "bmm1_scale", bmm1_scale, device, "bmm1_scale"),
            set_scale(args, "bmm2_scale", bmm2_scale, device, "bmm2_scale"),
            set_sinks(args, sinks, H, device))
    set_pdl(args, enable_pdl, device)
    caps = C.fi_caps()
    caps.kind = C.FI_KIND_CONTEXT
    caps.num_pages, caps.page_size = num_pages, page_size
    caps.num_qo_heads, caps.num_kv_heads = H, Hkv
    caps.head_dim_qk = caps.head_dim_vo = D
    caps.q_dtype, caps.kv_dtype, caps.o_dtype = (fi_dtype(query.dtype), fi_dtype(kpart[0].dtype),
                                                 fi_dtype(out.dtype))
    caps.num_ctas = num_ctas_for(device)

    def make_batch(entry):
        bt = entry.host_page_table(block_tables)
        sl = entry.host_i32("seq_lens", seq_lens)
        hq = entry.host_i32("cum_q", cq)
        hk = entry.host_i32("cum_kv", ck)
        entry.sync()
        b = C.fi_batch()
        b.form = C.FI_FORM_CUM_SEQ_LENS
        b.batch_size = B
        b.block_tables = bt.data_ptr()
        b.max_pages_per_seq = block_tables.shape[-1]
        b.kv_split_pages = 1 if split else 0
        b.seq_lens = sl.data_ptr()
        b.cum_seq_lens_q = hq.data_ptr()
        b.cum_seq_lens_kv = hk.data_ptr()
        b.causal = 1
        b.window_left = window_left
        total = int(hq[-1]) if B > 0 else 0
        if total > rows:
            raise ValueError(f"fiattn: cum_seq_lens_q[-1] = {total} exceeds query's {rows} rows")
        return b, total, (bt, sl, hq, hk)

    E.launch(workspace_buffer, caps, B, max(rows, 1), device, make_batch, args, _FAMILY,
             dtypes_text(query.dtype, kpart[0].dtype, out.dtype), rows)
    del keep
    return out
