"""fiattn.decode.xqa_batch_decode_with_lse on CPU tensors (fi_ref_run over a host plan):
out and lse against the torch fp64 reference, the context-parallel merge of two KV halves
against the whole-KV call, repeat calls (recorded fast path) and argument checks.  Fresh
random data; out and lse are poisoned with NaN first, so anything left unwritten fails."""
import inspect

import pytest

torch = pytest.importorskip("torch")

import fiattn  # noqa: E402
from fiattn import _engine as E  # noqa: E402
from reference import paged_attention_ref, rel_err, split_pages  # noqa: E402

TOL = 2e-5        # fp32 inputs, relative 2-norm error of out
LSE_TOL = 1e-4    # fp32, absolute (natural log)
lse_fn = fiattn.decode.xqa_batch_decode_with_lse


def _case(g, B=3, H=8, Hkv=2, D=64, ps=16, ppr=5, num_pages=20, layout="NHD", form="single",
          ql=1):
    """K / V [num_pages, ps, Hkv, D] (NHD, for the reference), the kv_cache argument in
    `layout` / `form`, q [B * ql, H, D], distinct random pages [B, ppr] and lengths
    (ql .. ppr * ps)."""
    K = torch.randn(num_pages, ps, Hkv, D, generator=g)
    V = torch.randn(num_pages, ps, Hkv, D, generator=g)
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    kv = torch.stack([perm(K), perm(V)], 1) if form == "single" else (perm(K), perm(V))
    q = torch.randn(B * ql, H, D, generator=g)
    bt = torch.randperm(num_pages, generator=g)[:B * ppr].to(torch.int32).reshape(B, ppr)
    lens = torch.randint(ql, ppr * ps + 1, (B,), generator=g, dtype=torch.int32)
    return K, V, kv, q, bt, lens


def _poisoned(*shape):
    return torch.full(shape, float("nan"))


def _check_lse(lse, ref_lse):
    """Equal within LSE_TOL where finite; -inf exactly where the reference has no key."""
    ref_lse = ref_lse.to(lse.dtype)
    fin = torch.isfinite(ref_lse)
    assert torch.equal(torch.isinf(lse) & (lse < 0), ~fin), "-inf rows differ"
    assert (lse[fin].double() - ref_lse[fin].double()).abs().max() < LSE_TOL


def test_signature_is_the_reference_one_plus_keyword_lse():
    ref = inspect.signature(fiattn.decode.xqa_batch_decode_with_kv_cache).parameters
    ours = inspect.signature(lse_fn).parameters
    assert list(ours)[:-1] == list(ref)
    for name, p in ref.items():
        assert ours[name].default == p.default and ours[name].kind == p.kind, name
    assert ours["lse"].kind is inspect.Parameter.KEYWORD_ONLY and ours["lse"].default is None


@pytest.mark.parametrize("layout,form,ql,window,sinks,group,dtype", [
    ("NHD", "single", 1, -1, False, 4, torch.float32),
    ("HND", "tuple", 1, 20, True, 1, torch.float32),
    ("NHD", "tuple", 3, -1, True, 8, torch.float32),
    ("HND", "single", 2, 7, False, 2, torch.float32),
    ("NHD", "single", 1, -1, True, 4, torch.bfloat16)])
def test_out_and_lse_match_fp64_reference(layout, form, ql, window, sinks, group, dtype):
    g = torch.Generator().manual_seed(ql * 100 + group * 10 + window)
    B, Hkv, D = 3, 2, 64
    H = Hkv * group
    K, V, kv, q, bt, lens = _case(g, B, H, Hkv, D, layout=layout, form=form, ql=ql)
    q = q.to(dtype)
    kv = tuple(x.to(dtype) for x in kv) if form == "tuple" else kv.to(dtype)
    sk = torch.randn(H, generator=g) if sinks else None
    mask = torch.ones(B, ql, ql, dtype=torch.bool).tril() if ql > 1 else None
    out, lse = _poisoned(B * ql, H, D).to(dtype), _poisoned(B * ql, H)
    r_out, r_lse = lse_fn(q, kv, torch.empty(1), bt, lens, 80, bmm1_scale=0.125,
                          bmm2_scale=0.5, window_left=window, out=out, sinks=sk,
                          kv_layout=layout, q_len_per_req=ql, mask=mask, lse=lse)
    assert r_out is out and r_lse is lse
    ref, ref_lse = paged_attention_ref(q.float(), K.to(dtype).float(), V.to(dtype).float(),
                                       bt.tolist(), lens.tolist(), [ql] * B,
                                       [b * ql for b in range(B)], 0.125, 0.5,
                                       window_left=window, sinks=sk)
    assert rel_err(out, ref) < (TOL if dtype == torch.float32 else 1e-2)
    _check_lse(lse, ref_lse)


def test_allocates_lse_and_out_and_agrees_with_the_reference_api():
    g = torch.Generator().manual_seed(11)
    K, V, kv, q, bt, lens = _case(g)
    out, lse = lse_fn(q, kv, torch.empty(1), bt, lens, 80, bmm1_scale=0.2)
    assert lse.dtype == torch.float32 and tuple(lse.shape) == (3, 8)
    ref_out = fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, torch.empty(1), bt, lens, 80,
                                                           bmm1_scale=0.2)
    assert torch.equal(out, ref_out)  # one implementation: the same bytes
    _, ref_lse = paged_attention_ref(q, K, V, bt.tolist(), lens.tolist(), [1] * 3, [0, 1, 2],
                                     0.2)
    _check_lse(lse, ref_lse)


