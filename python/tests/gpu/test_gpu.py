"""GPU tests of the Python layer (skipped without torch + CUDA): every API against the
torch fp64 reference on fresh random data, poisoned outputs fully overwritten, CUDA graph
capture + replay with changing lengths, and FlashInfer side by side when importable.
Families not on the GPU yet must raise NotImplementedError (never a wrong result)."""
import contextlib
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fiattn  # noqa: E402
from reference import nvfp4_dequant, paged_attention_ref, rel_err, split_pages  # noqa: E402

DEV = "cuda"
WS_BYTES = 128 << 20
TOL = 1e-2  # bf16 / fp16 inputs, relative 2-norm error (docs/DESIGN.md)


@pytest.fixture
def ws():
    w = torch.empty(WS_BYTES, dtype=torch.uint8, device=DEV)
    yield w
    fiattn.release_workspace(w)


def _lens(B, max_len, g, at_least=1):
    return torch.randint(at_least, max_len + 1, (B,), generator=g, dtype=torch.int32)


def _mla_case(B, ql, H, ps, max_len, dtype, g):
    ppr = (max_len + ps - 1) // ps
    num_pages = B * ppr + 7
    kv = torch.randn(num_pages, ps, 576, generator=g).to(dtype)
    q = torch.randn(B, ql, H, 576, generator=g).to(dtype)
    bt = torch.randperm(num_pages, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr)
    lens = _lens(B, max_len, g, ql)
    return q, kv, bt, lens


def _mla_ref(q, kv, bt, lens, scale, bmm2=1.0, sinks=None):
    B, ql, H, _ = q.shape
    kp = kv.float()[:, :, None, :]
    return paged_attention_ref(q.float().reshape(B * ql, H, 576), kp, kp[..., :512], bt.tolist(),
                               lens.tolist(), [ql] * B, [b * ql for b in range(B)], scale, bmm2,
                               sinks=None if sinks is None else sinks.cpu())[0]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("B,ql,H,ps,max_len", [
    (1, 1, 16, 64, 4096), (7, 1, 128, 64, 700), (16, 2, 64, 32, 300), (5, 4, 16, 1, 90),
    (33, 1, 32, 16, 2000), (3, 8, 16, 128, 513)])
def test_trtllm_mla(ws, dtype, B, ql, H, ps, max_len):
    g = torch.Generator().manual_seed(B * 1000 + ql * 100 + H)
    q, kv, bt, lens = _mla_case(B, ql, H, ps, max_len, dtype, g)
    sinks = torch.randn(H, generator=g) if H == 64 else None
    out = torch.full((B, ql, H, 512), float("nan"), dtype=dtype, device=DEV)
    scale = 1.0 / math.sqrt(192)
    s2 = torch.tensor([0.75], device=DEV)
    r = fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
        q.to(DEV), kv.to(DEV), ws, 128, 512, 64, bt.to(DEV), lens, int(lens.max()), out=out,
        bmm1_scale=scale, bmm2_scale=s2, sinks=None if sinks is None else sinks.to(DEV))
    torch.cuda.synchronize()
    assert r is out and not torch.isnan(out).any()
    ref = _mla_ref(q, kv, bt, lens, scale, 0.75, sinks)
    assert rel_err(out.cpu().reshape(B * ql, H, 512), ref) < TOL


