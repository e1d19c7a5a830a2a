"""Every API on CPU tensors (fi_ref_run over a host plan) against the torch fp64 reference,
on fresh random data.  Outputs are poisoned first, so rows left unwritten fail."""
import math

import pytest

torch = pytest.importorskip("torch")

import fiattn  # noqa: E402
from fiattn import _engine as E  # noqa: E402
from reference import paged_attention_ref, rel_err  # noqa: E402

TOL = 2e-5


def _tables(B, pages_per_req, num_pages, gen):
    perm = torch.randperm(num_pages, generator=gen)[:B * pages_per_req]
    return perm.to(torch.int32).reshape(B, pages_per_req)


@pytest.mark.parametrize("H,ql,ps,sinks,tensor_scale", [
    (16, 1, 16, False, False), (32, 2, 32, True, False), (16, 3, 1, False, True),
    (64, 1, 64, True, True)])
def test_trtllm_mla(H, ql, ps, sinks, tensor_scale):
    g = torch.Generator().manual_seed(H * 10 + ql)
    B = 4
    ppr = max(1, 90 // ps + 1)
    num_pages = B * ppr + 3
    kv = torch.randn(num_pages, ps, 576, generator=g)
    q = torch.randn(B, ql, H, 576, generator=g)
    lens = torch.randint(ql, ppr * ps + 1, (B,), generator=g, dtype=torch.int32)
    lens[0] = ppr * ps
    bt = _tables(B, ppr, num_pages, g)
    sk = torch.randn(H, generator=g) if sinks else None
    s1, s2 = 0.04, 1.5
    out = torch.full((B, ql, H, 512), float("nan"))
    ws = torch.empty(1, dtype=torch.uint8)
    r = fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
        q, kv, ws, 128, 512, 64, bt, lens.to(torch.uint32) if hasattr(torch, "uint32") else lens,
        int(lens.max()), out=out,
        bmm1_scale=torch.tensor([s1]) if tensor_scale else s1,
        bmm2_scale=torch.tensor([s2]) if tensor_scale else s2, sinks=sk)
    assert r is out
    kp = kv[:, :, None, :]
    ref, _ = paged_attention_ref(q.reshape(B * ql, H, 576), kp, kp[..., :512], bt.tolist(),
                                 lens.tolist(), [ql] * B, [b * ql for b in range(B)], s1, s2,
                                 sinks=sk)
    assert not torch.isnan(out).any()
    assert rel_err(out.reshape(B * ql, H, 512), ref) < TOL


@pytest.mark.parametrize("H,ql,ps,K", [(16, 1, 16, 20), (32, 2, 1, 7), (16, 3, 64, 50)])
def test_trtllm_mla_sparse(H, ql, ps, K):
    """sparse_mla_top_k on CPU tensors (fi_ref_run) against a gather reference: query token
    (b, i) attends to exactly the valid slots of block_tables[b, i] (flat page * page_size +
    offset; -1 padding; a row of only -1 gets zeros)."""
    g = torch.Generator().manual_seed(H + ql * 7 + K)
    B, num_pages = 3, 6
    kv = torch.randn(num_pages, ps, 576, generator=g)
    q = torch.randn(B, ql, H, 576, generator=g)
    slots = num_pages * ps
    idx = torch.randint(0, slots, (B, ql, K), generator=g, dtype=torch.int32)
    idx[torch.rand(B, ql, K, generator=g) < 0.2] = -1
    idx[1, 0, :] = -1
    lens = torch.full((B,), slots, dtype=torch.int32)
    s1, s2 = 0.05, 1.25
    out = torch.full((B, ql, H, 512), float("nan"))
    fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
        q, kv, torch.empty(1, dtype=torch.uint8), 128, 512, 64, idx, lens, slots,
        sparse_mla_top_k=K, out=out, bmm1_scale=s1, bmm2_scale=s2)
    flat = kv.reshape(slots, 576).double()
    ref = torch.zeros(B, ql, H, 512, dtype=torch.float64)
    for b in range(B):
        for i in range(ql):
            keys = flat[[int(e) for e in idx[b, i] if e >= 0]]
            if keys.shape[0] == 0:
                continue
            p = torch.softmax(s1 * q[b, i].double() @ keys.T, dim=-1)
            ref[b, i] = s2 * p @ keys[:, :512]
    assert not torch.isnan(out).any()
    assert torch.equal(out[1, 0], torch.zeros(H, 512))
    assert rel_err(out.reshape(B * ql, H, 512), ref.reshape(B * ql, H, 512).float()) < TOL


