"""MLA decode (DeepSeek-style latent attention): fiattn's drop-in for ``flashinfer.mla``.

Computed (fiattn_run.h; docs/DESIGN.md section 7), per query row and head::

    s_j = bmm1_scale * (q_nope . ckv_j + q_pe . kpe_j)
    out = bmm2_scale * sum_j exp(s_j) ckv_j / (sum_j exp(s_j) + exp(sink_h))
    lse = log(sum_j exp(s_j) + exp(sink_h))            natural log inside fiattn

with key ranges from causal / window rules aligned to the end of each request's KV range.
Algorithm: fiattn's host planner (balanced split-k, flash-decoding split-KV with an
LSE-weighted in-kernel merge, Dao et al. 2023) and its persistent sm_90a MLA kernel
(FlashAttention-2 online softmax, FlashMLA-style decode); the CPU path runs the same plan
in the C reference executor (fi_ref_run).

GPU today: bf16 / fp16 q, cache and out (same dtype); an fp8 e4m3 cache with an fp8 e4m3,
bf16 or fp16 q and a bf16 out (fp16 matmuls in the kernel; the caller folds the
dequantisation scales into bmm1_scale / bmm2_scale); sparse top-k attention
(sparse_mla_top_k > 0, bf16 / fp16 or fp8 cache).  Other dtype combinations raise
FiattnNotImplementedError (a NotImplementedError), never a wrong result.
CPU tensors (fp32 / fp16 / bf16, fp8 widened exactly) run on the CPU reference executor
with a host plan.
"""
import ctypes
import os

from . import _capi as C
from . import _engine as E
from ._common import (LOG2E, check_block_tables, check_lengths, fill_tensor,
                      last_i32, num_ctas_for, require_device, set_pdl, set_scale, set_sinks,
                      token_view)
from .errors import FiattnError
from ._torch import check_tensor, fi_dtype, float_dtypes, fp8_dtypes, torch

__all__ = ["trtllm_batch_decode_with_kv_cache_mla", "BatchMLAPagedAttentionWrapper"]

_FAMILY = "MLA decode"
_NUM = (float, int)


# fiattn.h FI_LIMIT_SPARSE_TOP_K: keys a query token of a sparse plan may list
SPARSE_TOP_K_LIMIT = 1 << 17


def _mla_caps(num_pages, page_size, heads, q_dt, kv_dt, o_dt, num_ctas, sparse_top_k=0):
    c = C.fi_caps()
    c.sparse_top_k = sparse_top_k
    c.kind = C.FI_KIND_MLA_DECODE
    c.num_pages = num_pages
    c.page_size = page_size
    c.num_qo_heads = heads
    c.num_kv_heads = 1
    c.head_dim_qk = 576
    c.head_dim_vo = 512
    c.q_dtype, c.kv_dtype, c.o_dtype = fi_dtype(q_dt), fi_dtype(kv_dt), fi_dtype(o_dt)
    c.num_ctas = num_ctas
    return c


_IN = None


def _in_dtypes():
    global _IN
    if _IN is None:
        _IN = float_dtypes() + fp8_dtypes()
    return _IN


def _host_i32(x):
    """A contiguous host int32 tensor with x's values (x itself when it is one)."""
    t = torch()
    if x.device.type != "cpu":
        x = x.cpu()
    if x.dtype is not t.int32:
        x = x.to(t.int32)
    return x if x.is_contiguous() else x.contiguous()


_ALL_DIRECT = (True,) * 4
_I32 = ctypes.c_int32


def _stage(dst, src, host, n, stream):
    """dst[:n] = src[:n] on the device in stream order, no host synchronisation.  A CPU src
    goes as one fi_copy_to_device of its int32 host copy `host` (from pageable memory CUDA
    stages the bytes before the call returns); a device src, a host dst (a preallocated
    buffer given on the CPU) or a library without that function: torch's copy."""
    copy = (None if src.is_cuda or not dst.is_cuda
            else getattr(C.lib(), "fi_copy_to_device", None))
    if copy is None:
        dst[:n].copy_(src[:n], non_blocking=True)
        return
    st = copy(dst.data_ptr(), host.data_ptr(), 4 * n, stream)
    if st:
        C.check(st, "fi_copy_to_device")


def _check_sparse_table(bt, device, B, qlen, K):
    """The sparse top-k table: int32 [B, q_len, K] or [B * q_len, K], contiguous, on the
    query's device; entries are flat KV slots (page * page_size + offset), -1 = no key.
    TypeError / ValueError otherwise."""
    t = torch()
    check_tensor(bt, "block_tables", (t.int32,), device, (2, 3))
    want = (B, qlen, K) if bt.dim() == 3 else (B * qlen, K)
    if tuple(bt.shape) != want:
        raise ValueError(f"fiattn: with sparse_mla_top_k {K}, block_tables must be "
                         f"[batch_size, q_len_per_request, top_k] = {(B, qlen, K)} (or "
                         f"{(B * qlen, K)}) int32 KV slots, got {tuple(bt.shape)}")
    if not bt.is_contiguous():
        raise ValueError("fiattn: a sparse block_tables must be contiguous")


