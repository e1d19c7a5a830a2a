"""Plans are cached per workspace buffer and re-planned without allocation."""
import ctypes

import pytest

import fiattn
from fiattn import _capi as C
from fiattn import _engine as E

torch = pytest.importorskip("torch")


def _call(ws, B, lens_max=40, H=16, out=None, gen=None):
    q = torch.randn(B, 1, H, 576, generator=gen)
    kv = torch.randn(4 * B + 4, 16, 576, generator=gen)
    bt = torch.randperm(4 * B + 4, generator=gen)[:4 * B].to(torch.int32).reshape(B, 4)
    lens = torch.randint(1, lens_max, (B,), generator=gen, dtype=torch.int32)
    return fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q, kv, ws, 128, 512, 64, bt, lens,
                                                            64, out=out)


def test_functional_calls_reuse_one_plan():
    g = torch.Generator().manual_seed(0)
    ws = torch.empty(16, dtype=torch.uint8)
    fiattn.release_workspace(ws)
    # the same KV cache size every call (num_pages is part of the caps)
    q_all = torch.randn(8, 1, 16, 576, generator=g)
    kv = torch.randn(40, 16, 576, generator=g)
    before = E.stats["plans_created"]
    for B in (3, 8, 1, 5, 8):
        bt = torch.randperm(40, generator=g)[:4 * B].to(torch.int32).reshape(B, 4)
        lens = torch.randint(1, 64, (B,), generator=g, dtype=torch.int32)
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(q_all[:B], kv, ws, 128, 512, 64, bt,
                                                         lens, 64)
    assert E.stats["plans_created"] - before == 1
    e = E.cached_entry(ws)
    plan_ptr = e.plan.value
    # more requests than the rounded capacity (8): one new plan, then cached again
    for B in (9, 12):
        _call(ws, B, gen=g)
    assert E.stats["plans_created"] - before in (2, 3)  # the KV size differs per B here
    fiattn.release_workspace(ws)
    assert E.cached_entry(ws) is None
    assert plan_ptr


def test_other_caps_replace_the_plan():
    g = torch.Generator().manual_seed(1)
    ws = torch.empty(16, dtype=torch.uint8)
    before = E.stats["plans_created"]
    _call(ws, 2, H=16, gen=g)
    _call(ws, 2, H=32, gen=g)
    assert E.stats["plans_created"] - before == 2
    assert E.cached_entry(ws).caps.num_qo_heads == 32
    fiattn.release_workspace(ws)


def test_plan_update_allocates_nothing():
    """Counting host allocator: everything is allocated by fi_plan_create; any number of
    fi_plan_update calls afterwards allocate nothing."""
    counts = {"alloc": 0, "free": 0}
    libc = ctypes.CDLL(None)
    libc.aligned_alloc.restype = ctypes.c_void_p
    libc.aligned_alloc.argtypes = [ctypes.c_size_t, ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    @C.ALLOC_FN
    def alloc(ctx, n, align):
        counts["alloc"] += 1
        align = max(align, 16)
        return libc.aligned_alloc(align, (n + align - 1) // align * align)

    @C.FREE_FN
    def free(ctx, p):
        counts["free"] += 1
        libc.free(p)

    a = C.fi_allocator(alloc=alloc, free=free, ctx=None)
    caps = C.fi_caps(kind=1, max_batch=64, max_q_tokens=64, num_pages=4096, page_size=16,
                     num_qo_heads=128, num_kv_heads=1, head_dim_qk=576, head_dim_vo=512,
                     q_dtype=3, kv_dtype=3, o_dtype=3, num_ctas=132)
    plan = ctypes.c_void_p()
    C.check(C.lib().fi_plan_create(ctypes.byref(caps), None, 0, ctypes.byref(a),
                                   ctypes.byref(plan)), "create")
    created = counts["alloc"]
    assert created > 0
    g = torch.Generator().manual_seed(2)
    for B in (1, 17, 64, 5):
        bt = torch.randperm(4096, generator=g)[:B * 64].to(torch.int32).reshape(B, 64)
        lens = torch.randint(0, 1024, (B,), generator=g, dtype=torch.int32)
        b = C.fi_batch(form=1, batch_size=B, block_tables=bt.data_ptr(), max_pages_per_seq=64,
                       seq_lens=lens.data_ptr(), q_len_per_request=1, causal=1, window_left=-1)
        C.check(C.lib().fi_plan_update(plan, ctypes.byref(b), None), "update", plan)
    assert counts["alloc"] == created
    C.lib().fi_plan_destroy(plan)
    assert counts["free"] == created


def test_plan_only_plans_without_running():
    g = torch.Generator().manual_seed(3)
    ws = torch.empty(16, dtype=torch.uint8)
    out = torch.full((2, 1, 16, 512), 7.0)
    with fiattn.plan_only():
        r = _call(ws, 2, out=out, gen=g)
    assert r is out and (out == 7.0).all()
    assert E.cached_entry(ws).planned
    _call(ws, 2, out=out, gen=g)
    assert not (out == 7.0).all()
    fiattn.release_workspace(ws)


def test_clear_plan_cache():
    ws = torch.empty(16, dtype=torch.uint8)
    _call(ws, 1, gen=torch.Generator().manual_seed(4))
    destroyed = E.stats["plans_destroyed"]
    fiattn.clear_plan_cache()
    assert E.cached_entry(ws) is None and E.stats["plans_destroyed"] > destroyed