def test_trtllm_mla_bf16_cpu():
    g = torch.Generator().manual_seed(7)
    B, H, ps = 3, 16, 32
    kv = torch.randn(8, ps, 576, generator=g).bfloat16()
    q = torch.randn(B, 1, H, 576, generator=g).bfloat16()
    lens = torch.tensor([64, 5, 40], dtype=torch.int32)
    bt = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    out = fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
        q, kv, torch.empty(1), 128, 512, 64, bt, lens, 64, bmm1_scale=0.05)
    assert out.dtype == torch.bfloat16
    kp = kv.float()[:, :, None, :]
    ref, _ = paged_attention_ref(q.float().reshape(B, H, 576), kp, kp[..., :512], bt.tolist(),
                                 lens.tolist(), [1] * B, list(range(B)), 0.05)
    assert rel_err(out.reshape(B, H, 512), ref) < 1e-2


def test_xqa_mla():
    g = torch.Generator().manual_seed(3)
    B, H, ps, ppr = 3, 128, 16, 5
    num_pages = 20
    cache = torch.randn(num_pages * ps, 576, generator=g)
    q = torch.randn(B, 1, H, 576, generator=g)
    bt = _tables(B, ppr, num_pages, g)
    lens = torch.tensor([[80], [1], [33]], dtype=torch.int32)
    out = torch.full((B, 1, H, 512), float("nan"))
    r = fiattn.xqa.xqa_mla(q, cache, cache[:, :512], bt, lens, out, torch.empty(1),
                           torch.empty(1, dtype=torch.int32), ps, q_scale=0.02, kv_scale=2.0)
    assert r is None
    kp = cache.reshape(num_pages, ps, 1, 576)
    # XQA MLA: logit scale q_scale * kv_scale (no 1 / sqrt(576)), output scale kv_scale
    ref, _ = paged_attention_ref(q.reshape(B, H, 576), kp, kp[..., :512], bt.tolist(),
                                 lens.flatten().tolist(), [1] * B, list(range(B)),
                                 0.02 * 2.0, 2.0)
    assert rel_err(out.reshape(B, H, 512), ref) < TOL


def test_xqa_mla_beam_width_above_one_not_implemented():
    """beam_width > 1 (the reference supports 1 only): FiattnNotImplementedError, the
    output untouched."""
    cache = torch.randn(2 * 16, 576)
    out = torch.full((1, 2, 128, 512), 7.0)
    with pytest.raises(fiattn.FiattnNotImplementedError, match="beam_width"):
        fiattn.xqa.xqa_mla(torch.randn(1, 2, 128, 576), cache, cache[:, :512],
                           torch.zeros(1, 2, dtype=torch.int32),
                           torch.tensor([[5]], dtype=torch.int32), out, torch.empty(1),
                           torch.empty(1, dtype=torch.int32), 16)
    assert (out == 7.0).all()


def _xqa_mla_case(g, dtype=torch.float32, B=3, H=16, ps=16, num_pages=12):
    cache = torch.randn(num_pages * ps, 576, generator=g).to(dtype)
    q = torch.randn(B, 1, H, 576, generator=g).to(dtype)
    bt = _tables(B, 3, num_pages, g)
    lens = torch.tensor([[48], [1], [20]], dtype=torch.int32)
    return q, cache, bt, lens


def _xqa_mla_ref(q, cache, bt, lens, ps, bmm1, bmm2):
    B, _, H, _ = q.shape
    kp = cache.double().reshape(-1, ps, 1, 576)
    return paged_attention_ref(q.double().reshape(B, H, 576), kp, kp[..., :512], bt.tolist(),
                               lens.flatten().tolist(), [1] * B, list(range(B)), bmm1,
                               bmm2)[0]


@pytest.mark.parametrize("qs,ks", [("tensor", "float"), ("float", "tensor"),
                                   ("tensor", "tensor")])
