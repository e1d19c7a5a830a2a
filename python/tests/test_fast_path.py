"""Repeat calls reuse their recorded ctypes structures (no timing assertions)."""
import tracemalloc

import pytest

import fiattn
from fiattn import _engine as E

torch = pytest.importorskip("torch")


@pytest.fixture
def ws():
    """A CPU workspace (host plans) whose cached plan is released after the test."""
    w = torch.empty(16, dtype=torch.uint8)
    yield w
    fiattn.release_workspace(w)


def _fiattn_bytes_grown(fn, calls=50):
    """Bytes of Python memory that `calls` calls of fn left allocated in fiattn's files."""
    tracemalloc.start()
    try:
        before = tracemalloc.take_snapshot()
        for _ in range(calls):
            fn()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
    return sum(s.size_diff for s in after.compare_to(before, "filename")
               if "fiattn" in s.traceback[0].filename and s.size_diff > 0)


def _mla_inputs(g, B=4, H=16, pages=24, ps=16):
    q = torch.randn(B, 1, H, 576, generator=g)
    kv = torch.randn(pages, ps, 576, generator=g)
    bt = torch.randperm(pages, generator=g)[:4 * B].to(torch.int32).reshape(B, 4)
    lens = torch.randint(1, 4 * ps, (B,), generator=g, dtype=torch.int32)
    return q, kv, bt, lens


def _call(q, kv, ws, bt, lens, out=None):
    return fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q, kv, ws, 128, 512, 64, bt, lens,
                                                            64, out=out, bmm1_scale=0.05)


def test_functional_repeat_reuses_structs_and_matches():
    g = torch.Generator().manual_seed(3)
    q, kv, bt, lens = _mla_inputs(g)
    ws, ws2 = torch.empty(16, dtype=torch.uint8), torch.empty(16, dtype=torch.uint8)
    out = torch.empty(4, 1, 16, 512)
    _call(q, kv, ws, bt, lens, out)
    e = E.cached_entry(ws)
    assert len(e.memo) == 1
    fast = next(iter(e.memo.values()))
    args, batch = fast.args, fast.batch
    created = E.stats["plans_created"]
    # new data in the same tensors, new lengths: the recorded call is repeated
    q.copy_(torch.randn(q.shape, generator=g))
    lens.copy_(torch.randint(1, 64, (4,), generator=g, dtype=torch.int32))
    _call(q, kv, ws, bt, lens, out)
    assert E.cached_entry(ws) is e and len(e.memo) == 1
    assert next(iter(e.memo.values())) is fast and fast.args is args and fast.batch is batch
    assert E.stats["plans_created"] == created
    ref = _call(q, kv, ws2, bt, lens)  # checked path on a fresh workspace
    assert torch.equal(out, ref)
    # another out tensor of the same layout: same record, new address, same result
    out2 = _call(q, kv, ws, bt, lens, torch.zeros_like(out))
    assert len(e.memo) == 1 and torch.equal(out2, ref)
    fiattn.release_workspace(ws)
    fiattn.release_workspace(ws2)


def test_functional_repeat_still_checks():
    g = torch.Generator().manual_seed(4)
    q, kv, bt, lens = _mla_inputs(g)
    ws = torch.empty(16, dtype=torch.uint8)
    _call(q, kv, ws, bt, lens)
    with pytest.raises(TypeError):
        _call(q.to(torch.int32), kv, ws, bt, lens)
    with pytest.raises(ValueError):
        _call(q, kv, ws, bt, lens, torch.empty(4, 1, 16, 1024)[..., ::2])
    bad = lens.clone()
    bad[0] = 10 ** 6  # more tokens than the request's pages: the planner still sees it
    with pytest.raises(fiattn.FiattnError):
        _call(q, kv, ws, bt, bad)
    fiattn.release_workspace(ws)