def trtllm_batch_decode_with_kv_cache_mla(query, kv_cache, workspace_buffer, qk_nope_head_dim,
                                          kv_lora_rank, qk_rope_head_dim, block_tables,
                                          seq_lens, max_seq_len, sparse_mla_top_k=0, out=None,
                                          bmm1_scale=1.0, bmm2_scale=1.0, sinks=None,
                                          enable_pdl=None, backend="auto"):
    """MLA decode over a paged, concatenated ckv + kpe cache (block-table form).

    Args:
        query: [batch_size, q_len_per_request, num_heads, 576] = q_nope (512) ++ q_pe (64);
            on the GPU bf16 / fp16 (the cache's dtype), or, over an fp8 e4m3 cache, fp8
            e4m3 / bf16 / fp16; on the CPU fp32 / fp16 / bf16 / fp8.  num_heads in
            {16, 32, 64, 128}; q_len_per_request (MTP depth) 1..8, causal among a
            request's query rows (dense plans).  Leading dims must merge into one token
            axis without a copy; last dim contiguous.
        kv_cache: [num_pages, page_size, 576] (or [num_pages, 1, page_size, 576]): ckv
            (512) ++ kpe (64); query's dtype, or fp8 e4m3 (float8_e4m3fn; its dequant scale
            folded into bmm1_scale / bmm2_scale by the caller); page_size in
            {1, 16, 32, 64, 128}.
        workspace_buffer: device buffer (any dtype) holding fiattn's plan and split partials;
            at least fiattn.workspace_size(...) bytes for these caps (FlashInfer's 128 MiB is
            plenty for batch <= 1024), 256-byte aligned; need not be zeroed.  Its plan is
            cached: keep using the same buffer.  Too small: WorkspaceTooSmallError.
        qk_nope_head_dim: must be 128 (only documents the pre-absorption head dim).
        kv_lora_rank: must be 512.   qk_rope_head_dim: must be 64.
        block_tables: int32 [batch_size, max_pages_per_seq] on the query's device,
            contiguous; page indices < num_pages for the pages each request uses (read by
            the kernel only: not checked on the host, no copy, no sync; a CPU tensor is
            checked by the planner).  Sparse (sparse_mla_top_k = K > 0): int32
            [batch_size, q_len_per_request, K] (or [batch_size * q_len_per_request, K]),
            contiguous: query token (b, i) attends to exactly the keys its row lists, each
            a flat KV slot page * page_size + offset (FlashInfer's trtllm-gen sparse
            convention), -1 (any negative) = no key; a row without keys gives zeros.
        seq_lens: int32 / uint32 [batch_size] KV lengths in tokens (the query rows
            included), any device: it is read on the host (a CUDA tensor costs a
            device-to-host copy and a stream synchronisation; pass a CPU tensor to avoid it).
        max_seq_len: accepted for compatibility, not needed (lengths come from seq_lens).
        sparse_mla_top_k: 0 (dense), or K in 1..131072 (fiattn.h FI_LIMIT_SPARSE_TOP_K):
            sparse top-k MLA (DeepSeek sparse attention) with the K-slot rows of
            block_tables above; seq_lens are then only checked (>= 0), not used to select
            keys, and causal masking does not apply.  Planned on the host (also inside
            fiattn.device_planning()).
        out: optional [batch_size, q_len_per_request, num_heads, 512], written in place
            (query's dtype; fp8 query: bf16; an fp8 cache needs a bf16 out on the GPU);
            allocated when None.
        bmm1_scale: float, or a one-element float32 device tensor read at run time, the
            full logit scale (softmax scale and any q / k dequantisation); natural units
            (FlashInfer's trtllm-gen backend converts a tensor to log2 units internally,
            fiattn reads it as given).
        bmm2_scale: float or one-element float32 tensor, multiplies the output.
        sinks: optional float32 [num_heads] (or a one-element list of it): per-head logits
            added to the softmax denominator only.
        enable_pdl: programmatic dependent launch; None = on for CUDA.
        backend: "auto", "xqa" or "trtllm-gen": accepted, fiattn's kernel runs for all.

    Returns:
        out, [batch_size, q_len_per_request, num_heads, 512].

    Raises:
        TypeError / ValueError before any C call (dtype, device, shape, strides, a
        sparse_mla_top_k < 0 or over the limit, a sparse block_tables of another shape);
        FiattnValueError for a batch the C API rejects (fi_status name and request in the
        message); FiattnNotImplementedError for a dtype combination the executor lacks
        (e.g. an fp8 cache with a fp16 out, fp8 q over a bf16 cache on the GPU);
        FiattnError otherwise.  Nothing is written when an error is raised.

    Graphs: plans are host work and cannot run inside torch.cuda.graph capture; call once
    eagerly (plans the workspace), capture, then before each replay call again under
    ``with fiattn.plan_only():`` with the new lengths (same tensors).
    """
    key = None
    if sinks is None and type(bmm1_scale) in _NUM and type(bmm2_scale) in _NUM:
        sig = E.tensor_sig
        try:
            key = ("mla", sig(query), sig(kv_cache), sig(block_tables), sig(seq_lens),
                   None if out is None else sig(out), qk_nope_head_dim, kv_lora_rank,
                   qk_rope_head_dim, sparse_mla_top_k, backend, bmm1_scale, bmm2_scale,
                   enable_pdl, E._device_planning())
            entry, fast = E.lookup(workspace_buffer, key)
        except (AttributeError, TypeError):
            key = fast = None
        if fast is not None and (fast.cuda or fast.env == os.environ.get("FIATTN_CPU_CTAS")):
            return E.fast_call(entry, fast, (query, kv_cache, block_tables, seq_lens, out))
    t = torch()
    check_tensor(query, "query", _in_dtypes(), None, 4)
    device = query.device
    require_device(device)
    if qk_nope_head_dim != 128:
        raise ValueError(f"fiattn: qk_nope_head_dim must be 128, got {qk_nope_head_dim}")
    if kv_lora_rank != 512 or qk_rope_head_dim != 64:
        raise ValueError("fiattn: MLA needs kv_lora_rank 512 and qk_rope_head_dim 64, got "
                         f"{kv_lora_rank} / {qk_rope_head_dim}")
    if type(sparse_mla_top_k) is bool or not isinstance(sparse_mla_top_k, int):
        raise TypeError(f"fiattn: sparse_mla_top_k must be an int, got {sparse_mla_top_k!r}")
    if not 0 <= sparse_mla_top_k <= SPARSE_TOP_K_LIMIT:
        raise ValueError(f"fiattn: sparse_mla_top_k must be in 0..{SPARSE_TOP_K_LIMIT}, got "
                         f"{sparse_mla_top_k}")
    if backend not in ("auto", "xqa", "trtllm-gen"):
        raise ValueError(f"fiattn: backend must be 'auto', 'xqa' or 'trtllm-gen', got {backend!r}")
    B, qlen, H, D = query.shape
    if D != 576:
        raise ValueError(f"fiattn: query's last dim must be 576 (512 + 64), got {D}")
    check_tensor(kv_cache, "kv_cache", _in_dtypes(), device, (3, 4))
    if kv_cache.dim() == 4:
        if kv_cache.shape[1] != 1:
            raise ValueError("fiattn: a 4-D kv_cache must be [num_pages, 1, page_size, 576]")
        kshape, kstride = ([kv_cache.shape[0], kv_cache.shape[2], 576],
                           [kv_cache.stride(0), kv_cache.stride(2), 1])
    else:
        kshape, kstride = list(kv_cache.shape), list(kv_cache.stride())
    if kshape[2] != 576:
        raise ValueError(f"fiattn: kv_cache's last dim must be 576, got {kshape[2]}")
    num_pages, page_size = kshape[0], kshape[1]
    if sparse_mla_top_k:
        _check_sparse_table(block_tables, device, B, qlen, sparse_mla_top_k)
    else:
        check_block_tables(block_tables, "block_tables", device, B)
    check_lengths(seq_lens, "seq_lens", B)  # any shape of B elements: read as one row
    o_dt = query.dtype if query.dtype in float_dtypes() else t.bfloat16
    out_alloc = None
    if out is None:
        out_alloc = ((B, qlen, H, 512), o_dt)
        out = t.empty((B, qlen, H, 512), dtype=o_dt, device=device)
    else:
        check_tensor(out, "out", float_dtypes(), device, 4)
        if tuple(out.shape) != (B, qlen, H, 512):
            raise ValueError(f"fiattn: out must be {(B, qlen, H, 512)}, got {tuple(out.shape)}")
    _mla_block_tables(query, kv_cache, kshape, kstride, workspace_buffer, block_tables,
                      seq_lens, out, bmm1_scale, bmm2_scale, sinks, enable_pdl,
                      num_ctas_for(device), num_pages, page_size, key, out_alloc,
                      sparse_mla_top_k)
    return out


