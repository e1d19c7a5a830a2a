"""trtllm_batch_context_with_kv_cache on CPU tensors (the C reference executor over a host
plan): mixed prefill + decode batches with empty requests against the fp64 reference, the
recorded repeat path, and argument validation before any C call (out left untouched)."""
import pytest

torch = pytest.importorskip("torch")

import fiattn  # noqa: E402
from fiattn import _engine as E  # noqa: E402
from reference import paged_attention_ref, rel_err  # noqa: E402
from test_fast_path import _fiattn_bytes_grown  # noqa: E402

TOL = 2e-5  # fp32 inputs


@pytest.fixture
def ws():
    w = torch.empty(16, dtype=torch.uint8)
    yield w
    fiattn.release_workspace(w)


def _case(g, q_lens, kv_lens, H=8, Hkv=2, D=64, ps=16, layout="HND", form="tuple",
          spare_rows=3, spare_pages=2):
    """fp32 K / V in the canonical [pages, page_size, H_kv, D] and the API's form, shuffled
    block tables with one spare column, query with spare rows, cum arrays and seq_lens."""
    B = len(q_lens)
    P = max(1, max((k + ps - 1) // ps for k in kv_lens) + 1)
    num_pages = B * P + spare_pages
    K = torch.randn(num_pages, ps, Hkv, D, generator=g)
    V = torch.randn(num_pages, ps, Hkv, D, generator=g)
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    kv = (perm(K), perm(V)) if form == "tuple" else torch.stack([perm(K), perm(V)], 1)
    bt = torch.randperm(num_pages, generator=g)[:B * P].to(torch.int32).reshape(B, P)
    T = sum(q_lens)
    q = torch.randn(T + spare_rows, H, D, generator=g)
    cq = torch.tensor([0] + q_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    ck = torch.tensor([0] + kv_lens, dtype=torch.int32).cumsum(0).to(torch.int32)
    sl = torch.tensor(kv_lens, dtype=torch.int32)
    return q, kv, (K, V), bt, sl, cq, ck


def _ref(q, KV, bt, q_lens, kv_lens, scale, bmm2=1.0, window=-1, sinks=None):
    offs = [sum(q_lens[:b]) for b in range(len(q_lens))]
    return paged_attention_ref(q[:sum(q_lens)], KV[0], KV[1], bt.tolist(), kv_lens, q_lens,
                               offs, scale, bmm2, window_left=window, sinks=sinks)[0]


def _call(q, kv, ws, bt, sl, cq, ck, out=None, layout="HND", **kw):
    return fiattn.prefill.trtllm_batch_context_with_kv_cache(
        q, kv, ws, bt, sl, 0, 0, kw.pop("bmm1", 0.125), kw.pop("bmm2", 1.0), bt.shape[0], cq,
        ck, out=out, kv_layout=layout, **kw)


@pytest.mark.parametrize("layout,form,window,sinks", [("HND", "tuple", -1, False),
                                                      ("NHD", "single", 13, True)])
def test_mixed_batch_with_decodes_and_empty_requests_matches_reference(ws, layout, form,
                                                                       window, sinks):
    """Prompt chunks over cached prefixes beside q_len 1 decodes, a q_len 0 request and a
    kv_len 0 one, in one call: every written row against the fp64 reference, the spare rows
    past cum_seq_lens_q[-1] untouched."""
    g = torch.Generator().manual_seed(21)
    q_lens = [1, 37, 0, 1, 5, 1, 0]
    kv_lens = [40, 37 + 50, 9, 1, 0, 70, 0]
    q, kv, KV, bt, sl, cq, ck = _case(g, q_lens, kv_lens, layout=layout, form=form)
    sk = torch.randn(8, generator=g) if sinks else None
    if hasattr(torch, "uint32"):
        sl, ck = sl.to(torch.uint32), ck.to(torch.uint32)
    out = torch.full(q.shape, float("nan"))
    r = _call(q, kv, ws, bt, sl, cq, ck, out, layout, bmm2=0.75, window_left=window, sinks=sk)
    assert r is out
    T = sum(q_lens)
    ref = _ref(q, KV, bt, q_lens, kv_lens, 0.125, 0.75, window, sk)
    assert not torch.isnan(out[:T]).any() and torch.isnan(out[T:]).all()
    assert rel_err(out[:T], ref) < TOL
    assert (out[37 + 2:37 + 2 + 5] == 0).all()  # the kv_len 0 request's rows


def test_empty_batch_and_no_query_rows(ws):
    g = torch.Generator().manual_seed(22)
    q, kv, _, bt, sl, cq, ck = _case(g, [0, 0], [3, 0], spare_rows=0)
    assert q.shape[0] == 0
    assert _call(q, kv, ws, bt, sl, cq, ck).shape == (0, 8, 64)
    z = torch.zeros(1, dtype=torch.int32)
    out = _call(q, kv, ws, bt[:0], sl[:0], z, z)
    assert out.shape == (0, 8, 64)


def test_three_d_block_tables_read_v_pages_from_row_one(ws):
    g = torch.Generator().manual_seed(23)
    q_lens, kv_lens = [4, 1, 20], [30, 17, 20]
    q, kv, (K, V), bt, sl, cq, ck = _case(g, q_lens, kv_lens)
    vt = bt[torch.randperm(3, generator=g)]  # other requests' rows: distinct V pages
    bt3 = torch.stack([bt, vt], 1).contiguous()
    out = _call(q, kv, ws, bt3, sl, cq, ck, uses_shared_paged_kv_idx=False)
    Vr = V.clone()
    for b in range(3):
        Vr[bt[b]] = V[vt[b]]
    assert rel_err(out[:25], _ref(q, (K, Vr), bt, q_lens, kv_lens, 0.125)) < TOL


def test_out_dtype_rules(ws):
    g = torch.Generator().manual_seed(24)
    q, kv, _, bt, sl, cq, ck = _case(g, [3, 2], [3, 9])
    qh, kvh = q.half(), tuple(x.half() for x in kv)
    assert _call(qh, kvh, ws, bt, sl, cq, ck).dtype == torch.float16
    assert _call(qh, kvh, ws, bt, sl, cq, ck, out_dtype="float32").dtype == torch.float32
    assert _call(qh, kvh, ws, bt, sl, cq, ck, out_dtype=torch.bfloat16).dtype == torch.bfloat16
    out = torch.zeros(q.shape, dtype=torch.bfloat16)
    assert _call(qh, kvh, ws, bt, sl, cq, ck, out).dtype == torch.bfloat16  # out's dtype
    with pytest.raises(ValueError, match="out_dtype"):
        _call(qh, kvh, ws, bt, sl, cq, ck, out, out_dtype=torch.float16)
    with pytest.raises(TypeError, match="out_dtype"):
        _call(qh, kvh, ws, bt, sl, cq, ck, out_dtype="float17")


def _fp4(T, H=8, D=64, rows=None, start=0):
    """A fiattn.FP4Tensor out for T tokens (scale rows: start + T unless given), filled 0x55."""
    rows = start + T if rows is None else rows
    return fiattn.FP4Tensor(torch.full((T, H, D // 2), 0x55, dtype=torch.uint8),
                            torch.full((rows, H * D // 16), 0.5).to(torch.float8_e4m3fn), start)


@pytest.mark.parametrize("what", ["out_dtype", "fp4_out", "o_sf_scale", "o_sf_vec_size"])
def test_nvfp4_output_forms_are_not_implemented(ws, what):
    """NVFP4 output with valid arguments on CPU tensors (GPU only), and its arguments given
    for another output: NotImplementedError naming NVFP4, nothing written.  (NVFP4 KV on
    the CPU: test_nvfp4.py.)"""
    g = torch.Generator().manual_seed(25)
    q, kv, _, bt, sl, cq, ck = _case(g, [3, 2], [3, 9])
    out = torch.full(q.shape, 5.0)
    kw = {}
    if what == "out_dtype":
        kw["out_dtype"], kw["o_sf_scale"], out = "nvfp4", 100.0, None
    elif what == "fp4_out":
        out = _fp4(q.shape[0], start=5)
        kw["o_sf_scale"] = 100.0
    else:
        kw[what] = 1.0 if what == "o_sf_scale" else 16
    with pytest.raises(NotImplementedError, match="NVFP4"):
        _call(q, kv, ws, bt, sl, cq, ck, out, **kw)
    if isinstance(out, torch.Tensor):
        assert (out == 5.0).all()
    elif out is not None:
        assert (out.data == 0x55).all() and (out.scale.float() == 0.5).all()


@pytest.mark.parametrize("bad", ["no_scale", "zero_scale", "nan_scale", "vec_size", "tensor_out",
                                 "dtype_vs_fp4", "data_shape", "data_dtype", "scale_rows",
                                 "scale_cols", "scale_dtype", "start"])
def test_nvfp4_argument_errors_before_any_call(ws, bad):
    """NVFP4 output arguments are checked before any C call (so on CPU tensors too):
    ValueError / TypeError naming what is wrong, out left as it was."""
    g = torch.Generator().manual_seed(27)
    q, kv, _, bt, sl, cq, ck = _case(g, [3, 2], [3, 9])
    T = q.shape[0]
    out, kw = _fp4(T), {"o_sf_scale": 100.0}
    exc, match = ValueError, None
    if bad == "no_scale":
        del kw["o_sf_scale"]
        match = "o_sf_scale"
    elif bad in ("zero_scale", "nan_scale"):
        kw["o_sf_scale"] = 0.0 if bad == "zero_scale" else float("nan")
        match = "o_sf_scale"
    elif bad == "vec_size":
        kw["o_sf_vec_size"], match = 32, "o_sf_vec_size"
    elif bad == "tensor_out":
        out, kw["out_dtype"], match = torch.full(q.shape, 5.0), "nvfp4", "FP4Tensor"
    elif bad == "dtype_vs_fp4":
        kw["out_dtype"], match = torch.bfloat16, "out_dtype"
    elif bad == "data_shape":
        out.data, match = torch.zeros(T, 8, 64, dtype=torch.uint8), "out.data"
    elif bad == "data_dtype":
        out.data, exc, match = torch.zeros(T, 8, 32, dtype=torch.int8), TypeError, "out.data"
    elif bad == "scale_rows":
        out, match = _fp4(T, rows=T - 1), "out.scale"
    elif bad == "scale_cols":
        out.scale, match = torch.zeros(T, 16).to(torch.float8_e4m3fn), "out.scale"
    elif bad == "scale_dtype":
        out.scale, exc, match = torch.zeros(T, 32, dtype=torch.uint8), TypeError, "out.scale"
    else:
        out, match = _fp4(T, rows=T + 2, start=3), "out.scale"  # start + T > rows
    with pytest.raises(exc, match=match):
        _call(q, kv, ws, bt, sl, cq, ck, out, **kw)
    if isinstance(out, torch.Tensor):
        assert (out == 5.0).all()
    elif out.data.dtype == torch.uint8 and out.data.shape == (T, 8, 32):
        assert (out.data == 0x55).all()


def test_fp4tensor_mirrors_the_reference_class():
    d, s = torch.zeros(4, 2, 32, dtype=torch.uint8), torch.zeros(4, 8).to(torch.float8_e4m3fn)
    x = fiattn.FP4Tensor(d, s)
    assert x.data is d and x.scale is s and x.scale_start_index == 0 and x.original_shape is None
    assert fiattn.FP4Tensor(d, s, 3, (4, 2, 64)).original_shape == (4, 2, 64)


@pytest.mark.parametrize("bad", ["rows", "seq_lens", "q_over_kv", "table_dim1", "batch_size",
                                 "cum_len", "window", "head_dim"])
def test_validation_leaves_out_untouched(ws, bad):
    g = torch.Generator().manual_seed(26)
    q, kv, _, bt, sl, cq, ck = _case(g, [3, 2], [3, 9], spare_rows=0)
    out = torch.full(q.shape, 5.0)
    kw = {}
    exc, match = ValueError, None
    if bad == "rows":
        q, out = q[:4], out[:4]
        match = "exceeds query's 4 rows"
    elif bad == "seq_lens":
        sl = sl + 1
        exc, match = fiattn.FiattnValueError, "FI_ERR_INCONSISTENT_LENGTHS"
    elif bad == "q_over_kv":
        ck = torch.tensor([0, 2, 11], dtype=torch.int32)
        sl = torch.tensor([2, 9], dtype=torch.int32)
        exc, match = fiattn.FiattnValueError, "FI_ERR_INCONSISTENT_LENGTHS.*request 0"
    elif bad == "table_dim1":
        bt = torch.stack([bt, bt, bt], 1).contiguous()
        kw["uses_shared_paged_kv_idx"] = False
        match = "batch_size, 2"
    elif bad == "batch_size":
        with pytest.raises(ValueError, match="has 2 rows, the batch has 1"):
            fiattn.prefill.trtllm_batch_context_with_kv_cache(
                q, kv, ws, bt, sl[:1], 0, 0, 0.1, 1.0, 1, cq[:2], ck[:2], out=out)
        assert (out == 5.0).all()
        return
    elif bad == "cum_len":
        cq = cq[:2]
        match = "cum_seq_lens_q"
    elif bad == "window":
        kw["window_left"] = -2
        match = "window_left"
    else:
        q = torch.randn(5, 8, 32, generator=g)
        out = torch.full(q.shape, 5.0)
        match = "head_dim"
    with pytest.raises(exc, match=match):
        _call(q, kv, ws, bt, sl, cq, ck, out, **kw)
    assert (out == 5.0).all()


def test_repeat_call_reuses_record_rechecks_lengths_and_allocates_nothing(ws):
    """Same layouts, new lengths written into the same tensors: the recorded call runs
    (same fi_attn_args), matches the checked path on a fresh workspace, still refuses bad
    lengths (planner) and too many query tokens (Python), allocates nothing."""
    g = torch.Generator().manual_seed(27)
    q, kv, KV, bt, sl, cq, ck = _case(g, [6, 1, 9], [6, 30, 40], spare_rows=4)
    out = torch.empty(q.shape)
    sk = torch.randn(8, generator=g)
    _call(q, kv, ws, bt, sl, cq, ck, out, sinks=sk)
    e = E.cached_entry(ws)
    fast = next(iter(e.memo.values()))
    args = fast.args
    for q_lens, kv_lens in (([1, 1, 1], [7, 31, 41]), ([19, 0, 1], [20, 31, 42])):
        sl.copy_(torch.tensor(kv_lens))
        cq.copy_(torch.tensor([0] + q_lens).cumsum(0))
        ck.copy_(torch.tensor([0] + kv_lens).cumsum(0))
        out.fill_(float("nan"))
        created = E.stats["plans_created"]
        _call(q, kv, ws, bt, sl, cq, ck, out, bmm1=0.2, sinks=sk)
        assert len(e.memo) == 1 and next(iter(e.memo.values())) is fast and fast.args is args
        assert E.stats["plans_created"] == created and E.cached_entry(ws) is e
        ws2 = torch.empty(16, dtype=torch.uint8)
        ref = _call(q, kv, ws2, bt, sl, cq, ck, bmm1=0.2, sinks=sk)  # checked path
        fiattn.release_workspace(ws2)
        T = sum(q_lens)
        assert torch.equal(out[:T], ref[:T])
        assert rel_err(out[:T], _ref(q, KV, bt, q_lens, kv_lens, 0.2, sinks=sk)) < TOL
    for _ in range(3):
        _call(q, kv, ws, bt, sl, cq, ck, out, sinks=sk)
    # under one byte a call: nothing kept per call (the snapshot itself may take a free-list
    # tuple that one call then allocates again)
    assert _fiattn_bytes_grown(lambda: _call(q, kv, ws, bt, sl, cq, ck, out, sinks=sk),
                               200) < 200
    before = out.clone()
    bad = sl.clone()
    bad[1] += 1
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_INCONSISTENT_LENGTHS"):
        _call(q, kv, ws, bt, bad, cq, ck, out, sinks=sk)
    big = cq.clone()
    big[-1] = q.shape[0] + 1
    with pytest.raises(ValueError, match="exceeds query's"):
        _call(q, kv, ws, bt, sl, big, ck, out, sinks=sk)
    with pytest.raises(ValueError, match="finite"):
        _call(q, kv, ws, bt, sl, cq, ck, out, bmm1=float("nan"), sinks=sk)
    assert torch.equal(out, before) and len(e.memo) == 1


def test_plan_only_plans_without_writing(ws):
    g = torch.Generator().manual_seed(28)
    q, kv, _, bt, sl, cq, ck = _case(g, [3, 2], [3, 9])
    out = torch.full(q.shape, 5.0)
    for _ in range(2):  # the checked path, then the recorded one
        with fiattn.plan_only():
            assert _call(q, kv, ws, bt, sl, cq, ck, out) is out
        assert E.cached_entry(ws).planned and (out == 5.0).all()


def test_skip_softmax_factor_checked_and_exact_on_the_reference(ws):
    """skip_softmax_threshold_scale_factor: negative, NaN or inf raise ValueError before any
    C call (out untouched); on CPU tensors the C reference executor computes exact attention
    whatever the factor (the GPU family is the one that skips)."""
    g = torch.Generator().manual_seed(31)
    q_lens, kv_lens = [5, 1], [40, 17]
    q, kv, KV, bt, sl, cq, ck = _case(g, q_lens, kv_lens)
    for bad in (-1.0, float("nan"), float("inf")):
        out = torch.full_like(q, 7.0)
        with pytest.raises(ValueError):
            _call(q, kv, ws, bt, sl, cq, ck, out=out, skip_softmax_threshold_scale_factor=bad)
        assert torch.all(out == 7.0)
    out = _call(q, kv, ws, bt, sl, cq, ck, skip_softmax_threshold_scale_factor=5.0)
    assert rel_err(out[:sum(q_lens)].double(), _ref(q, KV, bt, q_lens, kv_lens, 0.125)) < TOL