def test_wrapper_repeat_run_allocates_nothing():
    g = torch.Generator().manual_seed(5)
    B, H, ps, pages = 4, 16, 16, 16
    ws = torch.empty(16, dtype=torch.uint8)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    ckv = torch.randn(pages, ps, 512, generator=g)
    kpe = torch.randn(pages, ps, 64, generator=g)
    qn = torch.randn(B, H, 512, generator=g)
    qp = torch.randn(B, H, 64, generator=g)
    indptr = torch.arange(B + 1, dtype=torch.int32) * 4
    idx = torch.randperm(pages, generator=g).to(torch.int32)
    lens = torch.full((B,), 50, dtype=torch.int32)
    w.plan(torch.arange(B + 1, dtype=torch.int32), indptr, idx, lens, H, 512, 64, ps, True,
           0.06, torch.float32, torch.float32)
    out = torch.empty(B, H, 512)
    lse = torch.empty(B, H)
    w.run(qn, qp, ckv, kpe, out=out, lse=lse)
    ref = out.clone()
    assert len(w._run_memo) == 1
    args = next(iter(w._run_memo.values()))[0]
    for _ in range(3):
        w.run(qn, qp, ckv, kpe, out=out, lse=lse)
    assert _fiattn_bytes_grown(lambda: w.run(qn, qp, ckv, kpe, out=out, lse=lse)) == 0
    assert len(w._run_memo) == 1 and next(iter(w._run_memo.values()))[0] is args
    assert torch.equal(out, ref)
    # a new plan of the same shape keeps the record; the table and scale are refreshed
    w.plan(torch.arange(B + 1, dtype=torch.int32), indptr, idx.flip(0).contiguous(), lens, H,
           512, 64, ps, True, 0.06, torch.float32, torch.float32)
    w.run(qn, qp, ckv, kpe, out=out, lse=lse)
    assert len(w._run_memo) == 1 and next(iter(w._run_memo.values()))[0] is args
    w2 = fiattn.mla.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8))
    w2.plan(torch.arange(B + 1, dtype=torch.int32), indptr, idx.flip(0).contiguous(), lens, H,
            512, 64, ps, True, 0.06, torch.float32, torch.float32)
    assert torch.equal(w2.run(qn, qp, ckv, kpe), out)
    with pytest.raises(TypeError):
        w.run(qn.double(), qp, ckv, kpe, out=out)


def _gqa_inputs(g, form="single", layout="NHD", B=3, H=8, Hkv=2, D=64, ps=16, pages=14):
    K = torch.randn(pages, ps, Hkv, D, generator=g)
    V = torch.randn(pages, ps, Hkv, D, generator=g)
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    kv = torch.stack([perm(K), perm(V)], 1) if form == "single" else (perm(K), perm(V))
    q = torch.randn(B, H, D, generator=g)
    bt = torch.randperm(pages, generator=g)[:4 * B].to(torch.int32).reshape(B, 4)
    lens = torch.randint(1, 4 * ps, (B,), generator=g, dtype=torch.int32)
    return q, kv, bt, lens


def _gqa(q, kv, ws, bt, lens, out=None, layout="NHD", sinks=None, s1=0.125):
    return fiattn.decode.xqa_batch_decode_with_kv_cache(
        q, kv, ws, bt, lens, 64, bmm1_scale=s1, bmm2_scale=0.5, out=out, sinks=sinks,
        kv_layout=layout, window_left=30)


@pytest.mark.parametrize("form,layout,sinks", [("single", "NHD", False),
                                               ("tuple", "HND", True)])
def test_gqa_repeat_reuses_structs_and_matches(ws, form, layout, sinks):
    g = torch.Generator().manual_seed(6)
    q, kv, bt, lens = _gqa_inputs(g, form, layout)
    sk = torch.randn(8, generator=g) if sinks else None
    ws2 = torch.empty(16, dtype=torch.uint8)
    out = torch.empty(3, 8, 64)
    _gqa(q, kv, ws, bt, lens, out, layout, sk)
    e = E.cached_entry(ws)
    fast = next(iter(e.memo.values()))
    args = fast.args
    created = E.stats["plans_created"]
    # new data, lengths, scale and a new sinks tensor: the record is reused
    q.copy_(torch.randn(q.shape, generator=g))
    lens.copy_(torch.randint(1, 64, (3,), generator=g, dtype=torch.int32))
    sk2 = None if sk is None else torch.randn(8, generator=g)
    _gqa(q, kv, ws, bt, lens, out, layout, sk2, s1=0.2)
    assert len(e.memo) == 1 and next(iter(e.memo.values())) is fast and fast.args is args
    assert E.stats["plans_created"] == created
    ref = _gqa(q, kv, ws2, bt, lens, None, layout, sk2, s1=0.2)  # checked path
    assert torch.equal(out, ref)
    # out allocated by the call: a fresh tensor each time, same values
    r1 = _gqa(q, kv, ws, bt, lens, None, layout, sk2, s1=0.2)
    r2 = _gqa(q, kv, ws, bt, lens, None, layout, sk2, s1=0.2)
    assert r1 is not r2 and torch.equal(r1, ref) and torch.equal(r2, ref)
    fiattn.release_workspace(ws2)


