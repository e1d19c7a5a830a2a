"""GQA decode: fiattn's drop-in for ``flashinfer.decode.xqa_batch_decode_with_kv_cache``.

Computed per query row and head h (kv head h // (H_q / H_kv)), fiattn_run.h::

    s_j = bmm1_scale * (q . k_j),  keys j in the row's causal / window range
    out = bmm2_scale * sum_j exp(s_j) v_j / (sum_j exp(s_j) + exp(sink_h))

stored as out / o_scale for an fp8 output.  Algorithm: fiattn's host planner (balanced
split-k, flash-decoding split-KV merge) and the GQA decode GPU family when the library
has one (the same fi_run, kind FI_KIND_GQA_DECODE); until then the GPU path raises
FiattnNotImplementedError naming the family.  CPU tensors run the C reference executor.
"""
from . import _capi as C
from . import _engine as E
from ._common import (check_block_tables, check_lengths, dtypes_text, fill_tensor, num_ctas_for,
                      require_device, set_pdl, set_scale, set_sinks, token_view)
from ._paged import fill_kv, unpack_kv
from ._torch import check_tensor, fi_dtype, float_dtypes, fp8_dtypes, torch

__all__ = ["xqa_batch_decode_with_kv_cache"]

_FAMILY = "GQA decode"


def check_causal_mask(mask, q_len):
    """Accept the speculative-decoding mask only when it is the causal one fiattn computes.

    Forms: bool / uint8 [..., q_len, q_len] (True / 1 = may attend), or bit-packed integer
    rows [..., q_len, W] (uint16 / int16 with W >= q_len / 16, uint32 / int32 with
    W >= q_len / 32), bit c of row r (least significant first) set when row r attends
    draft token c.  The causal mask is row r attending tokens 0..r.  Any other mask raises
    NotImplementedError.  Reads the mask on the host (a device mask costs a sync)."""
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
        raise NotImplementedError("fiattn: only the causal speculative-decoding mask is "
                                  "implemented (row r attends draft tokens 0..r)")


