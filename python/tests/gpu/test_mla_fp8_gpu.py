"""GPU tests of the MLA fp8 KV and sparse top-k paths of the Python layer (skipped without
torch + CUDA or without torch's float8_e4m3fn): xqa_mla and
trtllm_batch_decode_with_kv_cache_mla over fp8 e4m3 caches (q fp8 e4m3 or bf16, out bf16)
against a torch fp64 reference on the dequantised inputs (fp8 -> float is exact), and
sparse top-k decode (sparse_mla_top_k > 0, bf16 and fp8 caches) against a reference that
gathers each query token's listed slots.  Outputs are poisoned with NaN and must be fully
overwritten; per (token, head) row ||out - ref|| / ||ref|| <= 2e-2 (the kernel's matmuls
are fp16: a bf16 q and P are rounded to fp16), rows without keys exactly zero."""
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"),
              pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="no fp8 dtype")]

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fiattn  # noqa: E402
from reference import paged_attention_ref  # noqa: E402

DEV = "cuda"
WS_BYTES = 128 << 20
TOL = 2e-2


@pytest.fixture
def ws():
    w = torch.empty(WS_BYTES, dtype=torch.uint8, device=DEV)
    yield w
    fiattn.release_workspace(w)


def _e4m3(shape, g):
    """Random fp8 e4m3 codes with |x| < 2 (exponent field 0..7, subnormals included), as
    tests/gpu/gpu_case_common.h draws them."""
    b = torch.randint(0, 256, shape, generator=g, dtype=torch.uint8) & 0xBF
    return b.view(torch.float8_e4m3fn)


def _q(shape, kind, g):
    if kind == "e4m3":
        return _e4m3(shape, g)
    return (torch.rand(shape, generator=g) * 2 - 1).to(torch.bfloat16)


def _row_errors(out, ref):
    """Per (token, head) row relative 2-norm errors of out [T, H, 512] against ref (fp64);
    rows whose reference is zero must be zero (error = |out|)."""
    out, ref = out.double(), ref.double()
    num = (out - ref).norm(dim=-1)
    den = ref.norm(dim=-1)
    return torch.where(den > 0, num / den.clamp_min(1e-300), out.norm(dim=-1))


def _check(out, ref, what):
    assert not torch.isnan(out).any(), f"{what}: NaN left (poison not overwritten)"
    err = _row_errors(out.cpu(), ref)
    worst = float(err.max())
    print(f"{what}: worst row rel err {worst:.3e}")
    assert worst <= TOL, f"{what}: worst row rel err {worst:.3e} > {TOL}"


def _paged(B, ql, H, ps, max_len, q_kind, g, min_len=1):
    ppr = (max_len + ps - 1) // ps
    num_pages = B * ppr + 3
    kv = _e4m3((num_pages, ps, 576), g)
    q = _q((B, ql, H, 576), q_kind, g)
    bt = torch.randperm(num_pages, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr)
    lens = torch.randint(min_len, max_len + 1, (B,), generator=g, dtype=torch.int32)
    return q, kv, bt, lens


def _dense_ref(q, kv, bt, lens, bmm1, bmm2, sinks=None):
    B, ql, H, _ = q.shape
    kp = kv.float().double()[:, :, None, :]
    return paged_attention_ref(q.float().double().reshape(B * ql, H, 576), kp, kp[..., :512],
                               bt.tolist(), lens.tolist(), [ql] * B, [b * ql for b in range(B)],
                               bmm1, bmm2, sinks=None if sinks is None else sinks.cpu())[0]


@pytest.mark.parametrize("q_kind", ["e4m3", "bf16"])
@pytest.mark.parametrize("B,H,ps,scales", [(5, 128, 64, "float"), (7, 16, 32, "tensor"),
                                           (3, 64, 16, "mixed")])