def test_gqa_repeat_still_checks(ws):
    g = torch.Generator().manual_seed(7)
    q, kv, bt, lens = _gqa_inputs(g)
    out = torch.zeros(3, 8, 64)
    _gqa(q, kv, ws, bt, lens, out)
    before = out.clone()
    bad = lens.clone()
    bad[1] = 10 ** 5
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_SEQ_LEN_EXCEEDS_PAGES"):
        _gqa(q, kv, ws, bt, bad, out)
    with pytest.raises(ValueError, match="finite"):
        _gqa(q, kv, ws, bt, lens, out, s1=float("inf"))
    with pytest.raises(TypeError):
        _gqa(q.double(), kv, ws, bt, lens, out)
    assert torch.equal(out, before)


def test_gqa_repeat_allocates_nothing(ws):
    g = torch.Generator().manual_seed(8)
    q, kv, bt, lens = _gqa_inputs(g)
    out = torch.empty(3, 8, 64)
    for _ in range(3):
        _gqa(q, kv, ws, bt, lens, out)
    assert _fiattn_bytes_grown(lambda: _gqa(q, kv, ws, bt, lens, out)) == 0


def test_xqa_mla_repeat_reuses_structs_refreshes_scales_and_checks_v(ws):
    g = torch.Generator().manual_seed(9)
    q, kv, bt, lens = _mla_inputs(g)
    cache = kv.reshape(-1, 576)
    lens2 = lens.reshape(4, 1)
    out = torch.empty(4, 1, 16, 512)

    def call(o, q_scale, v=None, w=ws):
        fiattn.xqa.xqa_mla(q, cache, cache[:, :512] if v is None else v, bt, lens2, o, w,
                           torch.empty(1), 16, q_scale=q_scale, kv_scale=1.5)
    call(out, 0.02)
    e = E.cached_entry(ws)
    fast = next(iter(e.memo.values()))
    call(out, 0.04)  # new scale value: same record, the scale refreshed
    assert len(e.memo) == 1 and next(iter(e.memo.values())) is fast
    assert fast.args.bmm1_scale == pytest.approx(0.04 * 1.5)
    ws2 = torch.empty(16, dtype=torch.uint8)
    ref = torch.empty_like(out)
    call(ref, 0.04, w=ws2)
    assert torch.equal(out, ref)
    fiattn.release_workspace(ws2)
    # a V cache elsewhere with the recorded layout is still refused
    with pytest.raises(ValueError, match="v_cache"):
        call(out, 0.04, v=cache.clone()[:, :512])


# ---- BatchMLAPagedAttentionWrapper.plan repeats ------------------------------------------
def _wrapper_problem(g, B=4, H=16, ps=16, pages=24, per=4):
    ckv = torch.randn(pages, ps, 512, generator=g)
    kpe = torch.randn(pages, ps, 64, generator=g)
    qn = torch.randn(B, H, 512, generator=g)
    qp = torch.randn(B, H, 64, generator=g)
    return ckv, kpe, qn, qp


def _plan_arrays(g, B, pages, per=4, ps=16, q_len=1):
    qo = torch.arange(B + 1, dtype=torch.int32) * q_len
    indptr = torch.arange(B + 1, dtype=torch.int32) * per
    idx = torch.randperm(pages, generator=g)[:B * per].to(torch.int32)
    lens = torch.randint(q_len, per * ps + 1, (B,), generator=g, dtype=torch.int32)
    return qo, indptr, idx, lens


