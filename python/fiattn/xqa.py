"""XQA MLA: fiattn's drop-in for ``flashinfer.xqa.xqa_mla``.

The same MLA decode as fiattn.mla (q_nope . ckv + q_pe . kpe logits, V = ckv), with XQA
MLA's scale convention::

    s_j = q_scale * kv_scale * (q . k_j)          no 1 / sqrt(head_dim) factor
    out = kv_scale * sum_j softmax(s)_j v_j

i.e. fiattn's bmm1_scale = q_scale * kv_scale and bmm2_scale = kv_scale.  q_scale and
kv_scale are the dequantisation scales of an fp8 q and fp8 KV cache (one scale for K and
V); the softmax scale (1 / sqrt(192) for DeepSeek) must be folded into q_scale by the
caller.  The reference page states neither; this is what the reference implementation
computes: FlashInfer 0.7.2's csrc/xqa/mla_sm120.cu sets qkScaleLog2e = qScale *
kvCacheScale * log2e and scales the output by kvCacheScale, and its tests
(tests/attention/test_xqa.py::test_xqa_mla) compare against a reference given
q_scale * sqrt(576), cancelling the reference's 1 / sqrt(576).  (The GQA XQA kernel,
behind xqa_batch_decode_with_kv_cache, does scale by 1 / sqrt(head_dim); the MLA one does
not.)
"""
import os

from . import _engine as E
from ._common import check_lengths, num_ctas_for, require_device
from ._torch import check_tensor, float_dtypes, fp8_dtypes, torch
from .errors import FiattnNotImplementedError
from .mla import _mla_block_tables

__all__ = ["xqa_mla"]

_NUM = (float, int)


def _scales(q_scale, kv_scale, device):
    """(bmm1_scale, bmm2_scale) from XQA MLA's (q_scale, kv_scale): q_scale * kv_scale and
    kv_scale.  Numbers give floats; when either is a tensor (one element, any float dtype,
    on the call's device) both become one-element float32 device tensors computed by two
    small device ops on the current stream (read by the kernel at run time)."""
    t = torch()
    if isinstance(q_scale, t.Tensor) or isinstance(kv_scale, t.Tensor):
        for name, s in (("q_scale", q_scale), ("kv_scale", kv_scale)):
            if isinstance(s, t.Tensor) and (s.numel() != 1 or s.device != device):
                raise ValueError(f"fiattn: {name} tensor must hold one element on {device}, "
                                 f"got shape {tuple(s.shape)} on {s.device}")
        qs = q_scale if isinstance(q_scale, t.Tensor) else t.tensor(float(q_scale), device=device)
        ks = kv_scale if isinstance(kv_scale, t.Tensor) else t.tensor(float(kv_scale), device=device)
        bmm2 = ks.float().reshape(1).contiguous()
        return (qs.float().reshape(1) * bmm2).contiguous(), bmm2
    return float(q_scale) * float(kv_scale), float(kv_scale)


