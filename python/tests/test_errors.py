"""Error mapping (fi_status -> exceptions with the status name and plan detail) and
argument validation before any C call (buffers untouched)."""
import ctypes

import pytest

import fiattn
from fiattn import _capi as C
from fiattn.errors import (FiattnError, FiattnNotImplementedError, FiattnValueError,
                           WorkspaceTooSmallError, error_for_status)

torch = pytest.importorskip("torch")


def test_generic_mapping_by_name():
    e = error_for_status(8, "FI_ERR_BATCH_OVER_CAPS", "m")
    assert isinstance(e, FiattnValueError) and isinstance(e, ValueError) and e.status == 8
    e = error_for_status(3, "FI_ERR_UNSUPPORTED_KIND", "m")
    assert isinstance(e, FiattnNotImplementedError) and isinstance(e, NotImplementedError)
    assert isinstance(error_for_status(17, "FI_ERR_WORKSPACE_TOO_SMALL", "m"),
                      WorkspaceTooSmallError)
    assert type(error_for_status(20, "FI_ERR_CUDA", "m")) is FiattnError
    # fi_run's grid larger than the device holds resident: the caps' num_ctas, a caller's
    # choice, so a ValueError
    e = error_for_status(42, C.status_name(42), "m")
    assert type(e) is FiattnValueError and e.status_name == "FI_ERR_GRID_NOT_RESIDENT"
    # a status appended to the C enum later: still a FiattnError carrying its code
    e = error_for_status(99, C.status_name(99), "m")
    assert type(e) is FiattnError and e.status == 99 and e.status_name == "FI_STATUS_UNKNOWN"


def test_check_carries_name_and_plan_detail():
    caps = C.fi_caps(kind=1, max_batch=2, max_q_tokens=2, num_pages=4, page_size=16,
                     num_qo_heads=16, num_kv_heads=1, head_dim_qk=576, head_dim_vo=512,
                     q_dtype=1, kv_dtype=1, o_dtype=1, num_ctas=4)
    plan = ctypes.c_void_p()
    C.check(C.lib().fi_plan_create(ctypes.byref(caps), None, 0, None, ctypes.byref(plan)),
            "create")
    try:
        bt = (ctypes.c_int32 * 2)(0, 9)  # page 9 >= num_pages 4
        sl = (ctypes.c_int32 * 2)(16, 32)
        b = C.fi_batch(form=1, batch_size=2, block_tables=ctypes.addressof(bt),
                       max_pages_per_seq=1, seq_lens=ctypes.addressof(sl),
                       q_len_per_request=1, causal=1, window_left=-1)
        st = C.lib().fi_plan_update(plan, ctypes.byref(b), None)
        with pytest.raises(FiattnValueError) as ei:
            C.check(st, "fi_plan_update", plan)
        msg = str(ei.value)
        assert "FI_ERR_SEQ_LEN_EXCEEDS_PAGES" in msg and "request 1" in msg
        assert ei.value.detail.request == 1
    finally:
        C.lib().fi_plan_destroy(plan)


def _mla_inputs(B=2, H=16, ps=16):
    q = torch.randn(B, 1, H, 576)
    kv = torch.randn(8, ps, 576)
    bt = torch.arange(B * 2, dtype=torch.int32).reshape(B, 2)
    lens = torch.tensor([20, 5][:B], dtype=torch.int32)
    return q, kv, bt, lens


def _call(q, kv, bt, lens, out, ws=None, **kw):
    return fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
        q, kv, ws if ws is not None else torch.empty(1), 128, 512, 64, bt, lens, 64, out=out, **kw)


def test_batch_error_raised_with_request_and_out_untouched():
    q, kv, bt, lens = _mla_inputs()
    lens[1] = 100  # needs 7 pages, the row has 2
    out = torch.zeros(2, 1, 16, 512)
    with pytest.raises(FiattnValueError, match="FI_ERR_SEQ_LEN_EXCEEDS_PAGES.*request 1"):
        _call(q, kv, bt, lens, out)
    assert (out == 0).all()
    bt[0, 0] = 8  # page index == num_pages
    lens[1] = 5
    with pytest.raises(FiattnValueError, match="FI_ERR_PAGE_INDEX_OUT_OF_RANGE"):
        _call(q, kv, bt, lens, out)
    assert (out == 0).all()


@pytest.mark.parametrize("bad", ["dtype", "device_meta", "last_dim", "shape", "rank", "scale",
                                 "sinks", "table_dtype", "table_noncontig", "backend",
                                 "lora", "sparse"])