def _plan(w, arrays, H=16, ps=16, causal=True, scale=0.06):
    w.plan(*arrays, H, 512, 64, ps, causal, scale, torch.float32, torch.float32)


def _checked_run(arrays, ckv, kpe, qn, qp, causal=True, scale=0.06):
    """The same plan + run on a fresh wrapper (every argument checked)."""
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8))
    _plan(w, arrays, causal=causal, scale=scale)
    w._known_pages = ckv.shape[0]
    return w.run(qn, qp, ckv, kpe)


def _steady_wrapper(g, ckv, kpe, qn, qp):
    """A wrapper past its first plan + run (the plan entry sized for the caches)."""
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(torch.empty(16, dtype=torch.uint8))
    arrays = _plan_arrays(g, qn.shape[0], ckv.shape[0])
    _plan(w, arrays)
    w.run(qn, qp, ckv, kpe)
    _plan(w, arrays)  # re-planned for the caches' page count, recorded
    return w, arrays


def test_wrapper_repeat_plan_reuses_record_and_matches():
    g = torch.Generator().manual_seed(11)
    ckv, kpe, qn, qp = _wrapper_problem(g)
    w, arrays = _steady_wrapper(g, ckv, kpe, qn, qp)
    rec = next(iter(w._plan_memo.values()))
    entry = w._entry
    for scale in (0.06, 0.03):
        # new lengths and page indices in the same tensors: the record is reused
        fresh = _plan_arrays(g, 4, ckv.shape[0])
        for dst, src in zip(arrays, fresh):
            dst.copy_(src)
        created = E.stats["plans_created"]
        checked = w._plan_checked
        w._plan_checked = None  # the repeat must not take the checked path
        _plan(w, arrays, scale=scale)
        w._plan_checked = checked
        assert len(w._plan_memo) == 1 and next(iter(w._plan_memo.values())) is rec
        assert w._entry is entry and E.stats["plans_created"] == created
        assert torch.equal(w.run(qn, qp, ckv, kpe), _checked_run(arrays, ckv, kpe, qn, qp,
                                                                 scale=scale))


def test_wrapper_repeat_plan_after_another_signature():
    # the wrapper's fi_batch is shared by its plans: a repeat restores its batch size and
    # causal flag after a plan of another signature on the same plan entry
    g = torch.Generator().manual_seed(12)
    ckv, kpe, qn, qp = _wrapper_problem(g)
    w, arrays = _steady_wrapper(g, ckv, kpe, qn, qp)
    small = _plan_arrays(g, 2, ckv.shape[0])
    _plan(w, small, causal=False)
    assert w._batch.batch_size == 2
    w.run(qn[:2], qp[:2], ckv, kpe)
    _plan(w, arrays)
    assert w._batch.batch_size == 4 and w._batch.causal == 1
    assert torch.equal(w.run(qn, qp, ckv, kpe), _checked_run(arrays, ckv, kpe, qn, qp))


def test_wrapper_repeat_plan_still_checks():
    g = torch.Generator().manual_seed(13)
    ckv, kpe, qn, qp = _wrapper_problem(g)
    w, (qo, indptr, idx, lens) = _steady_wrapper(g, ckv, kpe, qn, qp)
    out = w.run(qn, qp, ckv, kpe)
    # kv_indptr[-1] beyond kv_indices: refused, the last plan kept
    bad = indptr.clone()
    bad[-1] = idx.numel() + 1
    with pytest.raises(ValueError, match="kv_indices has"):
        _plan(w, (qo, bad, idx, lens))
    # a length beyond a request's pages: the planner's status
    bad = lens.clone()
    bad[0] = 10 ** 5
    with pytest.raises(fiattn.FiattnValueError):
        _plan(w, (qo, indptr, idx, bad))
    assert torch.equal(w.run(qn, qp, ckv, kpe), out)
    # wrong dtypes and a wrong head_dim are a new signature: the checked path refuses them
    with pytest.raises(TypeError):
        _plan(w, (qo, indptr.to(torch.int64), idx, lens))
    with pytest.raises(ValueError, match="head_dim_ckv"):
        w.plan(qo, indptr, idx, lens, 16, 256, 64, 16, True, 0.06, torch.float32,
               torch.float32)
    # a page index beyond the caches the plan was sized for: re-planned for more pages,
    # and run() then refuses the smaller caches
    big = idx.clone()
    big[0] = ckv.shape[0] + 5
    _plan(w, (qo, indptr, big, lens))
    assert w._entry.caps.num_pages == ckv.shape[0] + 6
    with pytest.raises(ValueError, match="pages"):
        w.run(qn, qp, ckv, kpe)