def xqa_batch_decode_with_kv_cache(query, kv_cache, workspace_buffer, block_tables, seq_lens,
                                   max_seq_len, bmm1_scale=1.0, bmm2_scale=1.0, window_left=-1,
                                   out=None, sinks=None, kv_layout="NHD", enable_pdl=None,
                                   q_len_per_req=1, o_scale=1.0, mask=None, kv_cache_sf=None):
    """GQA decode over a paged KV cache (block-table form), XQA-style.

    Args:
        query: [batch_size * q_len_per_req, num_qo_heads, head_dim]; bf16 / fp16 (GPU),
            fp32 / fp16 / bf16 (CPU); head_dim 64 / 128 / 256; num_qo_heads a multiple of
            num_kv_heads with group size 1..16.  Last dim contiguous.
        kv_cache: one tensor [num_pages, 1 or 2, page_size, H_kv, head_dim] (NHD) or
            [num_pages, 1 or 2, H_kv, page_size, head_dim] (HND) (1: K and V are the same),
            or a tuple (k_cache, v_cache) of [num_pages, page_size, H_kv, head_dim] (NHD) /
            [num_pages, H_kv, page_size, head_dim] (HND); query's dtype; read in place
            through strides (no copy).  page_size 1 / 16 / 32 / 64 / 128.
        workspace_buffer: device buffer holding the plan and split partials, at least
            fiattn.workspace_size(...) bytes (WorkspaceTooSmallError otherwise), 256-byte
            aligned; plan cached per buffer; caller-owned.
        block_tables: int32 [batch_size, max_pages_per_seq], contiguous, on the device.
        seq_lens: uint32 / int32 [batch_size] KV lengths (tokens, query rows included);
            read on the host (device tensor: one copy + stream sync).
        max_seq_len: accepted for compatibility; not needed.
        bmm1_scale / bmm2_scale: float or one-element float32 device tensor (run-time),
            logit scale and output scale, natural units.
        window_left: -1 or the left window: the query at position p sees [p - window_left, p].
        out: optional [batch_size * q_len_per_req, num_qo_heads, head_dim] (query's dtype),
            written in place; allocated when None.
        sinks: optional float32 [num_qo_heads] logits added to the denominator.
        kv_layout: "NHD" or "HND".  enable_pdl: None = on for CUDA.
        q_len_per_req: query rows per request (MTP / speculative depth) 1..8, causal.
        o_scale: fp8 output only: stored = out / o_scale.
        mask: None, or the causal speculative mask (see check_causal_mask); another mask
            raises NotImplementedError.  Not inspected during CUDA graph capture.
        kv_cache_sf: NVFP4 block scales: NotImplementedError (NVFP4 not yet implemented).

    Returns: out.
    Raises: TypeError / ValueError (before any C call), FiattnValueError (rejected batch:
        fi_status name + request), FiattnNotImplementedError (no GPU GQA family yet, fp8,
        NVFP4), FiattnError.  Nothing is written on error.
    Graphs: as trtllm_batch_decode_with_kv_cache_mla (fiattn.plan_only() before replays).
    """
    t = torch()
    check_tensor(query, "query", float_dtypes() + fp8_dtypes(), None, 3)
    device = query.device
    require_device(device)
    if kv_cache_sf is not None:
        raise NotImplementedError("fiattn: NVFP4 KV cache (kv_cache_sf) is not implemented yet")
    qlen = 1 if q_len_per_req is None else int(q_len_per_req)
    if qlen < 1:
        raise ValueError(f"fiattn: q_len_per_req must be >= 1, got {q_len_per_req}")
    rows, H, D = query.shape
    if rows % qlen:
        raise ValueError(f"fiattn: query has {rows} rows, not a multiple of q_len_per_req {qlen}")
    B = rows // qlen
    kpart, vpart = unpack_kv(kv_cache, kv_layout, device, float_dtypes() + fp8_dtypes())
    num_pages, page_size, Hkv, Dk = kpart[1]
    if Dk != D or vpart[1][3] != D:
        raise ValueError(f"fiattn: head_dim of query ({D}) and caches ({Dk}, {vpart[1][3]}) differ")
    if H % Hkv:
        raise ValueError(f"fiattn: {H} query heads are not a multiple of {Hkv} KV heads")
    check_block_tables(block_tables, "block_tables", device, B)
    seq_lens = check_lengths(seq_lens, "seq_lens", B)
    if not isinstance(window_left, int) or window_left < -1:
        raise ValueError(f"fiattn: window_left must be an int >= -1, got {window_left}")
    if out is None:
        out = t.empty((rows, H, D), dtype=query.dtype if query.dtype in float_dtypes()
                      else t.bfloat16, device=device)
    else:
        check_tensor(out, "out", float_dtypes() + fp8_dtypes(), device, 3)
        if tuple(out.shape) != (rows, H, D):
            raise ValueError(f"fiattn: out must be {(rows, H, D)}, got {tuple(out.shape)}")
    if qlen > 1 and not (device.type == "cuda" and t.cuda.is_current_stream_capturing()):
        check_causal_mask(mask, qlen)
    args = C.fi_attn_args()
    fill_tensor(args.q, query, [rows, H, D], query.stride())
    fill_kv(args, kpart, vpart)
    fill_tensor(args.page_table, block_tables, list(block_tables.shape), block_tables.stride())
    args.page_table.dtype = C.FI_DTYPE_I32
    fill_tensor(args.out, out, [rows, H, D], out.stride())
    keep = (set_scale(args, "bmm1_scale", bmm1_scale, device, "bmm1_scale"),
            set_scale(args, "bmm2_scale", bmm2_scale, device, "bmm2_scale"),
            set_sinks(args, sinks, H, device))
    args.o_scale = 1.0 if o_scale is None else float(o_scale)
    set_pdl(args, enable_pdl, device)
    caps = C.fi_caps()
    caps.kind = C.FI_KIND_GQA_DECODE
    caps.num_pages, caps.page_size = num_pages, page_size
    caps.num_qo_heads, caps.num_kv_heads = H, Hkv
    caps.head_dim_qk = caps.head_dim_vo = D
    caps.q_dtype, caps.kv_dtype, caps.o_dtype = (fi_dtype(query.dtype), fi_dtype(kpart[0].dtype),
                                                 fi_dtype(out.dtype))
    caps.num_ctas = num_ctas_for(device)

    def make_batch(entry):
        bt = entry.host_i32("block_tables", block_tables)
        sl = entry.host_i32("seq_lens", seq_lens)
        entry.sync()
        b = C.fi_batch()
        b.form = C.FI_FORM_BLOCK_TABLES
        b.batch_size = B
        b.block_tables = bt.data_ptr()
        b.max_pages_per_seq = block_tables.shape[1]
        b.seq_lens = sl.data_ptr()
        b.q_len_per_request = qlen
        b.causal = 1
        b.window_left = window_left
        return b, rows, (bt, sl)

    E.launch(workspace_buffer, caps, B, rows, device, make_batch, args, _FAMILY,
             dtypes_text(query.dtype, kpart[0].dtype, out.dtype), min(rows, out.shape[0]))
    del keep
    return out