def test_validation_before_c_call(bad):
    q, kv, bt, lens = _mla_inputs()
    out = torch.zeros(2, 1, 16, 512)
    kw = {}
    exc = (TypeError, ValueError)
    if bad == "dtype":
        q = q.double()
    elif bad == "device_meta":
        kv = torch.empty(8, 16, 576, device="meta")
    elif bad == "last_dim":
        q = torch.randn(2, 1, 16, 576 * 2)[..., ::2]
    elif bad == "shape":
        out = torch.zeros(2, 1, 16, 511)
    elif bad == "rank":
        q = q[:, 0]
    elif bad == "scale":
        kw["bmm1_scale"] = torch.tensor([1.0, 2.0])
    elif bad == "sinks":
        kw["sinks"] = torch.zeros(3)
    elif bad == "table_dtype":
        bt = bt.long()
    elif bad == "table_noncontig":
        bt = torch.arange(8, dtype=torch.int32).reshape(2, 4)[:, ::2]
    elif bad == "backend":
        kw["backend"] = "cuda-magic"
    elif bad == "lora":
        with pytest.raises(ValueError):
            fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q, kv, torch.empty(1), 128, 256, 64,
                                                             bt, lens, 64, out=out)
        return
    elif bad == "sparse":
        kw["sparse_mla_top_k"] = 8  # a dense [B, pages] table is not a [B, q_len, 8] one
    with pytest.raises(exc):
        _call(q, kv, bt, lens, out, **kw)
    assert (out == 0).all()


def test_fp8_inputs_in_cpu_reference_match_their_dequantised_values():
    # The CPU references take fp8 e4m3 inputs (dequantised exactly): the same values given
    # as bf16 (e4m3 -> bf16 is exact) give the same output.
    q, kv, bt, lens = _mla_inputs()
    if not hasattr(torch, "float8_e4m3fn"):
        pytest.skip("no fp8 in this torch")
    q8, kv8 = q.to(torch.float8_e4m3fn), kv.to(torch.float8_e4m3fn)
    out8 = torch.full((2, 1, 16, 512), float("nan"), dtype=torch.bfloat16)
    outb = torch.full((2, 1, 16, 512), float("nan"), dtype=torch.bfloat16)
    _call(q8, kv8, bt, lens, out8)
    _call(q8.to(torch.bfloat16), kv8.to(torch.bfloat16), bt, lens, outb)
    assert torch.isfinite(out8.float()).all()
    assert torch.equal(out8, outb)


def test_workspace_too_small_and_size_helper():
    from fiattn import _engine as E
    need = fiattn.workspace_size("mla_decode", 8, 8, 16, page_size=16, num_ctas=132)
    assert need > 0
    caps = C.fi_caps(kind=1, num_pages=8, page_size=16, num_qo_heads=16, num_kv_heads=1,
                     head_dim_qk=576, head_dim_vo=512, q_dtype=3, kv_dtype=3, o_dtype=3,
                     num_ctas=132)
    ws = torch.empty(need - 256, dtype=torch.uint8)  # a device plan would not fit
    with pytest.raises(WorkspaceTooSmallError, match=str(need)):
        E.get_entry(ws, caps, 8, 8, host=False, capturing=False)
    with pytest.raises(FiattnValueError, match="FI_ERR_UNSUPPORTED_HEADS"):
        fiattn.workspace_size("mla_decode", 8, 8, 12, num_ctas=132)