def test_wrapper_repeat_plan_more_query_tokens():
    # q_tokens is data: more than the plan entry holds takes the checked path (a larger plan)
    g = torch.Generator().manual_seed(14)
    ckv, kpe, qn, qp = _wrapper_problem(g, B=4)
    w, (qo, indptr, idx, lens) = _steady_wrapper(g, ckv, kpe, qn, qp)
    rows = 12  # 3 query rows a request
    assert w._entry.caps.max_q_tokens < rows
    qo2 = torch.arange(5, dtype=torch.int32) * 3
    lens2 = torch.full((4,), 64, dtype=torch.int32)
    qn2 = torch.randn(rows, 16, 512, generator=g)
    qp2 = torch.randn(rows, 16, 64, generator=g)
    _plan(w, (qo2, indptr, idx, lens2))  # same signature as the recorded plan
    assert w._entry.caps.max_q_tokens >= rows
    assert torch.equal(w.run(qn2, qp2, ckv, kpe),
                       _checked_run((qo2, indptr, idx, lens2), ckv, kpe, qn2, qp2))


def test_wrapper_repeat_plan_non_contiguous_and_uint32_arrays():
    g = torch.Generator().manual_seed(15)
    ckv, kpe, qn, qp = _wrapper_problem(g)
    w, (qo, indptr, idx, lens) = _steady_wrapper(g, ckv, kpe, qn, qp)
    lens_u = torch.zeros(8, dtype=torch.int32)[::2]  # strided: copied for the planner
    lens_u.copy_(lens)
    for _ in range(2):
        _plan(w, (qo, indptr, idx, lens_u))
    rec = w._plan_memo[next(reversed(w._plan_memo))]
    assert rec.direct == (True, True, False, True)
    assert torch.equal(w.run(qn, qp, ckv, kpe),
                       _checked_run((qo, indptr, idx, lens), ckv, kpe, qn, qp))


# ---- functional records: what the signature settles --------------------------------------
def test_functional_repeat_strided_and_2d_seq_lens(ws):
    g = torch.Generator().manual_seed(16)
    q, kv, bt, lens = _mla_inputs(g)
    ws2 = torch.empty(16, dtype=torch.uint8)
    for sl in (torch.zeros(8, dtype=torch.int32)[::2], torch.zeros(4, 1, dtype=torch.int32)):
        out = torch.empty(4, 1, 16, 512)
        for _ in range(3):  # record, then repeats with new lengths in the same tensor
            sl.copy_(torch.randint(1, 64, (4,), generator=g,
                                   dtype=torch.int32).reshape(sl.shape))
            _call(q, kv, ws, bt, sl, out)
            assert torch.equal(out, _call(q, kv, ws2, bt, sl.contiguous().reshape(4)))
        fast = E.cached_entry(ws).memo[next(reversed(E.cached_entry(ws).memo))]
        assert fast.sl_mode == (E.SL_HOST if sl.is_contiguous() else E.SL_HOST_COPY)
        assert fast.bt_host
    fiattn.release_workspace(ws2)


def test_current_device_check(monkeypatch):
    class Fake:
        def device(self):
            return 1
    monkeypatch.setattr(E, "_cuda", Fake())
    E.check_current_device(1)
    with pytest.raises(ValueError, match="current CUDA device is cuda:1"):
        E.check_current_device(0)


def test_plan_only_default_is_false_in_new_threads():
    import threading
    seen = []
    with fiattn.plan_only():
        th = threading.Thread(target=lambda: seen.append(E._plan_only()))
        th.start()
        th.join()
        assert E._plan_only()
    assert seen == [False] and not E._plan_only()