def test_xqa_mla_tensor_scales_fold_like_floats(qs, ks):
    g = torch.Generator().manual_seed(12)
    q, cache, bt, lens = _xqa_mla_case(g)
    out = torch.full((3, 1, 16, 512), float("nan"))
    q_scale = torch.tensor([0.03]) if qs == "tensor" else 0.03
    kv_scale = torch.tensor(0.8, dtype=torch.float64) if ks == "tensor" else 0.8
    fiattn.xqa.xqa_mla(q, cache, cache, bt, lens, out, torch.empty(1), torch.empty(1), 16,
                       q_scale=q_scale, kv_scale=kv_scale)
    ref = _xqa_mla_ref(q, cache, bt, lens, 16, 0.03 * 0.8, 0.8)
    assert rel_err(out.reshape(3, 16, 512), ref) < TOL
    with pytest.raises(ValueError, match="one element"):
        fiattn.xqa.xqa_mla(q, cache, cache, bt, lens, out, torch.empty(1), torch.empty(1), 16,
                           q_scale=torch.tensor([0.1, 0.2]))


def test_xqa_mla_fp8_on_the_cpu_reference_dequantises_with_the_scales():
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8_e4m3fn")
    g = torch.Generator().manual_seed(13)
    q, cache, bt, lens = _xqa_mla_case(g, torch.float8_e4m3fn)
    out = torch.full((3, 1, 16, 512), float("nan"), dtype=torch.bfloat16)
    fiattn.xqa.xqa_mla(q, cache, cache, bt, lens, out, torch.empty(1), torch.empty(1), 16,
                       q_scale=0.01, kv_scale=1.7)
    ref = _xqa_mla_ref(q.float(), cache.float(), bt, lens, 16, 0.01 * 1.7, 1.7)
    assert rel_err(out.float().reshape(3, 16, 512), ref) < 1e-2  # bf16 output rounding


def test_xqa_mla_rejects_separate_v():
    q = torch.randn(1, 1, 128, 576)
    k = torch.randn(16, 576)
    out = torch.zeros(1, 1, 128, 512)
    with pytest.raises(ValueError, match="v_cache"):
        fiattn.xqa.xqa_mla(q, k, torch.randn(16, 512), torch.zeros(1, 1, dtype=torch.int32),
                           torch.ones(1, 1, dtype=torch.int32), out, torch.empty(1),
                           torch.empty(1), 16)
    assert (out == 0).all()


@pytest.mark.parametrize("layout,form,ql,window,sinks,group", [
    ("NHD", "single2", 1, -1, False, 4), ("HND", "tuple", 1, 20, True, 1),
    ("NHD", "tuple", 3, -1, True, 8), ("HND", "single1", 2, 7, False, 2)])
def test_xqa_batch_decode(layout, form, ql, window, sinks, group):
    g = torch.Generator().manual_seed(ql * 100 + group)
    B, Hkv, D, ps, ppr = 3, 2, 64, 16, 4
    H = Hkv * group
    num_pages = 14
    K = torch.randn(num_pages, ps, Hkv, D, generator=g)
    V = K.clone() if form == "single1" else torch.randn(num_pages, ps, Hkv, D, generator=g)
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    if form == "tuple":
        kv = (perm(K), perm(V))
    elif form == "single2":
        kv = torch.stack([perm(K), perm(V)], dim=1)
    else:
        kv = perm(K)[:, None]
    q = torch.randn(B * ql, H, D, generator=g)
    bt = _tables(B, ppr, num_pages, g)
    lens = torch.tensor([64, ql, 29], dtype=torch.int32)
    sk = torch.randn(H, generator=g) if sinks else None
    mask = torch.ones(B, ql, ql, dtype=torch.bool).tril() if ql > 1 else None
    out = torch.full((B * ql, H, D), float("nan"))
    ws = torch.empty(1)
    r = fiattn.decode.xqa_batch_decode_with_kv_cache(
        q, kv, ws, bt, lens, 64, bmm1_scale=0.125, bmm2_scale=0.5,
        window_left=window, out=out, sinks=sk, kv_layout=layout, q_len_per_req=ql, mask=mask)
    assert r is out
    # the tile table row: rows-8 (2) while group x q_len_per_req <= 8, else 64-row tiles (3)
    assert E.cached_entry(ws).caps.variant == (2 if group * ql <= 8 else 3)
    ref, _ = paged_attention_ref(q, K, V, bt.tolist(), lens.tolist(), [ql] * B,
                                 [b * ql for b in range(B)], 0.125, 0.5, window_left=window,
                                 sinks=sk)
    assert rel_err(out, ref) < TOL


