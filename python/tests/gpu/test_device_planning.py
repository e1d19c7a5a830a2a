"""fiattn.device_planning(): the decode functional APIs planned on the GPU
(fi_plan_update_device) when block_tables and seq_lens are CUDA tensors.

Checked on fresh random data: results against the fp64 reference and bitwise against the
host-planned call with the same caps row; no host synchronisation; a torch.cuda.graph that
captured the call follows new lengths written into seq_lens with no fiattn.plan_only() step;
a bad length is reported by fiattn.device_plan_status and the step writes nothing."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
import fiattn  # noqa: E402
from reference import paged_attention_ref, rel_err  # noqa: E402

DEV = "cuda"
TOL = 1e-2


@pytest.fixture
def ws():
    w = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    yield w
    fiattn.release_workspace(w)


def _gqa_case(g, B=8, H=32, Hkv=8, D=128, ps=16, ppr=30):
    P = B * ppr
    kv = torch.randn(P, 2, ps, Hkv, D, generator=g).bfloat16().to(DEV)
    q = torch.randn(B, H, D, generator=g).bfloat16().to(DEV)
    bt = torch.randperm(P, generator=g).to(torch.int32).reshape(B, ppr).to(DEV)
    lens = torch.randint(1, ppr * ps + 1, (B,), generator=g, dtype=torch.int32).to(DEV)
    return q, kv, bt, lens


def _gqa_ref(q, kv, bt, lens, scale):
    kc = kv.cpu()
    B = q.shape[0]
    return paged_attention_ref(q.float().cpu(), kc[:, 0].float(), kc[:, 1].float(),
                               bt.cpu().tolist(), lens.cpu().tolist(), [1] * B, list(range(B)),
                               scale)[0]


def _mla_case(g, B=6, H=16, ps=64, ppr=20):
    P = B * ppr
    kv = torch.randn(P, ps, 576, generator=g).bfloat16().to(DEV)
    q = torch.randn(B, 1, H, 576, generator=g).bfloat16().to(DEV)
    bt = torch.randperm(P, generator=g).to(torch.int32).reshape(B, ppr).to(DEV)
    lens = torch.randint(1, ppr * ps + 1, (B,), generator=g, dtype=torch.int32).to(DEV)
    return q, kv, bt, lens


def _mla_ref(q, kv, bt, lens, scale):
    B, ql, H, _ = q.shape
    kp = kv.float().cpu()[:, :, None, :]
    return paged_attention_ref(q.float().cpu().reshape(B * ql, H, 576), kp, kp[..., :512],
                               bt.cpu().tolist(), lens.cpu().tolist(), [ql] * B,
                               [b * ql for b in range(B)], scale)[0]


def test_gqa_device_planned_matches_reference_without_sync(ws, monkeypatch):
    g = torch.Generator().manual_seed(101)
    q, kv, bt, lens = _gqa_case(g)
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
    torch.cuda.synchronize()
    with fiattn.device_planning():  # first call creates the plan (one sync at create)
        fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 0, bmm1_scale=0.08,
                                                     out=out)
    torch.cuda.synchronize()

    def refuse(*a, **k):
        raise AssertionError("fiattn synchronised")
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", refuse)
    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    out2 = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device=DEV)
    with fiattn.device_planning():
        fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 0, bmm1_scale=0.08,
                                                     out=out2)
    monkeypatch.undo()
    torch.cuda.synchronize()
    assert fiattn.device_plan_status(ws) is None
    ref = _gqa_ref(q, kv, bt, lens, 0.08)
    assert rel_err(out.cpu(), ref) < TOL and torch.equal(out, out2)


@pytest.mark.parametrize("H", [16, 64])
def test_mla_device_planned_matches_reference(ws, H):
    """Heads 16: the mma.sync body's parallel row (variant 2); 64: the wgmma body's (5)."""
    g = torch.Generator().manual_seed(102 + H)
    q, kv, bt, lens = _mla_case(g, H=H)
    out = torch.full((6, 1, H, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    with fiattn.device_planning():
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q, kv, ws, 128, 512, 64, bt, lens, 0,
                                                          out=out, bmm1_scale=0.05)
    torch.cuda.synchronize()
    assert fiattn.device_plan_status(ws) is None
    ref = _mla_ref(q, kv, bt, lens, 0.05)
    assert rel_err(out.cpu().reshape(6, H, 512), ref) < TOL


def test_graph_follows_lengths_without_plan_only(ws):
    """Captured once under device_planning: each replay plans on the GPU for the lengths
    then in `lens`; every step against the fp64 reference."""
    g = torch.Generator().manual_seed(103)
    q, kv, bt, lens = _gqa_case(g)
    out = torch.empty(q.shape, dtype=torch.bfloat16, device=DEV)

    def call():
        fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 0, bmm1_scale=0.08,
                                                     out=out)
    with fiattn.device_planning():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            call()
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            call()
    for step in range(5):
        lens.copy_(torch.randint(1, bt.shape[1] * 16 + 1, lens.shape, generator=g,
                                 dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out.cpu(), _gqa_ref(q, kv, bt, lens, 0.08)) < TOL, step


def test_bad_length_is_reported_and_writes_nothing(ws):
    g = torch.Generator().manual_seed(104)
    q, kv, bt, lens = _gqa_case(g)
    out = torch.full(q.shape, 7.0, dtype=torch.bfloat16, device=DEV)
    with fiattn.device_planning():
        fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 0, bmm1_scale=0.08,
                                                     out=out)
        torch.cuda.synchronize()
        bad = lens.clone()
        bad[3] = bt.shape[1] * 16 + 1  # one page more than its row holds
        out.fill_(7.0)
        fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, bad, 0, bmm1_scale=0.08,
                                                     out=out)
    with pytest.raises(fiattn.FiattnValueError) as e:
        fiattn.device_plan_status(ws)
    assert e.value.status_name == "FI_ERR_SEQ_LEN_EXCEEDS_PAGES" and "request 3" in str(e.value)
    assert (out == 7.0).all()


def test_mla_fp8_device_planned_matches_reference(ws):
    """q and cache fp8 e4m3 at heads 16: the transposed fp8 body's parallel row (variant 8),
    against the fp64 reference on the same e4m3 values; pages of 32 tokens."""
    g = torch.Generator().manual_seed(131)
    q, kv, bt, lens = _mla_case(g, H=16, ps=32, ppr=40)
    q8 = (q * 0.5).to(torch.float8_e4m3fn)
    kv8 = (kv * 0.5).to(torch.float8_e4m3fn)
    out = torch.full((6, 1, 16, 512), float("nan"), dtype=torch.bfloat16, device=DEV)
    with fiattn.device_planning():
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q8, kv8, ws, 128, 512, 64, bt, lens, 0,
                                                          out=out, bmm1_scale=0.05)
    torch.cuda.synchronize()
    assert fiattn.device_plan_status(ws) is None
    ref = _mla_ref(q8.float(), kv8.float(), bt, lens, 0.05)
    assert rel_err(out.cpu().reshape(6, 16, 512), ref) < 2e-2