def test_device_block_tables_need_no_sync(ws, monkeypatch):
    """A CUDA block_tables with CPU seq_lens: no device-to-host copy, no stream or device
    synchronisation on the first or the repeat (fast-path) call, and the right result."""
    g = torch.Generator().manual_seed(11)
    q, kv, bt, lens = _mla_case(6, 1, 16, 64, 900, torch.bfloat16, g)
    qd, kvd, btd = q.to(DEV), kv.to(DEV), bt.to(DEV)
    torch.cuda.synchronize()

    def refuse(*a, **k):
        raise AssertionError("fiattn synchronised")
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", refuse)
    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    outs = []
    for _ in range(2):
        out = torch.full((6, 1, 16, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(qd, kvd, ws, 128, 512, 64, btd, lens, 900,
                                                          out=out, bmm1_scale=0.1)
        outs.append(out)
    monkeypatch.undo()
    torch.cuda.synchronize()
    ref = _mla_ref(q, kv, bt, lens, 0.1)
    for out in outs:
        assert rel_err(out.cpu().reshape(6, 16, 512), ref) < TOL


def test_xqa_mla_bf16(ws):
    g = torch.Generator().manual_seed(9)
    B, H, ps = 9, 128, 64
    q, kv, bt, lens = _mla_case(B, 1, H, ps, 1500, torch.bfloat16, g)
    cache = kv.to(DEV).reshape(-1, 576)
    out = torch.full((B, 1, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    # XQA MLA: logit scale q_scale * kv_scale (softmax scale folded into q_scale)
    fiattn.xqa.xqa_mla(q.to(DEV), cache, cache[:, :512], bt.to(DEV), lens.reshape(B, 1).to(DEV),
                       out, ws, torch.zeros(8, dtype=torch.int32, device=DEV), ps,
                       q_scale=0.5 / 24.0, kv_scale=torch.tensor([1.5], device=DEV))
    torch.cuda.synchronize()
    ref = _mla_ref(q, kv, bt, lens, 0.5 / 24.0 * 1.5, 1.5)
    assert rel_err(out.cpu().reshape(B, H, 512), ref) < TOL


@pytest.mark.parametrize("causal,ql", [(False, 1), (True, 3), (True, 40)])
def test_mla_wrapper(ws, causal, ql):
    """Decode, MTP and (ql 40) incremental prefill: query blocks longer than the decode
    kinds' 8 rows, causal and aligned to the end of the KV range, against the reference."""
    g = torch.Generator().manual_seed(21 + ql)
    B, H, ps = (12 if ql <= 8 else 4), 128, 1
    lens = _lens(B, 900, g, ql)
    num_pages = int(lens.sum()) + 10
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
    kv_indices = perm[:int(kv_indptr[-1])]
    qo_indptr = torch.arange(B + 1, dtype=torch.int32) * ql
    ckv = torch.randn(num_pages, ps, 512, generator=g).bfloat16()
    kpe = torch.randn(num_pages, ps, 64, generator=g).bfloat16()
    q_nope = torch.randn(B * ql, H, 512, generator=g).bfloat16()
    q_pe = torch.randn(B * ql, H, 64, generator=g).bfloat16()
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo_indptr.to(DEV), kv_indptr.to(DEV), kv_indices.to(DEV), lens.to(DEV), H, 512, 64,
           ps, causal, 0.06, torch.bfloat16, torch.bfloat16)
    out = torch.full((B * ql, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    o, lse = w.run(q_nope.to(DEV), q_pe.to(DEV), ckv.to(DEV), kpe.to(DEV), True, out=out)
    torch.cuda.synchronize()
    kp = torch.cat([ckv, kpe], -1).float()[:, :, None, :]
    rows = [kv_indices[kv_indptr[b]:kv_indptr[b + 1]].tolist() for b in range(B)]
    ref, ref_lse = paged_attention_ref(torch.cat([q_nope, q_pe], -1).float(), kp, kp[..., :512],
                                       rows, lens.tolist(), [ql] * B, [b * ql for b in range(B)],
                                       0.06, causal=causal)
    assert o is out and rel_err(out.cpu(), ref) < TOL
    assert torch.allclose(lse.cpu().double(), ref_lse / math.log(2), atol=2e-2)


def test_mla_wrapper_repeat_plans_with_host_arrays(ws, monkeypatch):
    """A wrapper without use_cuda_graph, CPU index arrays refilled in place each step: the
    repeat plans take the recorded path and stage kv_indices to the device with no torch
    synchronisation; overwriting the host kv_indices right after plan() does not reach the
    kernel (CUDA stages pageable sources before the copy call returns)."""
    g = torch.Generator().manual_seed(41)
    B, H, ps, ppr = 8, 64, 16, 12
    num_pages = B * ppr + 5
    ckv = torch.randn(num_pages, ps, 512, generator=g).bfloat16()
    kpe = torch.randn(num_pages, ps, 64, generator=g).bfloat16()
    qn = torch.randn(B, H, 512, generator=g).bfloat16()
    qp = torch.randn(B, H, 64, generator=g).bfloat16()
    ckvd, kped, qnd, qpd = ckv.to(DEV), kpe.to(DEV), qn.to(DEV), qp.to(DEV)
    qo = torch.arange(B + 1, dtype=torch.int32)
    kv_indptr = torch.arange(B + 1, dtype=torch.int32) * ppr
    kv_indices = torch.empty(B * ppr, dtype=torch.int32)
    lens = torch.empty(B, dtype=torch.int32)
    kp = torch.cat([ckv, kpe], -1).float()[:, :, None, :]
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)

    def refuse(*a, **k):
        raise AssertionError("fiattn synchronised")
    for step in range(5):
        kv_indices.copy_(torch.randperm(num_pages, generator=g)[:B * ppr])
        lens.copy_(_lens(B, ppr * ps, g))
        want = kv_indices.clone()
        if step >= 2:  # the first plans create the plan entry (sized for the caches)
            monkeypatch.setattr(torch.cuda.Stream, "synchronize", refuse)
            monkeypatch.setattr(torch.cuda, "synchronize", refuse)
        w.plan(qo, kv_indptr, kv_indices, lens, H, 512, 64, ps, False, 0.08, torch.bfloat16,
               torch.bfloat16)
        kv_indices.fill_(num_pages + 1000)
        out = w.run(qnd, qpd, ckvd, kped)
        monkeypatch.undo()
        torch.cuda.synchronize()
        rows = [want[b * ppr:(b + 1) * ppr].tolist() for b in range(B)]
        ref, _ = paged_attention_ref(torch.cat([qn, qp], -1).float(), kp, kp[..., :512], rows,
                                     lens.tolist(), [1] * B, list(range(B)), 0.08,
                                     causal=False)
        assert rel_err(out.cpu(), ref) < TOL
    assert len(w._plan_memo) == 1


def test_gqa_decode_or_not_implemented(ws):
    g = torch.Generator().manual_seed(4)
    B, H, Hkv, D, ps, ppr = 6, 32, 8, 128, 16, 20
    num_pages = B * ppr + 2
    kv = torch.randn(num_pages, 2, ps, Hkv, D, generator=g).bfloat16()
    q = torch.randn(B, H, D, generator=g).bfloat16()
    bt = torch.randperm(num_pages, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr)
    lens = _lens(B, ppr * ps, g)
    out = torch.full((B, H, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    try:
        fiattn.decode.xqa_batch_decode_with_kv_cache(
            q.to(DEV), kv.to(DEV), ws, bt.to(DEV), lens.to(DEV), int(lens.max()),
            bmm1_scale=D ** -0.5, out=out, window_left=100)
    except NotImplementedError as e:
        assert "GQA" in str(e)
        assert torch.isnan(out).all()
        pytest.skip(f"GQA decode not on the GPU yet: {e}")
    torch.cuda.synchronize()
    ref, _ = paged_attention_ref(q.float(), kv[:, 0].float(), kv[:, 1].float(), bt.tolist(),
                                 lens.tolist(), [1] * B, list(range(B)), D ** -0.5,
                                 window_left=100)
    assert rel_err(out.cpu(), ref) < TOL


@pytest.mark.parametrize("device_planning,sinks", [(False, False), (False, True), (True, False)])
def test_gqa_decode_lse_and_two_part_merge(ws, device_planning, sinks):
    """xqa_batch_decode_with_lse on the GPU (Llama-3-8B heads, bf16, requests long enough
    to be split across CTAs): out and the natural-log lse against fp64, on the checked call
    and on the recorded repeat (new lengths, a new lse tensor); then each request's pages
    cut in two, both parts' (out, lse) merged by fiattn.merge_states equal to the whole
    (sinks given to part 0 only).  device_planning: CUDA lengths, planned on the GPU."""
    g = torch.Generator().manual_seed(91 + 2 * device_planning + sinks)
    B, H, Hkv, D, ps, ppr = 4, 32, 8, 128, 16, 160
    num_pages = B * ppr + 3
    kv = torch.randn(num_pages, 2, ps, Hkv, D, generator=g).bfloat16()
    q = torch.randn(B, H, D, generator=g).bfloat16()
    bt = torch.randperm(num_pages, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr)
    sk = torch.randn(H, generator=g) if sinks else None
    kvd, qd, skd = kv.to(DEV), q.to(DEV), None if sk is None else sk.to(DEV)
    ldev = DEV if device_planning else "cpu"
    ctx = fiattn.device_planning if device_planning else contextlib.nullcontext

    def run(bt_, lens_, sinks_):
        out = torch.full((B, H, D), float("nan"), dtype=torch.bfloat16, device=DEV)
        lse = torch.full((B, H), float("nan"), device=DEV)
        with ctx():
            r = fiattn.decode.xqa_batch_decode_with_lse(
                qd, kvd, ws, bt_.to(DEV), lens_.to(ldev), ppr * ps, bmm1_scale=D ** -0.5,
                out=out, sinks=sinks_, lse=lse)
        torch.cuda.synchronize()
        assert r[0] is out and r[1] is lse
        return out.cpu(), lse.cpu()

    for step in range(2):  # checked call, then the recorded repeat
        lens = _lens(B, ppr * ps, g, at_least=ppr * ps // 2)
        out, lse = run(bt, lens, skd)
        ref, ref_lse = paged_attention_ref(q.float(), kv[:, 0].float(), kv[:, 1].float(),
                                           bt.tolist(), lens.tolist(), [1] * B,
                                           list(range(B)), D ** -0.5, sinks=sk)
        assert rel_err(out, ref) < TOL, step
        assert (lse.double() - ref_lse).abs().max() < 1e-2, step
    assert len(fiattn._engine.cached_entry(ws).memo) == 1
    parts = [run(pbt, plens, skd if i == 0 else None)
             for i, (pbt, plens) in enumerate(split_pages(bt, lens, ps))]
    merged, merged_lse = fiattn.merge_states(torch.stack([p[0] for p in parts], 1),
                                             torch.stack([p[1] for p in parts], 1))
    assert rel_err(merged, ref) < TOL
    assert (merged_lse.double() - ref_lse).abs().max() < 1e-2


def _capture(call):
    """call() once on a side stream (plans the workspace), then captured in a CUDA graph."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        call()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    return graph


def _replay_steps(call, graph, lens, new_lens, out, steps, check):
    """Per step: new lengths into `lens`, re-plan under fiattn.plan_only(), poison out,
    replay the graph, check(step)."""
    for step in range(steps):
        lens.copy_(new_lens())
        with fiattn.plan_only():
            call()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        check(step)


def test_graph_capture_replay_with_changing_lengths(ws):
    """Plan outside, capture the run, re-plan (fiattn.plan_only) + replay per step."""
    g = torch.Generator().manual_seed(77)
    B, H, ps, ppr = 16, 128, 64, 40
    num_pages = B * ppr
    kv = torch.randn(num_pages, ps, 576, generator=g).bfloat16().to(DEV)
    q = torch.randn(B, 1, H, 576, generator=g).bfloat16().to(DEV)
    bt = torch.randperm(num_pages, generator=g).to(torch.int32).reshape(B, ppr).to(DEV)
    lens = _lens(B, ppr * ps, g)
    out = torch.empty(B, 1, H, 512, dtype=torch.bfloat16, device=DEV)

    def call():
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q, kv, ws, 128, 512, 64, bt, lens, 0,
                                                         out=out, bmm1_scale=0.05)

    def check(step):
        ref = _mla_ref(q.cpu(), kv.cpu(), bt.cpu(), lens, 0.05)
        assert rel_err(out.cpu().reshape(B, H, 512), ref) < TOL, step

    _replay_steps(call, _capture(call), lens, lambda: _lens(B, ppr * ps, g), out, 4, check)


def test_wrapper_cuda_graph_mode(ws):
    g = torch.Generator().manual_seed(8)
    B, H, ps, maxp = 8, 16, 1, 600
    num_pages = B * maxp
    qo = torch.empty(B + 1, dtype=torch.int32, device=DEV)
    kvp = torch.empty(B + 1, dtype=torch.int32, device=DEV)
    kvi = torch.empty(num_pages, dtype=torch.int32, device=DEV)
    kvl = torch.empty(B, dtype=torch.int32, device=DEV)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws, True, qo, kvp, kvi, kvl)
    ckv = torch.randn(num_pages, ps, 512, generator=g).bfloat16().to(DEV)
    kpe = torch.randn(num_pages, ps, 64, generator=g).bfloat16().to(DEV)
    qn = torch.randn(B, H, 512, generator=g).bfloat16().to(DEV)
    qp = torch.randn(B, H, 64, generator=g).bfloat16().to(DEV)
    out = torch.empty(B, H, 512, dtype=torch.bfloat16, device=DEV)

    def plan():
        lens = _lens(B, maxp, g)
        ind = torch.cat([torch.zeros(1, dtype=torch.int64), lens.cumsum(0)]).to(torch.int32)
        idx = torch.randperm(num_pages, generator=g)[:int(ind[-1])].to(torch.int32)
        w.plan(torch.arange(B + 1, dtype=torch.int32), ind, idx, lens, H, 512, 64, ps, False,
               0.1, torch.bfloat16, torch.bfloat16)
        return lens, ind, idx

    plan()
    w.run(qn, qp, ckv, kpe, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        w.run(qn, qp, ckv, kpe, out=out)
    kp = torch.cat([ckv, kpe], -1).float().cpu()[:, :, None, :]
    for _ in range(3):
        lens, ind, idx = plan()
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        rows = [idx[ind[b]:ind[b + 1]].tolist() for b in range(B)]
        ref, _ = paged_attention_ref(torch.cat([qn, qp], -1).float().cpu(), kp, kp[..., :512],
                                     rows, lens.tolist(), [1] * B, list(range(B)), 0.1,
                                     causal=False)
        assert rel_err(out.cpu(), ref) < TOL


@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_flashinfer_side_by_side(ws, backend):
    """BatchMLAPagedAttentionWrapper against FlashInfer's, on each backend FlashInfer runs on
    Hopper: same inputs, out within 1e-2 (relative 2-norm), LSE (base 2) within 1e-2."""
    flashinfer = pytest.importorskip("flashinfer")
    g = torch.Generator().manual_seed(31)
    B, H, ps = 32, 128, 64
    lens = _lens(B, 2048, g)
    pages = ((lens + ps - 1) // ps).to(torch.int32)
    num_pages = int(pages.sum()) + 4
    kv_indptr = torch.cat([torch.zeros(1, dtype=torch.int64), pages.cumsum(0)]).to(torch.int32)
    kv_indices = torch.randperm(num_pages, generator=g)[:int(kv_indptr[-1])].to(torch.int32)
    ckv = torch.randn(num_pages, ps, 512, generator=g).bfloat16().to(DEV)
    kpe = torch.randn(num_pages, ps, 64, generator=g).bfloat16().to(DEV)
    qn = torch.randn(B, H, 512, generator=g).bfloat16().to(DEV)
    qp = torch.randn(B, H, 64, generator=g).bfloat16().to(DEV)
    args = (torch.arange(B + 1, dtype=torch.int32).to(DEV), kv_indptr.to(DEV),
            kv_indices.to(DEV), lens.to(DEV), H, 512, 64, ps, False, 0.07, torch.bfloat16,
            torch.bfloat16)
    results = []
    fi_ws = torch.empty(WS_BYTES, dtype=torch.uint8, device=DEV)
    for w in (fiattn.mla.BatchMLAPagedAttentionWrapper(ws),
              flashinfer.mla.BatchMLAPagedAttentionWrapper(fi_ws, backend=backend)):
        w.plan(*args)
        results.append(w.run(qn, qp, ckv, kpe, return_lse=True))
    torch.cuda.synchronize()
    (o1, l1), (o2, l2) = results
    assert rel_err(o1.float(), o2.float()) < 1e-2
    assert torch.allclose(l1, l2, atol=1e-2, rtol=1e-2)  # both base 2


def test_flashinfer_xqa_side_by_side(ws):
    """xqa_batch_decode_with_kv_cache against FlashInfer's (Llama-3 8B's 32 / 8 heads, D 128,
    one NHD kv_cache tensor, page 16): same inputs, out within 1e-2 (relative 2-norm)."""
    flashinfer = pytest.importorskip("flashinfer")
    g = torch.Generator().manual_seed(37)
    B, Hq, Hkv, D, ps, ppr = 16, 32, 8, 128, 16, 24
    P = B * ppr + 3
    kv = torch.randn(P, 2, ps, Hkv, D, generator=g).bfloat16().to(DEV)
    q = torch.randn(B, Hq, D, generator=g).bfloat16().to(DEV)
    bt = torch.randperm(P, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr).to(DEV)
    lens = _lens(B, ppr * ps, g).to(DEV)
    if hasattr(torch, "uint32"):
        lens = lens.to(torch.uint32)  # FlashInfer's seq_lens dtype; fiattn takes both
    fi_ws = torch.zeros(WS_BYTES, dtype=torch.uint8, device=DEV)  # zero before first use
    outs = []
    for mod, wsb in ((fiattn.decode, ws), (flashinfer.decode, fi_ws)):
        out = torch.full((B, Hq, D), float("nan"), dtype=torch.bfloat16, device=DEV)
        mod.xqa_batch_decode_with_kv_cache(q, kv, wsb, bt, lens, ppr * ps, bmm1_scale=D ** -0.5,
                                           out=out, kv_layout="NHD", enable_pdl=False)
        outs.append(out)
    torch.cuda.synchronize()
    assert not outs[0].isnan().any()
    assert rel_err(outs[0].float(), outs[1].float()) < 1e-2


def _nvfp4_case(B, H, Hkv, D, ps, ppr, g):
    """Random NVFP4 K / V (e2m1 bytes, e4m3 block scales in [2^-4, 0.5]) in the canonical
    NHD layout [pages, page_size, H_kv, D / 2] / [.., D / 16], their fp64 dequantisation,
    bf16 q, block tables and lengths."""
    P = B * ppr + 3
    vals = [torch.randint(0, 256, (P, ps, Hkv, D // 2), dtype=torch.uint8, generator=g)
            for _ in range(2)]
    sfs = [torch.randint(0x18, 0x31, (P, ps, Hkv, D // 16), dtype=torch.uint8, generator=g)
           for _ in range(2)]
    deq = [nvfp4_dequant(v, s) for v, s in zip(vals, sfs)]
    q = torch.randn(B, H, D, generator=g).bfloat16()
    bt = torch.randperm(P, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr)
    lens = _lens(B, ppr * ps, g)
    return vals, sfs, deq, q, bt, lens


@pytest.mark.parametrize("layout,form,D,ps", [("NHD", "single", 128, 64), ("HND", "tuple", 64, 16),
                                              ("NHD", "tuple", 256, 32), ("HND", "single", 128, 16)])
def test_gqa_decode_nvfp4(ws, layout, form, D, ps):
    """NVFP4 KV against the fp64 reference on the same dequantisation (e2m1 x e4m3 block
    scale); the global scales gk / gv folded into bmm1 / bmm2 as the reference API does.
    The second call (new lengths) takes the recorded fast path."""
    g = torch.Generator().manual_seed(D + ps)
    B, H, Hkv = 5, 16, 2
    vals, sfs, deq, q, bt, lens = _nvfp4_case(B, H, Hkv, D, ps, 12, g)
    gk, gv = 0.8, 0.6
    bmm1, bmm2 = 0.5 * D ** -0.5 * gk, gv
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    if form == "single":
        kv = torch.stack([perm(vals[0]), perm(vals[1])], 1).to(DEV)
        sf = torch.stack([perm(sfs[0]), perm(sfs[1])], 1).to(DEV)
    else:
        kv = (perm(vals[0]).to(DEV), perm(vals[1]).to(DEV))
        sf = (perm(sfs[0]).to(DEV), perm(sfs[1]).to(DEV))
    out = torch.full((B, H, D), float("nan"), dtype=torch.bfloat16, device=DEV)
    btd = bt.to(DEV)
    for step in range(2):
        if step:
            lens = _lens(B, 12 * ps, g)
            out.fill_(float("nan"))
        r = fiattn.decode.xqa_batch_decode_with_kv_cache(
            q.to(DEV), kv, ws, btd, lens, int(lens.max()), bmm1_scale=bmm1, bmm2_scale=bmm2,
            out=out, kv_layout=layout, kv_cache_sf=sf)
        torch.cuda.synchronize()
        assert r is out and not torch.isnan(out).any()
        ref, _ = paged_attention_ref(q.float(), deq[0] * gk, deq[1] * gv, bt.tolist(),
                                     lens.tolist(), [1] * B, list(range(B)), bmm1 / gk,
                                     bmm2 / gv)
        assert rel_err(out.cpu(), ref) < TOL, step
    assert len(fiattn._engine.cached_entry(ws).memo) == 1


def test_gqa_decode_nvfp4_misaligned_scales_raise_before_launch(ws):
    g = torch.Generator().manual_seed(3)
    vals, sfs, _, q, bt, lens = _nvfp4_case(2, 8, 1, 128, 16, 4, g)
    kv = torch.stack(vals, 1).to(DEV)
    sf = torch.stack(sfs, 1).to(DEV)
    buf = torch.zeros(sf.numel() + 8, dtype=torch.uint8, device=DEV)
    shifted = buf[1:1 + sf.numel()].view(sf.shape)
    out = torch.full((2, 8, 128), 7.0, dtype=torch.bfloat16, device=DEV)
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_MISALIGNED_POINTER"):
        fiattn.decode.xqa_batch_decode_with_kv_cache(q.to(DEV), kv, ws, bt.to(DEV), lens, 64,
                                                     out=out, kv_cache_sf=shifted)
    torch.cuda.synchronize()
    assert (out == 7.0).all()


def test_gqa_graph_capture_replay_with_changing_lengths(ws):
    """xqa_batch_decode: plan outside, capture, re-plan (fiattn.plan_only) + replay."""
    g = torch.Generator().manual_seed(78)
    B, H, Hkv, D, ps, ppr = 8, 32, 8, 128, 16, 30
    P = B * ppr
    kv = torch.randn(P, 2, ps, Hkv, D, generator=g).bfloat16().to(DEV)
    q = torch.randn(B, H, D, generator=g).bfloat16().to(DEV)
    bt = torch.randperm(P, generator=g).to(torch.int32).reshape(B, ppr).to(DEV)
    lens = _lens(B, ppr * ps, g)
    out = torch.empty(B, H, D, dtype=torch.bfloat16, device=DEV)

    def call():
        fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 0, bmm1_scale=0.08,
                                                     out=out)

    kc = kv.cpu()

    def check(step):
        ref, _ = paged_attention_ref(q.float().cpu(), kc[:, 0].float(), kc[:, 1].float(),
                                     bt.cpu().tolist(), lens.tolist(), [1] * B, list(range(B)),
                                     0.08)
        assert rel_err(out.cpu(), ref) < TOL, step

    _replay_steps(call, _capture(call), lens, lambda: _lens(B, ppr * ps, g), out, 3, check)
