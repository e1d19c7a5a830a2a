"""NVFP4 KV in xqa_batch_decode_with_kv_cache (kv_cache_sf) and
trtllm_batch_context_with_kv_cache (kv_block_scales) without a GPU: the mapping of the
reference's forms onto fi_attn_args (k / v as E2M1 bytes, k_sf / v_sf as E4M3 rows),
argument validation, the layout statuses, the CPU reference's refusal, and the torch
dequantisation the GPU tests compare against."""
import pytest

torch = pytest.importorskip("torch")

import fiattn  # noqa: E402
from fiattn import _capi as C  # noqa: E402
from fiattn import _engine as E  # noqa: E402
from reference import e4m3_bytes_to_float, nvfp4_dequant  # noqa: E402

P, PS, HKV, D, B, H = 10, 16, 2, 64, 3, 8


class _Recorder:
    """libfiattn with fi_ref_run replaced: records a copy of the fi_attn_args and the plan's
    caps, returns FI_OK (so no NVFP4 CPU reference is needed to see the mapping)."""

    def __init__(self, real):
        self._real = real
        self.args = []
        self.caps = []

    def fi_ref_run(self, plan, pargs):
        self.args.append(C.fi_attn_args.from_buffer_copy(pargs._obj))
        self.caps.append(C.fi_caps.from_buffer_copy(self._real.fi_plan_caps(plan).contents))
        return C.FI_OK

    def __getattr__(self, name):
        return getattr(self._real, name)


@pytest.fixture
def rec(monkeypatch):
    r = _Recorder(C.lib())
    monkeypatch.setattr(C, "_lib", r)
    yield r
    fiattn.clear_plan_cache()