def test_xqa_batch_decode_row_follows_q_len_per_req():
    """One workspace, group 4: q_len_per_req 1 and 2 (4 and 8 rows a request) plan on the
    rows-8 row, 3 (12 rows) replaces the plan with one on the 64-row tiles; every call
    against the reference."""
    g = torch.Generator().manual_seed(7)
    B, Hkv, group, D, ps, num_pages = 3, 2, 4, 64, 16, 14
    H = Hkv * group
    K = torch.randn(num_pages, ps, Hkv, D, generator=g)
    V = torch.randn(num_pages, ps, Hkv, D, generator=g)
    bt = _tables(B, 4, num_pages, g)
    ws = torch.empty(1)
    for ql, row in ((1, 2), (2, 2), (3, 3), (1, 2)):
        lens = torch.randint(ql, 64, (B,), generator=g, dtype=torch.int32)
        q = torch.randn(B * ql, H, D, generator=g)
        mask = torch.ones(B, ql, ql, dtype=torch.bool).tril() if ql > 1 else None
        out = fiattn.decode.xqa_batch_decode_with_kv_cache(
            q, (K, V), ws, bt, lens, 64, bmm1_scale=0.2, q_len_per_req=ql, mask=mask)
        assert E.cached_entry(ws).caps.variant == row
        ref, _ = paged_attention_ref(q, K, V, bt.tolist(), lens.tolist(), [ql] * B,
                                     [b * ql for b in range(B)], 0.2, 1.0)
        assert rel_err(out, ref) < TOL
    fiattn.release_workspace(ws)


def test_xqa_batch_decode_non_causal_mask_not_implemented():
    q = torch.randn(4, 2, 64)
    kv = torch.randn(4, 2, 16, 2, 64)
    out = torch.zeros(4, 2, 64)
    with pytest.raises(fiattn.FiattnNotImplementedError, match="causal"):
        fiattn.decode.xqa_batch_decode_with_kv_cache(
            q, kv, torch.empty(1), torch.zeros(2, 1, dtype=torch.int32),
            torch.tensor([4, 4], dtype=torch.int32), 16, out=out, q_len_per_req=2,
            mask=torch.ones(2, 2, 2, dtype=torch.bool))
    assert (out == 0).all()


def test_packed_causal_mask_accepted():
    from fiattn.decode import check_causal_mask
    rows = torch.tensor([[1], [3], [7]], dtype=torch.int32)  # bits 0..r
    check_causal_mask(rows, 3)
    with pytest.raises(fiattn.FiattnNotImplementedError):
        check_causal_mask(torch.tensor([[1], [1], [7]], dtype=torch.int32), 3)


@pytest.mark.parametrize("layout,shared,window", [("HND", True, -1), ("NHD", False, 9)])
def test_trtllm_context(layout, shared, window):
    g = torch.Generator().manual_seed(11)
    B, H, Hkv, D, ps = 3, 8, 4, 64, 16
    num_pages = 24
    q_lens = [5, 1, 17]
    kv_lens = [20, 1, 40]
    K = torch.randn(num_pages, ps, Hkv, D, generator=g)
    V = torch.randn(num_pages, ps, Hkv, D, generator=g)
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    kv = (perm(K), perm(V))
    ppr = 3
    kt = _tables(B, ppr, num_pages, g)
    if shared:
        bt, vrows = kt, kt
    else:
        vt = _tables(B, ppr, num_pages, g)
        bt = torch.stack([kt, vt], dim=1).contiguous()
        vrows = vt
    T = sum(q_lens)
    q = torch.randn(T + 2, H, D, generator=g)  # two spare rows stay untouched
    cq = torch.tensor([0, 5, 6, 23], dtype=torch.int32)
    ck = torch.tensor([0, 20, 21, 61], dtype=torch.int32)
    out = torch.full((T + 2, H, D), float("nan"))
    r = fiattn.prefill.trtllm_batch_context_with_kv_cache(
        q, kv, torch.empty(1), bt, torch.tensor(kv_lens, dtype=torch.int32), 17, 40, 0.1, 1.0,
        B, cq, ck, window_left=window, out=out, kv_layout=layout,
        uses_shared_paged_kv_idx=shared)
    assert r is out
    # K pages from kt, V pages from vrows: build the reference with a V table remap
    Vr = torch.empty_like(V)
    for b in range(B):
        for i in range(ppr):
            Vr[kt[b, i]] = V[vrows[b, i]]
    ref, _ = paged_attention_ref(q[:T], K, Vr, kt.tolist(), kv_lens, q_lens, [0, 5, 6], 0.1,
                                 window_left=window)
    assert rel_err(out[:T], ref) < TOL
    assert torch.isnan(out[T:]).all()