def _mla_block_tables(query, cache, kshape, kstride, workspace, block_tables, seq_lens, out,
                      bmm1_scale, bmm2_scale, sinks, enable_pdl, num_ctas, num_pages,
                      page_size, key=None, out_alloc=None, sparse_top_k=0):
    """Shared by trtllm_batch_decode_with_kv_cache_mla and xqa_mla: query [B, q, H, 576],
    cache viewed as [num_pages, page_size, 576] (kshape / kstride), out [B, q, H, 512].
    key: the caller's call signature (None: not memoised); a successful call records an
    E.FastCall under it whose tensors are (query, cache, block_tables, seq_lens, out).
    sparse_top_k K > 0: block_tables is the checked top-k table ([B, q, K] or [B * q, K]),
    passed to fi_run as [B * q, K] (one row a query token) and planned on the host."""
    device = query.device
    B, qlen, H, _ = query.shape
    table = block_tables.reshape(B * qlen, sparse_top_k) if sparse_top_k else block_tables
    qshape, qstride = token_view(query, "query", 2)
    oshape, ostride = token_view(out, "out", 2)
    args = C.fi_attn_args()
    fill_tensor(args.q, query, [qshape[0], H, 512], qstride)
    fill_tensor(args.q_rope, query, [qshape[0], H, 64], qstride, 512)
    fill_tensor(args.k, cache, [num_pages, page_size, 1, 512],
                [kstride[0], kstride[1], 576, 1])
    fill_tensor(args.k_rope, cache, [num_pages, page_size, 1, 64],
                [kstride[0], kstride[1], 576, 1], 512)
    fill_tensor(args.page_table, table, list(table.shape), table.stride())
    args.page_table.dtype = C.FI_DTYPE_I32
    fill_tensor(args.out, out, oshape, ostride)
    keep = (set_scale(args, "bmm1_scale", bmm1_scale, device, "bmm1_scale"),
            set_scale(args, "bmm2_scale", bmm2_scale, device, "bmm2_scale"),
            set_sinks(args, sinks, H, device))
    set_pdl(args, enable_pdl, device)
    caps = _mla_caps(num_pages, page_size, H, query.dtype, cache.dtype, out.dtype, num_ctas,
                     sparse_top_k)

    b = C.fi_batch()
    built = []

    def make_batch(entry):
        built.append(1)
        held = E.block_table_batch(b, entry, block_tables, seq_lens, B, qlen, -1,
                                   table.shape[1])  # sparse: K
        return b, B * qlen, held

    out_rows = min(qshape[0], oshape[0])
    dts = (query.dtype, cache.dtype, out.dtype)
    def record(entry, dev=None):
        if not built and dev is None:  # never planned here (captured call): slow path
            return
        rope = 512 * query.element_size()
        E.remember(entry, key, E.FastCall(
            entry, args, b, ((args.q, 0, 0), (args.q_rope, 0, rope), (args.k, 1, 0),
                             (args.k_rope, 1, rope), (args.page_table, 2, 0),
                             (args.out, 4, 0)),
            (query, cache, block_tables, seq_lens, out), 2, 3, B * qlen,
            out_rows, out_alloc, _FAMILY, dts, device, dev=dev))
    # sparse plans are host plans (the device planner has no sparse form)
    dev_batch = None if sparse_top_k else E.block_table_device_batch(
        device, block_tables, seq_lens, B, qlen, -1, B * qlen)
    E.launch(workspace, caps, B, B * qlen, device, make_batch, args, _FAMILY, dts, out_rows,
             record=None if key is None else record, make_device_batch=dev_batch)
    del keep