def _inputs(g, layout="NHD", form="single", sf_dtype=None):
    k = torch.randint(0, 256, (P, PS, HKV, D // 2), dtype=torch.uint8, generator=g)
    v = torch.randint(0, 256, (P, PS, HKV, D // 2), dtype=torch.uint8, generator=g)
    ks = torch.randint(0x18, 0x30, (P, PS, HKV, D // 16), dtype=torch.uint8, generator=g)
    vs = torch.randint(0x18, 0x30, (P, PS, HKV, D // 16), dtype=torch.uint8, generator=g)
    if sf_dtype is not None:
        ks, vs = ks.view(sf_dtype), vs.view(sf_dtype)
    perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)
    if form == "single":
        kv = torch.stack([perm(k), perm(v)], 1)
        sf = torch.stack([perm(ks), perm(vs)], 1)
    else:
        kv, sf = (perm(k), perm(v)), (perm(ks), perm(vs))
    q = torch.randn(B, H, D, generator=g)
    bt = torch.randperm(P, generator=g)[:9].to(torch.int32).reshape(B, 3)
    lens = torch.tensor([40, 3, 17], dtype=torch.int32)
    return q, kv, sf, bt, lens


def _call(q, kv, sf, bt, lens, layout="NHD", out=None, ws=None, **kw):
    return fiattn.decode.xqa_batch_decode_with_kv_cache(
        q, kv, torch.empty(1) if ws is None else ws, bt, lens, 48, bmm1_scale=0.3,
        bmm2_scale=0.7, out=out, kv_layout=layout, kv_cache_sf=sf, **kw)


def _logical(x, layout):
    """(address, [pages, page_size, H_kv, W] shape, strides) of a 4-D cache view."""
    sh, st = list(x.shape), list(x.stride())
    if layout == "HND":
        sh[1], sh[2], st[1], st[2] = sh[2], sh[1], st[2], st[1]
    return x.data_ptr(), sh, st


def _desc(ft):
    return ft.data, ft.dtype, list(ft.shape[:ft.ndim]), list(ft.stride[:ft.ndim])


def _assert_nvfp4_mapping(a, caps, kv, sf, layout, form):
    """The recorded args / caps describe _inputs' cache (kv) and scales (sf) in place: k / v
    E2M1 byte views [P, PS, HKV, D / 2], k_sf / v_sf E4M3 views [P, PS, HKV, D / 16]."""
    assert caps.kv_dtype == C.FI_DTYPE_E2M1 and caps.head_dim_qk == caps.head_dim_vo == D
    assert (caps.num_pages, caps.page_size, caps.num_kv_heads) == (P, PS, HKV)
    kvs = kv.unbind(1) if form == "single" else kv
    sfs = sf.unbind(1) if form == "single" else sf
    for ft, x in ((a.k, kvs[0]), (a.v, kvs[1])):
        addr, sh, st = _logical(x, layout)
        assert _desc(ft) == (addr, C.FI_DTYPE_E2M1, sh, st)
        assert sh == [P, PS, HKV, D // 2]
    for ft, x in ((a.k_sf, sfs[0]), (a.v_sf, sfs[1])):
        addr, sh, st = _logical(x, layout)
        assert _desc(ft) == (addr, C.FI_DTYPE_E4M3, sh, st)
        assert sh == [P, PS, HKV, D // 16]


@pytest.mark.parametrize("layout,form", [("NHD", "single"), ("HND", "single"),
                                         ("NHD", "tuple"), ("HND", "tuple")])
def test_nvfp4_forms_map_onto_e2m1_kv_and_e4m3_scale_rows(rec, layout, form):
    g = torch.Generator().manual_seed(1)
    q, kv, sf, bt, lens = _inputs(g, layout, form)
    _call(q, kv, sf, bt, lens, layout)
    a = rec.args[-1]
    assert rec.caps[-1].kind == C.FI_KIND_GQA_DECODE
    _assert_nvfp4_mapping(a, rec.caps[-1], kv, sf, layout, form)
    assert a.bmm1_scale == pytest.approx(0.3) and a.bmm2_scale == pytest.approx(0.7)


def test_nvfp4_accepts_float8_scale_bytes(rec):
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no float8_e4m3fn")
    g = torch.Generator().manual_seed(2)
    q, kv, sf, bt, lens = _inputs(g, sf_dtype=torch.float8_e4m3fn)
    _call(q, kv, sf, bt, lens)
    assert rec.args[-1].k_sf.dtype == C.FI_DTYPE_E4M3
    assert rec.args[-1].v_sf.data == sf.data_ptr() + sf.stride(1)


def test_nvfp4_repeat_call_refreshes_scale_addresses(rec):
    g = torch.Generator().manual_seed(3)
    q, kv, sf, bt, lens = _inputs(g)
    ws = torch.empty(1, dtype=torch.uint8)
    _call(q, kv, sf, bt, lens, ws=ws)
    e = E.cached_entry(ws)
    fast = next(iter(e.memo.values()))
    sf2 = sf.clone()  # same layout, new address: the recorded call is reused
    _call(q, kv, sf2, bt, lens, ws=ws)
    a = rec.args[-1]
    assert len(e.memo) == 1 and next(iter(e.memo.values())) is fast
    assert a.k_sf.data == sf2.data_ptr() and a.v_sf.data == sf2.data_ptr() + sf2.stride(1)
    assert a.k.data == kv.data_ptr()


def test_nvfp4_not_on_the_cpu_reference():
    g = torch.Generator().manual_seed(4)
    q, kv, sf, bt, lens = _inputs(g)
    out = torch.zeros(B, H, D)
    with pytest.raises(fiattn.FiattnNotImplementedError, match="FI_ERR_UNSUPPORTED_DTYPE") as ei:
        _call(q, kv, sf, bt, lens, out=out)
    assert "nvfp4" in str(ei.value) and "CPU reference" in str(ei.value)
    assert (out == 0).all()


def test_nvfp4_argument_errors():
    g = torch.Generator().manual_seed(5)
    q, kv, sf, bt, lens = _inputs(g)
    with pytest.raises(ValueError, match="needs its block scales"):
        _call(q, kv, None, bt, lens)
    with pytest.raises(ValueError, match="belongs to an NVFP4"):
        _call(q, torch.randn(P, 2, PS, HKV, D), sf, bt, lens)
    with pytest.raises(ValueError, match="head_dim / 2"):
        _call(q, torch.zeros(P, 2, PS, HKV, D, dtype=torch.uint8), sf, bt, lens)
    with pytest.raises(ValueError, match="head_dim / 16"):
        _call(q, kv, sf[..., :2].contiguous(), bt, lens)
    with pytest.raises(ValueError, match="page_size"):
        _call(q, kv, sf[:, :, :8].contiguous(), bt, lens)
    with pytest.raises(TypeError, match="kv_cache_sf"):
        _call(q, kv, sf.float(), bt, lens)
    with pytest.raises(ValueError, match="kv_cache_sf as a tuple"):
        _call(q, kv, (sf[:, 0],), bt, lens)


def test_nvfp4_scale_layouts_the_gpu_family_cannot_read_raise_their_status():
    g = torch.Generator().manual_seed(6)
    q, kv, sf, bt, lens = _inputs(g)
    row = D // 16
    # a base one byte past a row boundary
    buf = torch.zeros(sf.numel() + row, dtype=torch.uint8)
    shifted = buf[1:1 + sf.numel()].view(sf.shape)
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_MISALIGNED_POINTER") as ei:
        _call(q, kv, shifted, bt, lens)
    assert ei.value.status == C.FI_ERR_MISALIGNED_POINTER
    # scale rows of a wider tensor: a head stride of row + 1 bytes
    wide = torch.zeros(P, 2, PS, HKV, row + 1, dtype=torch.uint8)[..., :row]
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_BAD_STRIDE") as ei:
        _call(q, kv, wide, bt, lens)
    assert ei.value.status_name == "FI_ERR_BAD_STRIDE"
    # padded pages whose strides stay multiples of the row are fine for the checks
    padded = torch.zeros(P, 2, PS + 1, HKV, row, dtype=torch.uint8)[:, :, :PS]
    with pytest.raises(fiattn.FiattnNotImplementedError):  # reaches the CPU reference
        _call(q, kv, padded, bt, lens)


def test_reference_dequantisation_known_values():
    # e4m3: 0x38 = 1.0, 0x30 = 0.5, 0x01 = 2^-9 (subnormal), 0xb8 = -1.0, 0x7e = 448
    s = e4m3_bytes_to_float(torch.tensor([0x38, 0x30, 0x01, 0xB8, 0x7E], dtype=torch.uint8))
    assert s.tolist() == [1.0, 0.5, 2.0 ** -9, -1.0, 448.0]
    if hasattr(torch, "float8_e4m3fn"):
        allb = torch.arange(256, dtype=torch.int32).to(torch.uint8)
        ours = e4m3_bytes_to_float(allb)
        theirs = allb.view(torch.float8_e4m3fn).double()
        ok = ~torch.isnan(theirs)
        assert torch.equal(ours[ok], theirs[ok]) and torch.isnan(ours[~ok]).all()
    # byte 0x21: low nibble 1 (0.5) is element 0, high nibble 2 (1.0) element 1; 0xf9:
    # 9 -> -0.5, 15 -> -6; block scale 0.5 for the first 16 elements, 2.0 for the next
    packed = torch.zeros(1, 16, dtype=torch.uint8)
    packed[0, 0], packed[0, 1], packed[0, 8] = 0x21, 0xF9, 0x07
    sf = torch.tensor([[0x30, 0x40]], dtype=torch.uint8)
    x = nvfp4_dequant(packed, sf)
    assert x.shape == (1, 32)
    assert x[0, :4].tolist() == [0.25, 0.5, -0.25, -3.0]
    assert x[0, 16].item() == 12.0 and x[0, 17].item() == 0.0


# ---- context attention (trtllm_batch_context_with_kv_cache, kv_block_scales) --------------

def _ctx_call(q, kv, sf, bt, lens, layout="HND", out=None, ws=None):
    """Context call over _inputs' batch as prefill chunks: q_len 1 each (the first B rows of
    q), kv_len lens; bt [B, 3]."""
    n = bt.shape[0]
    cq = torch.arange(n + 1, dtype=torch.int32)
    ck = torch.cat([torch.zeros(1, dtype=torch.int32), lens.cumsum(0).to(torch.int32)])
    return fiattn.prefill.trtllm_batch_context_with_kv_cache(
        q, kv, torch.empty(1) if ws is None else ws, bt, lens, 1, 48, 0.3, 0.7, n, cq, ck,
        out=out, kv_layout=layout, kv_block_scales=sf)


@pytest.mark.parametrize("layout,form", [("HND", "single"), ("NHD", "tuple")])
def test_context_nvfp4_forms_map_onto_e2m1_kv_and_e4m3_scale_rows(rec, layout, form):
    g = torch.Generator().manual_seed(11)
    q, kv, sf, bt, lens = _inputs(g, layout, form)
    _ctx_call(q, kv, sf, bt, lens, layout)
    assert rec.caps[-1].kind == C.FI_KIND_CONTEXT
    _assert_nvfp4_mapping(rec.args[-1], rec.caps[-1], kv, sf, layout, form)


def test_context_nvfp4_repeat_call_refreshes_scale_addresses(rec):
    g = torch.Generator().manual_seed(12)
    q, kv, sf, bt, lens = _inputs(g, "HND", "tuple")
    ws = torch.empty(1, dtype=torch.uint8)
    _ctx_call(q, kv, sf, bt, lens, ws=ws)
    e = E.cached_entry(ws)
    fast = next(iter(e.memo.values()))
    sf2 = tuple(x.clone() for x in sf)  # same layout, new addresses: the record is reused
    _ctx_call(q, kv, sf2, bt, lens, ws=ws)
    a = rec.args[-1]
    assert len(e.memo) == 1 and next(iter(e.memo.values())) is fast
    assert a.k_sf.data == sf2[0].data_ptr() and a.v_sf.data == sf2[1].data_ptr()


def test_context_nvfp4_not_on_the_cpu_reference():
    g = torch.Generator().manual_seed(13)
    q, kv, sf, bt, lens = _inputs(g, "HND", "single")
    out = torch.zeros(q.shape)
    with pytest.raises(fiattn.FiattnNotImplementedError, match="FI_ERR_UNSUPPORTED_DTYPE") as ei:
        _ctx_call(q, kv, sf, bt, lens, out=out)
    assert "nvfp4" in str(ei.value)
    assert (out == 0).all()


def test_context_nvfp4_argument_errors():
    g = torch.Generator().manual_seed(14)
    q, kv, sf, bt, lens = _inputs(g, "HND", "single")
    out = torch.full(q.shape, 5.0)
    with pytest.raises(ValueError, match="needs its block scales, kv_block_scales"):
        _ctx_call(q, kv, None, bt, lens, out=out)
    with pytest.raises(ValueError, match="kv_block_scales belongs to an NVFP4"):
        _ctx_call(q, torch.randn(P, 2, HKV, PS, D), sf, bt, lens, out=out)
    with pytest.raises(ValueError, match="head_dim / 2"):
        _ctx_call(q, torch.zeros(P, 2, HKV, PS, D, dtype=torch.uint8), sf, bt, lens, out=out)
    with pytest.raises(ValueError, match="k_scales must be .*head_dim / 16"):
        _ctx_call(q, kv, sf[..., :2].contiguous(), bt, lens, out=out)
    with pytest.raises(ValueError, match="page_size"):
        _ctx_call(q, kv, sf[:, :, :, :8].contiguous(), bt, lens, out=out)
    with pytest.raises(TypeError, match="kv_block_scales"):
        _ctx_call(q, kv, sf.float(), bt, lens, out=out)
    with pytest.raises(ValueError, match="kv_block_scales as a tuple"):
        _ctx_call(q, kv, (sf[:, 0],), bt, lens, out=out)
    row = D // 16
    buf = torch.zeros(sf.numel() + row, dtype=torch.uint8)
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_MISALIGNED_POINTER"):
        _ctx_call(q, kv, buf[1:1 + sf.numel()].view(sf.shape), bt, lens, out=out)
    wide = torch.zeros(P, 2, HKV, PS, row + 1, dtype=torch.uint8)[..., :row]
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_BAD_STRIDE"):
        _ctx_call(q, kv, wide, bt, lens, out=out)
    assert (out == 5.0).all()