def test_wrapper_errors():
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(torch.empty(1))
    with pytest.raises(RuntimeError, match="before plan"):
        w.run(torch.zeros(1, 16, 512), torch.zeros(1, 16, 64), torch.zeros(2, 1, 512),
              torch.zeros(2, 1, 64))
    with pytest.raises(FiattnValueError, match="FI_ERR_INDPTR_NOT_MONOTONE"):
        w.plan(torch.tensor([0, 1], dtype=torch.int32), torch.tensor([0, 2], dtype=torch.int32),
               torch.tensor([0, 1], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
               16, 512, 64, 1, False, 1.0, torch.float32, torch.float32) or \
            w.plan(torch.tensor([1, 1], dtype=torch.int32),
                   torch.tensor([0, 2], dtype=torch.int32),
                   torch.tensor([0, 1], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
                   16, 512, 64, 1, False, 1.0, torch.float32, torch.float32)


def test_cuda_tensor_without_gpu_is_clear():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises((RuntimeError, AssertionError)):
        torch.empty(1, device="cuda")


def _sparse_table(B=2, ql=1, K=8, dtype=torch.int32):
    """A [B, q_len, K] top-k table of flat KV slots (page * page_size + offset), -1 padded."""
    t = torch.arange(B * ql * K, dtype=torch.int64).reshape(B, ql, K) % 20
    t[..., -2:] = -1
    return t.to(dtype)


@pytest.mark.parametrize("bad,exc", [
    ("negative_k", ValueError), ("k_over_limit", ValueError), ("k_float", TypeError),
    ("k_bool", TypeError), ("table_int64", TypeError), ("table_2d_dense", ValueError),
    ("table_wrong_k", ValueError), ("table_wrong_q_len", ValueError),
    ("table_noncontig", ValueError), ("table_4d", (TypeError, ValueError))])
def test_sparse_arguments_validated_before_c_call(bad, exc):
    """sparse_mla_top_k > 0: block_tables must be int32 [B, q_len, K] (or [B * q_len, K]),
    contiguous; K an int in 0..FI_LIMIT_SPARSE_TOP_K.  Refused before any C call, out
    untouched."""
    q, kv, _, lens = _mla_inputs()
    out = torch.zeros(2, 1, 16, 512)
    K, bt = 8, _sparse_table()
    if bad == "negative_k":
        K = -1
    elif bad == "k_over_limit":
        K = fiattn.mla.SPARSE_TOP_K_LIMIT + 1
    elif bad == "k_float":
        K = 8.0
    elif bad == "k_bool":
        K = True
    elif bad == "table_int64":
        bt = bt.long()
    elif bad == "table_2d_dense":
        bt = torch.zeros(2, 2, dtype=torch.int32)
    elif bad == "table_wrong_k":
        bt = _sparse_table(K=16)
    elif bad == "table_wrong_q_len":
        bt = _sparse_table(ql=2)
    elif bad == "table_noncontig":
        bt = _sparse_table(K=16)[..., ::2]
    elif bad == "table_4d":
        bt = bt[None]
    with pytest.raises(exc):
        _call(q, kv, bt, lens, out, sparse_mla_top_k=K)
    assert (out == 0).all()


def test_sparse_table_shapes_accepted_by_validation(monkeypatch):
    """Both sparse table forms pass the Python checks and reach the C call with
    caps.sparse_top_k = K and the table as [B * q_len, K] (fi_run's view)."""
    from fiattn import _engine as E
    seen = []

    def fake_launch(ws, caps, B, q_tokens, device, make_batch, args, *a, **k):
        seen.append((caps.sparse_top_k, tuple(args.page_table.shape[:2]), B, q_tokens,
                     k.get("make_device_batch")))
        return True
    monkeypatch.setattr(E, "launch", fake_launch)
    q = torch.randn(2, 2, 16, 576)
    kv = torch.randn(8, 16, 576)
    lens = torch.tensor([20, 5], dtype=torch.int32)
    for bt in (_sparse_table(ql=2), _sparse_table(ql=2).reshape(4, 8)):
        _call(q, kv, bt, lens, torch.zeros(2, 2, 16, 512), sparse_mla_top_k=8)
    assert seen == [(8, (4, 8), 2, 4, None)] * 2


def _caps(kind, heads, kv_heads, dim_qk, dim_vo, dtype, q_tokens=8):
    c = C.fi_caps()
    c.kind, c.max_batch, c.max_q_tokens = kind, 8, q_tokens
    c.num_pages, c.page_size, c.num_ctas = 64, 64, 132
    c.num_qo_heads, c.num_kv_heads, c.head_dim_qk, c.head_dim_vo = heads, kv_heads, dim_qk, dim_vo
    c.q_dtype = c.kv_dtype = dtype
    c.o_dtype = C.FI_DTYPE_BF16
    return c


def test_parallel_variant_comes_from_the_tile_table():
    """The device-planning row of the caps (fi_caps_parallel_variant), and its refusal."""
    from fiattn._engine import _parallel_variant
    mla = C.FI_KIND_MLA_DECODE
    assert _parallel_variant(_caps(mla, 16, 1, 576, 512, C.FI_DTYPE_BF16)) == 10
    assert _parallel_variant(_caps(mla, 16, 1, 576, 512, C.FI_DTYPE_BF16, 16)) == 2
    assert _parallel_variant(_caps(mla, 64, 1, 576, 512, C.FI_DTYPE_BF16)) == 5
    assert _parallel_variant(_caps(mla, 16, 1, 576, 512, C.FI_DTYPE_E4M3)) == 8
    assert _parallel_variant(_caps(mla, 16, 1, 576, 512, C.FI_DTYPE_E4M3, 16)) == 2
    g = _caps(C.FI_KIND_GQA_DECODE, 32, 8, 128, 128, C.FI_DTYPE_BF16)
    g.variant = 3
    assert _parallel_variant(g) == 1
    g.variant = 2
    assert _parallel_variant(g) == 4
    c = _caps(mla, 16, 1, 576, 512, C.FI_DTYPE_BF16)
    c.variant = 1  # mla_decode_rows32 has no parallel row
    with pytest.raises(FiattnError, match="FI_ERR_UNSUPPORTED_VARIANT"):
        _parallel_variant(c)


def test_device_plan_caps_are_sized_by_the_call():
    """The functional APIs' caps arrive unsized (max_batch = max_q_tokens = 0): the
    device-planned row is asked with the call's batch, whose MTP depth picks it."""
    from fiattn._engine import _device_plan_caps
    mla = C.FI_KIND_MLA_DECODE
    c = _caps(mla, 16, 1, 576, 512, C.FI_DTYPE_E4M3)
    c.max_batch = c.max_q_tokens = 0
    assert _device_plan_caps(c, 128, 128).variant == 8  # 16 rows a request
    assert _device_plan_caps(c, 128, 256).variant == 2  # q_len 2: 32 rows
    assert _device_plan_caps(c, 0, 0).variant == 8
    assert (c.max_batch, c.max_q_tokens, c.variant) == (0, 0, 0)  # the caller's caps kept
    c.variant = 1  # a row without a data-parallel twin: refused as before
    with pytest.raises(FiattnError, match="FI_ERR_UNSUPPORTED_VARIANT"):
        _device_plan_caps(c, 128, 128)