class _PlanRecord:
    """What a BatchMLAPagedAttentionWrapper.plan signature settled: the plan entry it made,
    the batch size, causal flag, heads, page size and dtypes, which index arrays the planner
    reads in place (CPU, int32, contiguous), kv_indices' length, and the CPU path's CTA
    count setting."""

    __slots__ = ("entry", "batch_size", "causal", "planned", "direct", "n_indices", "env",
                 "staged")

    def __init__(self, entry, batch, planned, arrays, staged):
        t = torch()
        self.entry = entry
        self.batch_size, self.causal = batch.batch_size, batch.causal
        self.planned = tuple(planned[k] for k in ("B", "heads", "page_size", "q_dt", "kv_dt",
                                                  "o_dt"))
        self.direct = tuple(not x.is_cuda and x.dtype is t.int32 and x.is_contiguous()
                            for x in arrays)
        self.n_indices = arrays[-1].numel()
        self.env = os.environ.get("FIATTN_CPU_CTAS") if entry.host else None
        self.staged = staged  # kv_indices is staged into a device buffer (_table_buffer)


class BatchMLAPagedAttentionWrapper:
    """MLA paged attention with a plan object: plan once per step, run once per layer.

    Mirrors flashinfer.mla.BatchMLAPagedAttentionWrapper (indptr batch form: qo_indptr,
    kv_indptr, kv_indices, kv_len_arr).  Decode and incremental (chunked) prefill with any
    q_len >= 1 per request, causal with the query block aligned to the end of the KV range,
    on the GPU (bf16 / fp16), fp32 / fp16 / bf16 on the CPU (CPU workspace tensor).

    LSE: ``run(..., return_lse=True)`` returns the log-sum-exp in base 2 as FlashInfer's
    wrapper does (fiattn computes natural log and multiplies by log2(e));
    ``return_lse_base_on_e=True`` (keyword) returns the natural log.
    """

    def __init__(self, float_workspace_buffer, use_cuda_graph=False, qo_indptr=None,
                 kv_indptr=None, kv_indices=None, kv_len_arr=None, backend="fa2"):
        """Args:
            float_workspace_buffer: device buffer (any dtype, 256-byte aligned) that holds
                this wrapper's plan and split partials: at least fiattn.workspace_size(...)
                bytes for the largest batch planned (128 MiB covers 1024 requests x 128
                heads); owned by the caller, referenced by the wrapper.  A CPU tensor
                selects the CPU reference executor.
            use_cuda_graph: capture-friendly mode: the plan's capacity is fixed by the
                first plan() (a later plan with more requests or query tokens raises
                ValueError), and kv_indices is copied into the buffer given here (or one
                allocated at the first plan()) so captured runs read a fixed address.
            qo_indptr, kv_indptr, kv_indices, kv_len_arr: preallocated int32 device buffers
                (use_cuda_graph only; [batch+1], [batch+1], [max pages], [batch]); plan()
                copies the step's arrays into them.  Ignored otherwise.
            backend: "fa2", "fa3", "auto", "cutlass": accepted; fiattn's kernel runs.
        """
        t = torch()
        check_tensor(float_workspace_buffer, "float_workspace_buffer", None, None, None,
                     last_contiguous=False)
        if backend not in ("fa2", "fa3", "auto", "cutlass", "trtllm-gen"):
            raise ValueError(f"fiattn: unknown backend {backend!r}")
        self._ws = float_workspace_buffer
        self._device = float_workspace_buffer.device
        self._use_cuda_graph = bool(use_cuda_graph)
        # the _bufs entry kv_indices is staged into: the preallocated one, else our own
        self._table_name = "kv_indices" if self._use_cuda_graph else "kv_indices_staged"
        self._bufs = {"qo_indptr": qo_indptr, "kv_indptr": kv_indptr,
                      "kv_indices": kv_indices, "kv_len_arr": kv_len_arr}
        for k, v in self._bufs.items():
            if v is not None:
                check_tensor(v, k, (t.int32,), None, 1)
        self._entry = None
        self._planned = None
        self._known_pages = 0
        self._batch = None  # fi_batch reused by every plan()
        self._batch_rec = None  # the _PlanRecord whose batch_size / causal it holds
        self._run_memo = {}  # run() signature -> (fi_attn_args, ...), for one plan shape
        self._run_psig = None
        self._plan_memo = {}  # plan() signature -> _PlanRecord

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads, head_dim_ckv,
             head_dim_kpe, page_size, causal, sm_scale, q_data_type, kv_data_type):
        """Plan the batch on the host (fi_plan_update; no allocation after the first plan
        of a given capacity).  Not capturable: call outside torch.cuda.graph capture.

        Args:
            qo_indptr: int32 [batch_size + 1] query-token offsets (decode: 0..batch_size).
            kv_indptr: int32 [batch_size + 1] offsets into kv_indices (pages).
            kv_indices: int32 page indices, [kv_indptr[-1]] or longer; on the workspace's
                device (use_cuda_graph: copied into the preallocated buffer).
            kv_len_arr: int32 [batch_size] KV length of each request in tokens.
            num_heads: query heads, 16 / 32 / 64 / 128.  head_dim_ckv: 512.
            head_dim_kpe: 64.  page_size: 1, 16, 32, 64 or 128.
            causal: query rows of a request see keys up to their own position (aligned to
                the end of the KV range); False: every row sees all keys.
            sm_scale: logit scale (bmm1_scale), natural units.
            q_data_type, kv_data_type: torch dtypes of q and the caches (out = q's dtype).
        Index arrays may live on the CPU (no copy) or the device (each copied to the host
        by a synchronous copy: about 110 us a plan for the four on an H200 machine).
        Raises: ValueError / TypeError (arguments), FiattnValueError (batch rejected by the
        C planner, with the fi_status name and request), FiattnNotImplementedError.
        Repeat plans with the same array layouts and options reuse what the first one
        checked (the lengths, offsets and page indices are still read and planned).
        """
        sig = E.tensor_sig
        try:
            key = (sig(qo_indptr), sig(kv_indptr), sig(kv_indices), sig(kv_len_arr), num_heads,
                   head_dim_ckv, head_dim_kpe, page_size, causal, q_data_type, kv_data_type)
            rec = self._plan_memo.get(key)
        except (AttributeError, TypeError):
            key = rec = None
        if rec is not None and self._plan_fast(rec, qo_indptr, kv_indptr, kv_indices,
                                               kv_len_arr, sm_scale):
            return
        self._plan_checked(qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads,
                           page_size, causal, sm_scale, q_data_type, kv_data_type,
                           head_dim_ckv, head_dim_kpe)
        if key is not None:
            if len(self._plan_memo) >= 64:
                self._plan_memo.clear()
            self._plan_memo[key] = _PlanRecord(self._entry, self._batch, self._planned,
                                               (qo_indptr, kv_indptr, kv_len_arr, kv_indices),
                                               self._planned["table"] is not kv_indices)

    def _plan_checked(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads,
                      page_size, causal, sm_scale, q_data_type, kv_data_type, head_dim_ckv,
                      head_dim_kpe):
        """plan() with every argument checked."""
        t = torch()
        if head_dim_ckv != 512 or head_dim_kpe != 64:
            raise ValueError(f"fiattn: MLA needs head_dim_ckv 512, head_dim_kpe 64, got "
                             f"{head_dim_ckv} / {head_dim_kpe}")
        for name, dt in (("q_data_type", q_data_type), ("kv_data_type", kv_data_type)):
            if isinstance(dt, str):
                dt = getattr(t, dt, None)
            if dt not in _in_dtypes():
                raise TypeError(f"fiattn: {name} {dt} is not a supported dtype")
        q_dt = getattr(t, q_data_type) if isinstance(q_data_type, str) else q_data_type
        kv_dt = getattr(t, kv_data_type) if isinstance(kv_data_type, str) else kv_data_type
        device = self._device
        if device.type == "cuda":
            require_device(device)
        check_tensor(qo_indptr, "qo_indptr", (t.int32,), None, 1)
        B = qo_indptr.numel() - 1
        if B < 0:
            raise ValueError("fiattn: qo_indptr must have batch_size + 1 elements")
        check_lengths(kv_indptr, "kv_indptr", B + 1)
        check_lengths(kv_len_arr, "kv_len_arr", B)
        check_tensor(kv_indices, "kv_indices", (t.int32,), None, 1)
        o_dt = q_dt if q_dt in float_dtypes() else t.bfloat16
        host = device.type == "cpu"
        # Host copies of the index arrays (the planner reads them).
        t_qo, t_kvp, t_kl, t_idx = (_host_i32(x) for x in (qo_indptr, kv_indptr, kv_len_arr,
                                                           kv_indices))
        nnz = last_i32(t_kvp)
        if nnz > t_idx.numel():
            raise ValueError(f"fiattn: kv_indices has {t_idx.numel()} elements, kv_indptr[-1] "
                             f"is {nnz}")
        q_tokens = last_i32(t_qo)
        e = self._entry
        if (e is not None and self._known_pages > 0 and e.caps.num_pages == self._known_pages
                and E.cached_entry(self._ws) is e):
            # Steady state: the caches' page count covers every index the planner checks
            # (FI_ERR_PAGE_INDEX_OUT_OF_RANGE otherwise), so max(needed, known) is known:
            # skip the scan of kv_indices unless the planner finds an index out of range.
            try:
                return self._plan_pages(self._known_pages, B, q_tokens, nnz, page_size,
                                        num_heads, q_dt, kv_dt, o_dt, host, device, causal,
                                        sm_scale, qo_indptr, kv_indptr, kv_len_arr,
                                        kv_indices, t_qo, t_kvp, t_kl, t_idx)
            except FiattnError as ex:
                if ex.status != C.FI_ERR_PAGE_INDEX_OUT_OF_RANGE:
                    raise
        used = t_idx[:nnz]
        need_pages = int(used.max()) + 1 if nnz > 0 else 1
        if nnz > 0 and int(used.min()) < 0:
            need_pages = max(need_pages, 1)  # the planner reports the negative index
        pages = max(need_pages, self._known_pages)
        self._plan_pages(pages, B, q_tokens, nnz, page_size, num_heads, q_dt, kv_dt, o_dt,
                         host, device, causal, sm_scale, qo_indptr, kv_indptr, kv_len_arr,
                         kv_indices, t_qo, t_kvp, t_kl, t_idx)

    def _plan_pages(self, pages, B, q_tokens, nnz, page_size, num_heads, q_dt, kv_dt, o_dt,
                    host, device, causal, sm_scale, qo_indptr, kv_indptr, kv_len_arr,
                    kv_indices, t_qo, t_kvp, t_kl, t_idx):
        """plan()'s second half for a KV cache of `pages` pages."""
        caps = _mla_caps(pages, int(page_size), int(num_heads), q_dt, kv_dt, o_dt,
                         num_ctas_for(device))
        if not host:
            E.kind_supported_on_gpu(caps)
        if self._use_cuda_graph and self._entry is not None:
            e = self._entry
            if B > e.caps.max_batch or q_tokens > e.caps.max_q_tokens:
                raise ValueError(f"fiattn: use_cuda_graph wrapper planned for {e.caps.max_batch} "
                                 f"requests / {e.caps.max_q_tokens} query tokens, got {B} / "
                                 f"{q_tokens}")
            if e.captured_rows is not None and q_tokens > e.captured_rows:
                raise ValueError(f"fiattn: a captured graph holds {e.captured_rows} query rows, "
                                 f"this plan has {q_tokens}")
        if self._use_cuda_graph and self._entry is not None:
            # same capacity, hence the same workspace layout the captured graph points into
            entry = E.get_entry(self._ws, caps, self._entry.caps.max_batch,
                                self._entry.caps.max_q_tokens, host, False, fixed_sizes=True)
        else:
            entry = E.get_entry(self._ws, caps, B, q_tokens, host, False,
                                fixed_sizes=self._use_cuda_graph)
        buf = self._table_buffer(kv_indices, nnz)
        b = self._batch
        if b is None:
            b = self._batch = C.fi_batch()
        self._batch_rec = None  # the fields below are no record's
        b.form = C.FI_FORM_INDPTR
        b.batch_size = B
        b.qo_indptr = t_qo.data_ptr()
        b.kv_indptr = t_kvp.data_ptr()
        b.kv_indices = t_idx.data_ptr()
        b.kv_len = t_kl.data_ptr()
        b.causal = 1 if causal else 0
        b.window_left = -1
        stream = None if host else E.stream_handle(device)
        E.plan(entry, b, device, stream)
        self._entry = entry
        table = self._kernel_table(buf, kv_indices, nnz, (qo_indptr, kv_indptr, kv_len_arr),
                                   (t_qo, t_kvp, t_kl, t_idx), stream)
        self._set_planned(B, q_tokens, int(num_heads), int(page_size), q_dt, kv_dt, o_dt,
                          float(sm_scale), table, nnz)

    def _set_planned(self, B, q_tokens, heads, page_size, q_dt, kv_dt, o_dt, sm_scale, table,
                     nnz):
        """What run() reads of the plan just made on self._entry."""
        entry = self._entry
        self._planned = dict(B=B, q_tokens=q_tokens, heads=heads, page_size=page_size,
                             q_dt=q_dt, kv_dt=kv_dt, o_dt=o_dt, sm_scale=sm_scale, table=table,
                             nnz=nnz, table_ptr=table.data_ptr(), table_n=table.numel())
        # run()'s checks depend on these (and the tensors); the table and scale do not
        psig = (entry, q_tokens, heads, page_size, q_dt, kv_dt, o_dt, entry.caps.num_pages)
        if psig != self._run_psig:
            self._run_memo.clear()
            self._run_psig = psig

    def _table_buffer(self, kv_indices, nnz):
        """The device buffer that kv_indices[:nnz] is staged into for the kernel, or None
        when the kernel reads kv_indices itself (the CPU path, or kv_indices already on the
        workspace's device): the preallocated one under use_cuda_graph, else this wrapper's
        own; grown here, before planning, so that a failed plan changes nothing."""
        device = self._device
        if device.type == "cpu" or (not self._use_cuda_graph and kv_indices.device == device):
            return None
        name = self._table_name
        buf = self._bufs.get(name)
        if buf is None or buf.numel() < max(nnz, 1):
            if (self._use_cuda_graph and buf is not None and self._entry is not None
                    and self._entry.captured_rows):
                raise ValueError("fiattn: kv_indices buffer too small for this plan")
            t = torch()
            buf = t.empty(max(nnz, 1) * 2, dtype=t.int32, device=device)
            self._bufs[name] = buf
        return buf

    def _kernel_table(self, buf, kv_indices, nnz, sources, hosts, stream):
        """The page table the kernel reads, once the plan succeeded: kv_indices, or buf
        (_table_buffer) holding kv_indices[:nnz], copied in stream order without a host
        synchronisation (the runs of the previous plan read it first); under use_cuda_graph
        the other index arrays go to their preallocated buffers too.  sources: the
        caller's (qo_indptr, kv_indptr, kv_len_arr); hosts: the contiguous int32 host copies
        the planner read of those and of kv_indices (the caller's tensors themselves where
        they were CPU int32 already); stream: the copies' cudaStream_t."""
        if buf is None:
            return kv_indices
        if self._use_cuda_graph:
            for name, src, host in zip(("qo_indptr", "kv_indptr", "kv_len_arr"), sources,
                                       hosts):
                dst = self._bufs.get(name)
                if dst is not None and dst.numel() >= src.numel():
                    _stage(dst, src, host, src.numel(), stream)
        _stage(buf, kv_indices, hosts[3], nnz, stream)
        return buf

    def _plan_fast(self, rec, qo_indptr, kv_indptr, kv_indices, kv_len_arr, sm_scale):
        """plan() with the signature of an earlier successful plan whose plan entry is still
        this wrapper's and sized for the caches run() saw: the argument checks passed then
        and pass now; read the arrays, re-plan and stage the table.  False (nothing planned,
        the caller takes the checked path) when the data asks for more than the entry holds
        or the planner finds a page index out of range."""
        e = rec.entry
        if (e is not self._entry or e.caps.num_pages != self._known_pages
                or E.cached_entry(self._ws) is not e
                or (e.host and rec.env != os.environ.get("FIATTN_CPU_CTAS"))):
            return False
        device = self._device
        if not e.host:
            index = device.index
            if E.cuda().device() != index:
                E.check_current_device(index)
        arrays = (qo_indptr, kv_indptr, kv_len_arr, kv_indices)
        if rec.direct != _ALL_DIRECT:
            arrays = [x if direct else _host_i32(x) for x, direct in zip(arrays, rec.direct)]
        t_qo, t_kvp, t_kl, t_idx = arrays
        p_qo, p_kvp = t_qo.data_ptr(), t_kvp.data_ptr()
        last = 4 * rec.batch_size  # both indptr arrays have batch_size + 1 elements
        nnz = _I32.from_address(p_kvp + last).value
        q_tokens = _I32.from_address(p_qo + last).value
        scale = float(sm_scale)
        if (nnz > rec.n_indices or q_tokens > e.caps.max_q_tokens
                or (e.captured_rows is not None and q_tokens > e.captured_rows)):
            return False  # the checked path raises or re-plans
        buf = None
        if rec.staged:  # the buffer _table_buffer picks, unless it must grow
            buf = self._bufs.get(self._table_name)
            if buf is None or buf.numel() < nnz:
                buf = self._table_buffer(kv_indices, nnz)
        b = self._batch  # shared by every plan of this wrapper: this signature's fields
        if self._batch_rec is not rec:
            b.batch_size = rec.batch_size
            b.causal = rec.causal
            self._batch_rec = rec
        b.qo_indptr = p_qo
        b.kv_indptr = p_kvp
        b.kv_indices = t_idx.data_ptr()
        b.kv_len = t_kl.data_ptr()
        stream = None if e.host else E.stream_handle(device)
        try:
            E.plan(e, b, device, stream)
        except FiattnError as ex:
            if ex.status == C.FI_ERR_PAGE_INDEX_OUT_OF_RANGE:
                return False
            raise
        B, heads, page_size, q_dt, kv_dt, o_dt = rec.planned
        table = self._kernel_table(buf, kv_indices, nnz, (qo_indptr, kv_indptr, kv_len_arr),
                                   arrays, stream)
        self._set_planned(B, q_tokens, heads, page_size, q_dt, kv_dt, o_dt, scale, table, nnz)
        return True

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, return_lse=False, *, out=None,
            lse=None, return_lse_base_on_e=False):
        """Run the planned attention (fi_run; capturable under torch.cuda.graph).

        Args:
            q_nope: [q_tokens, num_heads, 512], q_pe: [q_tokens, num_heads, 64]
                (q_tokens = qo_indptr[-1]; more rows are allowed and left alone), the
                planned q_data_type.
            ckv_cache: [num_pages, page_size, 512]; kpe_cache: [num_pages, page_size, 64]
                (or 4-D with a head axis of 1); the planned kv_data_type; may be views of one
                [.., 576] tensor.
            return_lse: also return the LSE.
            out: optional [q_tokens, num_heads, 512] output (q's dtype), written in place.
            lse: optional float32 [q_tokens, num_heads], written in place (with or without
                return_lse).
            return_lse_base_on_e: natural-log LSE instead of FlashInfer's default base 2.
        Returns: out, or (out, lse) when return_lse.
        Raises: RuntimeError before plan(); ValueError / TypeError for mismatching
            tensors; FiattnError subclasses for C statuses.
        """
        p = self._planned
        if p is None:
            raise RuntimeError("fiattn: BatchMLAPagedAttentionWrapper.run before plan()")
        sig = E.tensor_sig
        try:
            key = (sig(q_nope), sig(q_pe), sig(ckv_cache), sig(kpe_cache),
                   None if out is None else sig(out), None if lse is None else sig(lse),
                   bool(return_lse), bool(return_lse_base_on_e))
            fast = self._run_memo.get(key)
        except (AttributeError, TypeError):
            key = fast = None
        if fast is not None:
            return self._run_fast(fast, p, q_nope, q_pe, ckv_cache, kpe_cache, out, lse,
                                  return_lse, return_lse_base_on_e)
        t = torch()
        device = self._device
        for name, x in (("q_nope", q_nope), ("q_pe", q_pe)):
            check_tensor(x, name, (p["q_dt"],), device, 3)
        for name, x in (("ckv_cache", ckv_cache), ("kpe_cache", kpe_cache)):
            check_tensor(x, name, (p["kv_dt"],), device, (3, 4))
        rows, H = q_nope.shape[0], q_nope.shape[1]
        if q_nope.shape[1:] != (p["heads"], 512) or tuple(q_pe.shape) != (rows, p["heads"], 64):
            raise ValueError(f"fiattn: q_nope / q_pe must be [tokens, {p['heads']}, 512 / 64], "
                             f"got {tuple(q_nope.shape)} / {tuple(q_pe.shape)}")
        if rows < p["q_tokens"]:
            raise ValueError(f"fiattn: q_nope has {rows} rows, the plan has {p['q_tokens']}")

        def cache_view(x, name, d):
            if x.dim() == 4:
                if x.shape[2] != 1:
                    raise ValueError(f"fiattn: 4-D {name} must have a head axis of 1")
                x = x[:, :, 0]
            if x.shape[1] != p["page_size"] or x.shape[2] != d:
                raise ValueError(f"fiattn: {name} must be [num_pages, {p['page_size']}, {d}], "
                                 f"got {tuple(x.shape)}")
            return x

        ckv = cache_view(ckv_cache, "ckv_cache", 512)
        kpe = cache_view(kpe_cache, "kpe_cache", 64)
        if ckv.shape[0] != kpe.shape[0]:
            raise ValueError("fiattn: ckv_cache and kpe_cache hold different page counts")
        e = self._entry
        if ckv.shape[0] < e.caps.num_pages:
            raise ValueError(f"fiattn: the caches hold {ckv.shape[0]} pages, the plan reads "
                             f"page {e.caps.num_pages - 1}")
        self._known_pages = max(self._known_pages, ckv.shape[0])
        out_new = out is None
        if out is None:
            out = t.empty((rows, H, 512), dtype=p["o_dt"], device=device)
        else:
            check_tensor(out, "out", (p["o_dt"],), device, 3)
            if tuple(out.shape) != (rows, H, 512):
                raise ValueError(f"fiattn: out must be {(rows, H, 512)}, got {tuple(out.shape)}")
        lse_new = lse is None and return_lse
        if lse is None and return_lse:
            lse = t.empty((rows, H), dtype=t.float32, device=device)
        elif lse is not None:
            check_tensor(lse, "lse", (t.float32,), device, 2)
            if tuple(lse.shape) != (rows, H):
                raise ValueError(f"fiattn: lse must be {(rows, H)}, got {tuple(lse.shape)}")
        args = C.fi_attn_args()
        fill_tensor(args.q, q_nope, list(q_nope.shape), q_nope.stride())
        fill_tensor(args.q_rope, q_pe, list(q_pe.shape), q_pe.stride())
        fill_tensor(args.k, ckv, [ckv.shape[0], ckv.shape[1], 1, 512],
                    [ckv.stride(0), ckv.stride(1), 512, 1])
        fill_tensor(args.k_rope, kpe, [kpe.shape[0], kpe.shape[1], 1, 64],
                    [kpe.stride(0), kpe.stride(1), 64, 1])
        tab = p["table"]
        fill_tensor(args.page_table, tab, [tab.numel()], [1])
        args.page_table.dtype = C.FI_DTYPE_I32
        fill_tensor(args.out, out, list(out.shape), out.stride())
        if lse is not None:
            fill_tensor(args.lse, lse, list(lse.shape), lse.stride())
        args.bmm1_scale = p["sm_scale"]
        args.bmm2_scale = 1.0
        set_pdl(args, None, device)
        host = device.type == "cpu"
        if not host and E.cuda().capturing():
            e.captured_rows = rows if e.captured_rows is None else min(e.captured_rows, rows)
        dts = (p["q_dt"], p["kv_dt"], p["o_dt"])
        E.execute(e, args, device, _FAMILY, dts)
        if key is not None:
            if len(self._run_memo) >= 64:
                self._run_memo.clear()
            kpe_off = (kpe.data_ptr() - kpe_cache.data_ptr())
            self._run_memo[key] = (
                args, ctypes.byref(args), (rows, H, 512) if out_new else None,
                (rows, H) if lse_new else None, kpe_off, dts, rows)
        if lse is not None and not return_lse_base_on_e:
            lse.mul_(LOG2E)
        return (out, lse) if return_lse else out

    def _run_fast(self, fast, p, q_nope, q_pe, ckv_cache, kpe_cache, out, lse, return_lse,
                  base_e):
        """run() with the signature of an earlier successful run under this plan shape:
        the checks passed then and pass now; refresh the addresses, table and scale."""
        args, args_ref, out_shape, lse_shape, kpe_off, dts, rows = fast
        e = self._entry
        cuda = not e.host
        if cuda:
            cu = E.cuda()
            index = self._device.index
            if cu.device() != index:
                E.check_current_device(index)
        if out_shape is not None:
            out = torch().empty(out_shape, dtype=p["o_dt"], device=self._device)
        if lse_shape is not None:
            lse = torch().empty(lse_shape, dtype=torch().float32, device=self._device)
        args.q.data = q_nope.data_ptr()
        args.q_rope.data = q_pe.data_ptr()
        args.k.data = ckv_cache.data_ptr()
        args.k_rope.data = kpe_cache.data_ptr() + kpe_off
        pt = args.page_table
        pt.data = p["table_ptr"]
        pt.shape[0] = p["table_n"]
        args.out.data = out.data_ptr()
        if lse is not None:
            args.lse.data = lse.data_ptr()
        args.bmm1_scale = p["sm_scale"]
        lib = C.lib()
        if cuda:
            if cu.capturing():
                e.captured_rows = rows if e.captured_rows is None else min(e.captured_rows,
                                                                           rows)
            st = lib.fi_run(e.plan, args_ref, cu.stream(index))
        else:
            st = lib.fi_ref_run(e.plan, args_ref)
        if st:
            E.run_failed(e, st, _FAMILY, dts)
        if lse is not None and not base_e:
            lse.mul_(LOG2E)
        return (out, lse) if return_lse else out