def test_xqa_mla_fp8(ws, q_kind, B, H, ps, scales):
    """xqa_mla over an fp8 cache: logits q_scale * kv_scale * q.k, output kv_scale * P V,
    bf16 output; scales as floats or one-element device tensors."""
    g = torch.Generator().manual_seed(B * 100 + H + (q_kind == "bf16"))
    q, kv, bt, lens = _paged(B, 1, H, ps, 1500, q_kind, g)
    cache = kv.to(DEV).reshape(-1, 576)
    out = torch.full((B, 1, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    qs, ks = 0.04, 1.25
    q_scale = torch.tensor([qs], device=DEV) if scales == "tensor" else qs
    kv_scale = torch.tensor([ks], device=DEV) if scales in ("tensor", "mixed") else ks
    fiattn.xqa.xqa_mla(q.to(DEV), cache, cache[:, :512], bt.to(DEV), lens.reshape(B, 1).to(DEV),
                       out, ws, torch.zeros(8, dtype=torch.int32, device=DEV), ps,
                       q_scale=q_scale, kv_scale=kv_scale)
    torch.cuda.synchronize()
    _check(out.reshape(B, H, 512), _dense_ref(q, kv, bt, lens, qs * ks, ks),
           f"xqa_mla q {q_kind} kv e4m3 H {H} ps {ps}")


@pytest.mark.parametrize("q_kind", ["e4m3", "bf16"])
@pytest.mark.parametrize("B,ql,H,ps,max_len", [(4, 1, 128, 64, 3000), (3, 2, 64, 32, 700),
                                               (6, 4, 16, 128, 900), (2, 1, 32, 16, 40)])
def test_trtllm_mla_fp8(ws, q_kind, B, ql, H, ps, max_len):
    """trtllm_batch_decode_with_kv_cache_mla over an fp8 cache, causal MTP rows, bmm1 as a
    float and bmm2 as a device tensor, sinks on one shape; out allocated (bf16) or given."""
    g = torch.Generator().manual_seed(B * 1000 + ql * 100 + H)
    q, kv, bt, lens = _paged(B, ql, H, ps, max_len, q_kind, g, min_len=ql)
    sinks = torch.randn(H, generator=g) if H == 64 else None
    scale = 1.0 / math.sqrt(192)
    given = ql != 4
    out = (torch.full((B, ql, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
           if given else None)
    r = fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
        q.to(DEV), kv.to(DEV), ws, 128, 512, 64, bt.to(DEV), lens, int(lens.max()), out=out,
        bmm1_scale=scale, bmm2_scale=torch.tensor([0.75], device=DEV),
        sinks=None if sinks is None else sinks.to(DEV))
    torch.cuda.synchronize()
    assert r.dtype == torch.bfloat16 and (not given or r is out)
    _check(r.reshape(B * ql, H, 512), _dense_ref(q, kv, bt, lens, scale, 0.75, sinks),
           f"trtllm q {q_kind} kv e4m3 B {B} q_len {ql} H {H} ps {ps}")


def test_fp8_cache_with_f16_out_not_implemented(ws):
    """fp16 q over an fp8 cache gives an fp16 out, which the GPU body does not write
    (bf16 only): NotImplementedError, out untouched."""
    g = torch.Generator().manual_seed(5)
    q, kv, bt, lens = _paged(2, 1, 16, 64, 300, "bf16", g)
    out = torch.full((2, 1, 16, 512), 3.0, dtype=torch.float16, device=DEV)
    with pytest.raises(NotImplementedError):
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
            q.to(DEV).half(), kv.to(DEV), ws, 128, 512, 64, bt.to(DEV), lens, 300, out=out)
    torch.cuda.synchronize()
    assert (out == 3.0).all()


# ---- sparse top-k ---------------------------------------------------------------------------

def _sparse_table(bt, lens, ql, K, ps, g, pad=0.2, empty_every=0):
    """[B, q_len, K] int32 flat KV slots (page * page_size + offset) of each request's own
    positions (< its length), distinct within a row, random order, about `pad` of them -1;
    every empty_every-th query token's row all -1."""
    B = bt.shape[0]
    t = torch.full((B, ql, K), -1, dtype=torch.int32)
    for b in range(B):
        L = int(lens[b])
        for i in range(ql):
            r = b * ql + i
            if empty_every and r % empty_every == empty_every - 1:
                continue
            n = min(K, L)
            n -= int(n * pad)
            pos = torch.randperm(L, generator=g)[:n]
            slots = bt[b, pos // ps].long() * ps + pos % ps
            row = torch.full((K,), -1, dtype=torch.int64)
            row[:n] = slots
            t[b, i] = row[torch.randperm(K, generator=g)].to(torch.int32)
    return t


def _sparse_ref(q, kv, table, bmm1, bmm2):
    """fp64 truth: token r attends to exactly its listed slots (rows without one: zeros)."""
    B, ql, H, _ = q.shape
    flat = kv.float().double().reshape(-1, 576)
    qd = q.float().double().reshape(B * ql, H, 576)
    out = torch.zeros(B * ql, H, 512, dtype=torch.float64)
    for r, row in enumerate(table.reshape(B * ql, -1)):
        keys = flat[row[row >= 0].long()]
        if keys.shape[0] == 0:
            continue
        p = torch.softmax(bmm1 * (qd[r] @ keys.T), dim=-1)
        out[r] = bmm2 * (p @ keys[:, :512])
    return out


@pytest.mark.parametrize("kind", ["bf16", "e4m3", "bf16q_e4m3kv"])
@pytest.mark.parametrize("B,ql,H,K,ps,max_len", [(3, 1, 16, 64, 1, 200), (2, 2, 128, 512, 64, 3000),
                                                 (2, 2, 16, 2048, 32, 5000)])
def test_trtllm_mla_sparse(ws, kind, B, ql, H, K, ps, max_len):
    """sparse_mla_top_k = K: block_tables [B, q_len, K] of flat slots with -1 padding and
    rows without keys (zeros), against the gather reference; then a repeat call (the
    memoised fast path) with another table of the same shape, given as [B * q_len, K]."""
    g = torch.Generator().manual_seed(B * 7 + ql * 11 + K + len(kind))
    q_kind = "e4m3" if kind == "e4m3" else "bf16"
    q, kv, bt, lens = _paged(B, ql, H, ps, max_len, q_kind, g, min_len=ql)
    if kind == "bf16":
        kv = (torch.rand(kv.shape, generator=g) * 2 - 1).to(torch.bfloat16)
    qd, kvd = q.to(DEV), kv.to(DEV)
    scale = 0.06
    for rep in range(2):
        table = _sparse_table(bt, lens, ql, K, ps, g, pad=0.1 * rep + 0.05, empty_every=3)
        t_dev = table.to(DEV) if rep == 0 else table.reshape(B * ql, K).to(DEV)
        out = torch.full((B, ql, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
            qd, kvd, ws, 128, 512, 64, t_dev, lens, int(lens.max()), sparse_mla_top_k=K,
            out=out, bmm1_scale=scale, bmm2_scale=1.5)
        torch.cuda.synchronize()
        ref = _sparse_ref(q, kv, table, scale, 1.5)
        _check(out.reshape(B * ql, H, 512), ref,
               f"sparse {kind} B {B} q_len {ql} H {H} K {K} ps {ps} call {rep}")
        empty = (table.reshape(B * ql, K) < 0).all(dim=-1)
        assert empty.any() and (out.reshape(B * ql, H, 512)[empty.to(DEV)] == 0).all()


def test_sparse_under_device_planning_plans_on_the_host(ws):
    """Inside fiattn.device_planning() a sparse call still runs (host plan: the device
    planner has no sparse form) and matches the reference."""
    g = torch.Generator().manual_seed(77)
    q, kv, bt, lens = _paged(2, 1, 16, 64, 800, "e4m3", g)
    table = _sparse_table(bt, lens, 1, 256, 64, g)
    out = torch.full((2, 1, 16, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    with fiattn.device_planning():
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
            q.to(DEV), kv.to(DEV), ws, 128, 512, 64, table.to(DEV), lens.to(DEV), 800,
            sparse_mla_top_k=256, out=out, bmm1_scale=0.05)
    torch.cuda.synchronize()
    _check(out.reshape(2, 16, 512), _sparse_ref(q, kv, table, 0.05, 1.0), "sparse device_planning")