@pytest.mark.parametrize("sinks", [False, True])
def test_merge_of_two_kv_halves_equals_whole_kv(sinks):
    """Context parallelism on the CPU: each request's pages cut in two (a request of one
    page gives the second part no key: lse -inf there), (out, lse) of each part merged by
    fiattn.merge_states equals the whole-KV call; the sinks go to one part only."""
    g = torch.Generator().manual_seed(21 + sinks)
    B, H, Hkv, D, ps = 5, 16, 4, 64, 16
    K, V, kv, q, bt, lens = _case(g, B, H, Hkv, D, ps, ppr=6, num_pages=32)
    lens[0] = 9  # one page: the second part is empty
    sk = torch.randn(H, generator=g) if sinks else None
    ws = torch.empty(1)
    whole_out, whole_lse = lse_fn(q, kv, ws, bt, lens, 96, bmm1_scale=0.15, bmm2_scale=0.7,
                                  sinks=sk, out=_poisoned(B, H, D), lse=_poisoned(B, H))
    parts = []
    for i, (pbt, plens) in enumerate(split_pages(bt, lens, ps)):
        parts.append(lse_fn(q, kv, ws, pbt, plens, 96, bmm1_scale=0.15, bmm2_scale=0.7,
                            sinks=sk if i == 0 else None, out=_poisoned(B, H, D),
                            lse=_poisoned(B, H)))
    assert torch.isinf(parts[1][1][0]).all()  # request 0's second part has no key
    V_m, S_m = fiattn.merge_states(torch.stack([p[0] for p in parts], 1),
                                   torch.stack([p[1] for p in parts], 1))
    assert rel_err(V_m, whole_out) < TOL
    assert (S_m - whole_lse).abs().max() < LSE_TOL
    ref, ref_lse = paged_attention_ref(q, K, V, bt.tolist(), lens.tolist(), [1] * B,
                                       list(range(B)), 0.15, 0.7, sinks=sk)
    assert rel_err(V_m, ref) < TOL
    _check_lse(S_m, ref_lse)


def test_repeat_calls_write_the_new_lse_and_keep_apart_from_the_reference_api():
    """The second call of one signature takes the recorded fast path: the new lse tensor is
    written (not the first one); a reference-API call of otherwise equal arguments on the
    same workspace is another record and writes no lse."""
    g = torch.Generator().manual_seed(31)
    K, V, kv, q, bt, lens = _case(g)
    ws = torch.empty(1)
    try:
        out, lse1 = _poisoned(3, 8, 64), _poisoned(3, 8)
        lse_fn(q, kv, ws, bt, lens, 80, bmm1_scale=0.125, out=out, lse=lse1)
        first = lse1.clone()
        lens2 = torch.randint(1, 81, (3,), generator=g, dtype=torch.int32)
        lse2 = _poisoned(3, 8)
        lse_fn(q, kv, ws, bt, lens2, 80, bmm1_scale=0.125, out=out, lse=lse2)
        e = E.cached_entry(ws)
        assert len(e.memo) == 1
        assert torch.equal(lse1, first)
        _, ref_lse = paged_attention_ref(q, K, V, bt.tolist(), lens2.tolist(), [1] * 3,
                                         [0, 1, 2], 0.125)
        _check_lse(lse2, ref_lse)
        kept = lse2.clone()
        for _ in range(2):  # checked, then fast
            fiattn.decode.xqa_batch_decode_with_kv_cache(q, kv, ws, bt, lens, 80,
                                                         bmm1_scale=0.125, out=out)
        assert len(e.memo) == 2 and torch.equal(lse2, kept)
        # allocated lse on the fast path: a fresh tensor each call
        a = lse_fn(q, kv, ws, bt, lens, 80, bmm1_scale=0.125)[1]
        b = lse_fn(q, kv, ws, bt, lens, 80, bmm1_scale=0.125)[1]
        assert a is not b and torch.equal(a, b) and torch.equal(a, first)
    finally:
        fiattn.release_workspace(ws)


@pytest.mark.parametrize("bad,exc,match", [
    (lambda: torch.zeros(3, 8, dtype=torch.float64), TypeError, "lse has dtype"),
    (lambda: [[0.0] * 8] * 3, TypeError, "lse must be a torch.Tensor"),
    (lambda: torch.zeros(3, 8, 1), ValueError, "lse must have 2 dims"),
    (lambda: torch.zeros(8, 3).t(), ValueError, "lse must be contiguous in its last"),
    (lambda: torch.zeros(3, 8, device="meta"), ValueError, "lse is on meta"),
    (lambda: torch.zeros(4, 8), fiattn.FiattnValueError, "FI_ERR_SHAPE_MISMATCH"),
    (lambda: torch.zeros(3, 2), fiattn.FiattnValueError, "FI_ERR_SHAPE_MISMATCH")])
def test_bad_lse_raises_before_any_write(bad, exc, match):
    g = torch.Generator().manual_seed(41)
    _, _, kv, q, bt, lens = _case(g)
    out = torch.full((3, 8, 64), 7.0)
    lse = bad()
    with pytest.raises(exc, match=match) as info:
        lse_fn(q, kv, torch.empty(1), bt, lens, 80, out=out, lse=lse)
    if exc is fiattn.FiattnValueError:
        assert info.value.status_name == "FI_ERR_SHAPE_MISMATCH"
        assert isinstance(info.value, ValueError)
        assert (lse == 0).all()
    assert (out == 7.0).all()


def test_bad_query_raises_with_lse_allocated_by_the_call():
    with pytest.raises(TypeError, match="query"):
        lse_fn([[1.0]], torch.zeros(2, 2, 16, 1, 64), torch.empty(1),
               torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 16)
    with pytest.raises(ValueError, match="query must have 3 dims"):
        lse_fn(torch.zeros(2, 64), torch.zeros(2, 2, 16, 1, 64), torch.empty(1),
               torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32), 16)