def xqa_mla(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores,
            page_size, q_scale=1.0, kv_scale=1.0, sm_count=None, enable_pdl=None):
    """MLA decode, XQA interface; writes `output` in place and returns None.

    Args:
        q: [batch_size, beam_width (1), num_q_heads, 576]; num_q_heads 16 / 32 / 64 / 128
            (the reference: 128 only).  The reference's dtype is fp8 e4m3.  On the GPU: fp8
            e4m3 (float8_e4m3fn), bf16 or fp16 over an fp8 e4m3 cache (fp16 matmuls in the
            kernel, bf16 output), or bf16 / fp16 with a cache and output of q's dtype; other
            combinations raise FiattnNotImplementedError (nothing written).  On the CPU
            fp32 / fp16 / bf16 / fp8 e4m3 (widened exactly).
        k_cache: the concatenated ckv ++ kpe cache, [num_pages * page_size, 576] or
            [num_pages, page_size, 576] (rows of one page contiguous in token order), fp8
            e4m3 (the reference's) or q's dtype; element strides (= bytes for fp8).
        v_cache: the same memory as k_cache (MLA's V is the first 512 columns of ckv), last
            dim 512 or 576; a V cache elsewhere raises ValueError (fiattn reads V from K).
        page_table: int32 [batch_size, nb_pages_per_seq], contiguous, on the device.
        seq_lens: uint32 / int32 [batch_size, beam_width] KV lengths; read on the host.
        output: [batch_size, beam_width, num_q_heads, 512], written in place: bf16 over
            an fp8 cache (what the reference writes), else q's dtype.
        workspace_buffer: uint8 device buffer holding fiattn's plan and partials (at least
            fiattn.workspace_size(...) bytes, WorkspaceTooSmallError otherwise).
        semaphores: accepted for compatibility and not touched (fiattn's semaphores live in
            the workspace).
        page_size: tokens per page, 16 / 32 / 64 / 128 (1 also works).
        q_scale, kv_scale: floats or one-element float tensors on q's device (read at run
            time): logit scale q_scale * kv_scale (no 1 / sqrt(576): fold the softmax
            scale into q_scale), output scale kv_scale; see the module docstring.
        sm_count: persistent CTAs (None: the device's SM count).
        enable_pdl: None = on for CUDA.
    Raises: TypeError / ValueError before any C call; FiattnValueError (rejected batch);
        FiattnNotImplementedError (a dtype combination the executor lacks, e.g. an fp8
        cache with an fp16 output, or fp8 q over a bf16 cache; beam_width > 1);
        FiattnError.
    Repeat calls with the same tensor layouts, page_size, sm_count and enable_pdl, and float
    scales, reuse the descriptors recorded by the first (data addresses, scales and lengths
    refreshed).
    """
    key = None
    if type(q_scale) in _NUM and type(kv_scale) in _NUM:
        sig = E.tensor_sig
        try:
            key = ("xqa_mla", sig(q), sig(k_cache), sig(v_cache), sig(page_table),
                   sig(seq_lens), sig(output), page_size, sm_count, enable_pdl)
            entry, fast = E.lookup(workspace_buffer, key)
        except (AttributeError, TypeError):
            key = fast = None
        if (fast is not None and v_cache.data_ptr() == k_cache.data_ptr()
                and (fast.cuda or fast.env == os.environ.get("FIATTN_CPU_CTAS"))):
            fast.args.bmm1_scale, fast.args.bmm2_scale = _scales(q_scale, kv_scale, None)
            E.fast_call(entry, fast, (q, k_cache, page_table, seq_lens, output))
            return None
    t = torch()
    check_tensor(q, "q", float_dtypes() + fp8_dtypes(), None, 4)
    device = q.device
    require_device(device)
    B, beam, H, D = q.shape
    if beam != 1:
        raise FiattnNotImplementedError("fiattn: xqa_mla supports beam_width 1 only (as the "
                                        "reference)")
    if D != 576:
        raise ValueError(f"fiattn: q's last dim must be 576, got {D}")
    check_tensor(k_cache, "k_cache", float_dtypes() + fp8_dtypes(), device, (2, 3))
    check_tensor(v_cache, "v_cache", (k_cache.dtype,), device, (2, 3))
    if k_cache.shape[-1] != 576:
        raise ValueError(f"fiattn: k_cache's last dim must be 576, got {k_cache.shape[-1]}")
    if v_cache.data_ptr() != k_cache.data_ptr() or v_cache.shape[-1] not in (512, 576):
        raise ValueError("fiattn: v_cache must be the first 512 (or all 576) columns of "
                         "k_cache: fiattn's MLA reads V from the ckv part of K")
    ps = int(page_size)
    if k_cache.dim() == 2:
        if k_cache.shape[0] % ps:
            raise ValueError(f"fiattn: k_cache rows ({k_cache.shape[0]}) are not a multiple "
                             f"of page_size {ps}")
        num_pages = k_cache.shape[0] // ps
        kshape, kstride = [num_pages, ps, 576], [ps * k_cache.stride(0), k_cache.stride(0), 1]
    else:
        if k_cache.shape[1] != ps:
            raise ValueError(f"fiattn: k_cache's page axis is {k_cache.shape[1]}, page_size {ps}")
        num_pages = k_cache.shape[0]
        kshape, kstride = list(k_cache.shape), list(k_cache.stride())
    check_tensor(page_table, "page_table", (t.int32,), device, 2)
    if page_table.shape[0] != B or not page_table.is_contiguous():
        raise ValueError("fiattn: page_table must be a contiguous [batch_size, pages] tensor")
    check_lengths(seq_lens, "seq_lens", B * beam)
    check_tensor(output, "output", float_dtypes(), device, 4)
    if tuple(output.shape) != (B, beam, H, 512):
        raise ValueError(f"fiattn: output must be {(B, beam, H, 512)}, got {tuple(output.shape)}")
    bmm1, bmm2 = _scales(q_scale, kv_scale, device)
    _mla_block_tables(q, k_cache, kshape, kstride, workspace_buffer, page_table, seq_lens,
                      output, bmm1, bmm2, None, enable_pdl, num_ctas_for(device, sm_count),
                      num_pages, ps, key)
    return None
