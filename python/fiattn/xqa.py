"""XQA MLA: fiattn's drop-in for ``flashinfer.xqa.xqa_mla``.

The same MLA decode as fiattn.mla (q_nope . ckv + q_pe . kpe logits, V = ckv), with XQA's
scale convention: logit scale = q_scale * kv_scale / sqrt(576) (576 = q.shape[-1], the
head dim XQA scales by), output scale = kv_scale (V dequantisation).
"""
import math

from . import _capi as C
from ._common import check_lengths, num_ctas_for, require_device
from ._torch import check_tensor, float_dtypes, fp8_dtypes, torch
from .mla import _mla_block_tables

__all__ = ["xqa_mla"]


def xqa_mla(q, k_cache, v_cache, page_table, seq_lens, output, workspace_buffer, semaphores,
            page_size, q_scale=1.0, kv_scale=1.0, sm_count=None, enable_pdl=None):
    """MLA decode, XQA interface; writes `output` in place and returns None.

    Args:
        q: [batch_size, beam_width (1), num_q_heads, 576]; the reference's dtype is fp8
            e4m3 (FiattnNotImplementedError: fp8 MLA is not on the GPU yet); bf16 / fp16
            also run (GPU) and fp32 / fp16 / bf16 on the CPU.
        k_cache: the concatenated ckv ++ kpe cache, [num_pages * page_size, 576] or
            [num_pages, page_size, 576] (rows of one page contiguous in token order).
        v_cache: the same memory as k_cache (MLA's V is the first 512 columns of ckv), last
            dim 512 or 576; a V cache elsewhere raises ValueError (fiattn reads V from K).
        page_table: int32 [batch_size, nb_pages_per_seq], contiguous, on the device.
        seq_lens: uint32 / int32 [batch_size, beam_width] KV lengths; read on the host.
        output: [batch_size, beam_width, num_q_heads, 512], bf16 (or q's float dtype),
            written in place.
        workspace_buffer: uint8 device buffer holding fiattn's plan and partials (at least
            fiattn.workspace_size(...) bytes, WorkspaceTooSmallError otherwise).
        semaphores: accepted for compatibility and not touched (fiattn's semaphores live in
            the workspace).
        page_size: tokens per page, 16 / 32 / 64 / 128 (1 also works).
        q_scale, kv_scale: floats or one-element float32 device tensors; logit scale
            q_scale * kv_scale / sqrt(576), output scale kv_scale.  Tensor scales are
            combined with two small device ops on the current stream.
        sm_count: persistent CTAs (None: the device's SM count).
        enable_pdl: None = on for CUDA.
    Raises: TypeError / ValueError before any C call; FiattnValueError (rejected batch);
        FiattnNotImplementedError (fp8, beam_width > 1); FiattnError.
    """
    t = torch()
    check_tensor(q, "q", float_dtypes() + fp8_dtypes(), None, 4)
    device = q.device
    require_device(device)
    B, beam, H, D = q.shape
    if beam != 1:
        raise NotImplementedError("fiattn: xqa_mla supports beam_width 1 only")
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
    seq_lens = check_lengths(seq_lens, "seq_lens", B * beam)
    check_tensor(output, "output", float_dtypes(), device, 4)
    if tuple(output.shape) != (B, beam, H, 512):
        raise ValueError(f"fiattn: output must be {(B, beam, H, 512)}, got {tuple(output.shape)}")
    c = 1.0 / math.sqrt(576.0)
    if isinstance(q_scale, t.Tensor) or isinstance(kv_scale, t.Tensor):
        qs = q_scale if isinstance(q_scale, t.Tensor) else t.tensor(float(q_scale), device=device)
        ks = kv_scale if isinstance(kv_scale, t.Tensor) else t.tensor(float(kv_scale), device=device)
        bmm1 = (qs.float().reshape(1) * ks.float().reshape(1) * c).contiguous()
        bmm2 = ks.float().reshape(1).contiguous()
    else:
        bmm1, bmm2 = float(q_scale) * float(kv_scale) * c, float(kv_scale)
    _mla_block_tables(q, k_cache, kshape, kstride, workspace_buffer, page_table, seq_lens,
                      output, bmm1, bmm2, None, enable_pdl, num_ctas_for(device, sm_count),
                      num_pages, ps)
    return None