@pytest.mark.parametrize("causal,ql,base_e", [(False, 1, False), (True, 2, True)])
def test_mla_wrapper(causal, ql, base_e):
    g = torch.Generator().manual_seed(5 + ql)
    B, H, ps = 4, 16, 1
    lens = [30, ql, 7, 64]
    num_pages = sum(lens) + 5
    perm = torch.randperm(num_pages, generator=g).to(torch.int32)
    kv_indptr = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32)
    kv_indices = perm[:int(kv_indptr[-1])]
    qo_indptr = torch.arange(B + 1, dtype=torch.int32) * ql
    ckv = torch.randn(num_pages, ps, 512, generator=g)
    kpe = torch.randn(num_pages, ps, 64, generator=g)
    q_nope = torch.randn(B * ql, H, 512, generator=g)
    q_pe = torch.randn(B * ql, H, 64, generator=g)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(torch.empty(8, dtype=torch.uint8))
    w.plan(qo_indptr, kv_indptr, kv_indices, torch.tensor(lens, dtype=torch.int32), H, 512,
           64, ps, causal, 0.07, torch.float32, torch.float32)
    out, lse = w.run(q_nope, q_pe, ckv, kpe, return_lse=True, return_lse_base_on_e=base_e)
    kp = torch.cat([ckv, kpe], -1)[:, :, None, :]
    rows = [kv_indices[kv_indptr[b]:kv_indptr[b + 1]].tolist() for b in range(B)]
    ref, ref_lse = paged_attention_ref(torch.cat([q_nope, q_pe], -1), kp, kp[..., :512], rows,
                                       lens, [ql] * B, [b * ql for b in range(B)], 0.07,
                                       causal=causal)
    assert rel_err(out, ref) < TOL
    if not base_e:
        ref_lse = ref_lse / math.log(2)
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4)
    out2 = w.run(q_nope, q_pe, ckv, kpe)
    assert torch.equal(out, out2)  # deterministic


def test_merge_state_matches_full_attention():
    g = torch.Generator().manual_seed(1)
    n, H, D, L = 5, 3, 16, 40
    q = torch.randn(n, H, D, generator=g, dtype=torch.float64)
    k = torch.randn(L, H, D, generator=g, dtype=torch.float64)
    v = torch.randn(L, H, D, generator=g, dtype=torch.float64)

    def attn(ks, vs):
        s = torch.einsum("nhd,lhd->nhl", q, ks)
        lse = torch.logsumexp(s, -1)
        return torch.einsum("nhl,lhd->nhd", torch.softmax(s, -1), vs), lse

    full, full_lse = attn(k, v)
    cuts = [0, 7, 8, 25, 40]
    parts = [attn(k[a:b], v[a:b]) for a, b in zip(cuts, cuts[1:])]
    V, S = fiattn.merge_state(parts[0][0], parts[0][1], parts[1][0], parts[1][1])
    ref01, lse01 = attn(k[:8], v[:8])
    assert torch.allclose(V, ref01, atol=1e-6) and torch.allclose(S.double(), lse01, atol=1e-5)
    Vs, Ss = fiattn.merge_states(torch.stack([p[0] for p in parts], 1),
                                 torch.stack([p[1] for p in parts], 1))
    assert torch.allclose(Vs, full, atol=1e-6) and torch.allclose(Ss.double(), full_lse, atol=1e-5)
    # base 2 in, base 2 out
    V2, S2 = fiattn.merge_states(torch.stack([p[0] for p in parts], 1),
                                 torch.stack([p[1] / math.log(2) for p in parts], 1), base=2)
    assert torch.allclose(V2, full, atol=1e-6)
    assert torch.allclose(S2.double(), full_lse / math.log(2), atol=1e-5)


def test_merge_state_empty_states():
    v = torch.randn(2, 1, 4)
    s = torch.full((2, 1), -math.inf)
    V, S = fiattn.merge_state(v, s, v, s)
    assert (V == 0).all() and torch.isinf(S).all() and not torch.isnan(V).any()
    s_b = torch.zeros(2, 1)
    V, S = fiattn.merge_state(v, s, v * 2, s_b)
    assert torch.allclose(V, v * 2) and (S == 0).all()
