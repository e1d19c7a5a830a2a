#!/usr/bin/env python3
"""Host overhead of the Python layer per call, against the bare C calls (GPU machine).

    python3 python/bench_host.py [--batch 64] [--heads 128] [--calls 2000]

Measures host time only (time.perf_counter around N calls; the GPU work queues behind):
  C fi_run            ctypes call of fi_run with a prebuilt fi_attn_args (the C floor)
  wrapper.run         BatchMLAPagedAttentionWrapper.run (argument checks, descriptors, fi_run)
  C fi_plan_update    ctypes call with a prebuilt fi_batch (host arrays)
  wrapper.plan        BatchMLAPagedAttentionWrapper.plan with CPU index arrays
  functional (host)   trtllm_batch_decode_with_kv_cache_mla, CPU seq_lens (plan + run)
  functional (device) the same with CUDA seq_lens (adds a D2H copy + stream sync)
and prints us per call and the Python overhead (Python - C).  Target: <= 15 us per call.

    python3 python/bench_host.py --cpu-overhead [--batch 64] [--heads 128] [--calls 2000]

No GPU needed: the same calls on CPU tensors (host plan, fi_ref_run path) with the C entry
points fi_run / fi_ref_run / fi_plan_update replaced by a Python no-op returning FI_OK, so
only the Python side is timed; the no-op's own call cost is measured and subtracted.  Also
times xqa_batch_decode_with_kv_cache (GQA decode, B x 1024, 32 / 8 heads, bf16).
"""
import argparse
import ctypes
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch  # noqa: E402

import fiattn  # noqa: E402
from fiattn import _capi as C  # noqa: E402
from fiattn import _engine as E  # noqa: E402


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timeit(fn, calls):
    for _ in range(20):
        fn()
    _sync()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        dt = (time.perf_counter() - t0) / calls
        _sync()
        best = min(best, dt)
    return best * 1e6


class _NoopLib:
    """libfiattn with its per-call entry points replaced by no-ops (--cpu-overhead)."""

    HOT = ("fi_run", "fi_ref_run", "fi_plan_update")

    def __init__(self, real):
        self._real = real
        self.calls = 0

        def noop(*a):
            self.calls += 1
            return 0
        for n in self.HOT:
            setattr(self, n, noop)

    def __getattr__(self, name):
        return getattr(self._real, name)


def cpu_overhead(a):
    """Python-side host time per call on CPU tensors, C calls stubbed out."""
    B, H, ps, dt = a.batch, a.heads, 64, torch.bfloat16
    ppr = (a.len + ps - 1) // ps
    P = B * ppr
    g = torch.Generator().manual_seed(0)
    ckv = torch.randn(P, ps, 512, generator=g).to(dt)
    kpe = torch.randn(P, ps, 64, generator=g).to(dt)
    qn = torch.randn(B, H, 512, generator=g).to(dt)
    qp = torch.randn(B, H, 64, generator=g).to(dt)
    lens = torch.full((B,), a.len, dtype=torch.int32)
    indptr = torch.arange(B + 1, dtype=torch.int32) * ppr
    indices = torch.arange(P, dtype=torch.int32)
    ws = torch.empty(16, dtype=torch.uint8)
    ws2 = torch.empty(16, dtype=torch.uint8)
    out = torch.empty(B, H, 512, dtype=dt)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    plan_args = (torch.arange(B + 1, dtype=torch.int32), indptr, indices, lens, H, 512, 64, ps,
                 False, 0.07, dt, dt)
    bt = indices.reshape(B, ppr)
    q4 = torch.cat([qn, qp], -1).reshape(B, 1, H, 576)
    cache = torch.cat([ckv, kpe], -1)
    out4 = out.reshape(B, 1, H, 512)
    # GQA decode (xqa_batch_decode_with_kv_cache): 32 query / 8 KV heads, head dim 128
    Hq, Hk, D, gps = 32, 8, 128, 16
    gppr = (a.len + gps - 1) // gps
    kvc = torch.randn(B * gppr, 2, gps, Hk, D, generator=g).to(dt)
    gq = torch.randn(B, Hq, D, generator=g).to(dt)
    gout = torch.empty(B, Hq, D, dtype=dt)
    gbt = torch.arange(B * gppr, dtype=torch.int32).reshape(B, gppr)
    real = C.lib()
    noop = _NoopLib(real)
    C._lib = noop
    try:
        w.plan(*plan_args)
        w.run(qn, qp, ckv, kpe, out=out)
        st = torch.zeros(1, dtype=torch.int64)
        pst = st.data_ptr()
        floor = timeit(lambda: noop.fi_ref_run(pst, pst), a.calls)
        rows = [
            ("wrapper.run", timeit(lambda: w.run(qn, qp, ckv, kpe, out=out), a.calls)),
            ("wrapper.plan (CPU arrays)", timeit(lambda: w.plan(*plan_args), a.calls)),
            ("trtllm_batch_decode_with_kv_cache_mla", timeit(
                lambda: fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
                    q4, cache, ws, 128, 512, 64, bt, lens, a.len, out=out4, bmm1_scale=0.07),
                a.calls)),
            ("xqa_batch_decode_with_kv_cache", timeit(
                lambda: fiattn.decode.xqa_batch_decode_with_kv_cache(
                    gq, kvc, ws2, gbt, lens, a.len, out=gout, bmm1_scale=0.088), a.calls)),
        ]
    finally:
        C._lib = real
    print(f"Python host overhead per call, CPU tensors, C calls stubbed (no-op call "
          f"{floor:.2f} us subtracted); MLA B {B} x {a.len}, heads {H}; GQA {Hq}/{Hk} heads")
    print(f"{'call':40s} {'us/call':>9s}")
    for n, us in rows:
        print(f"{n:40s} {us - floor:9.2f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--len", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--cpu-overhead", action="store_true",
                    help="time the Python side only, on CPU tensors, C calls stubbed")
    a = ap.parse_args()
    if a.cpu_overhead:
        return cpu_overhead(a)
    dev = "cuda"
    B, H, ps = a.batch, a.heads, 64
    ppr = (a.len + ps - 1) // ps
    P = B * ppr
    ckv = torch.randn(P, ps, 512, device=dev, dtype=torch.bfloat16)
    kpe = torch.randn(P, ps, 64, device=dev, dtype=torch.bfloat16)
    qn = torch.randn(B, H, 512, device=dev, dtype=torch.bfloat16)
    qp = torch.randn(B, H, 64, device=dev, dtype=torch.bfloat16)
    lens = torch.full((B,), a.len, dtype=torch.int32)
    indptr = torch.arange(B + 1, dtype=torch.int32) * ppr
    indices = torch.arange(P, dtype=torch.int32)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    plan_args = (torch.arange(B + 1, dtype=torch.int32), indptr, indices, lens, H, 512, 64, ps,
                 False, 0.07, torch.bfloat16, torch.bfloat16)
    w.plan(*plan_args)
    out = torch.empty(B, H, 512, device=dev, dtype=torch.bfloat16)
    w.run(qn, qp, ckv, kpe, out=out)
    entry = w._entry
    # The C floor: fi_run with the args the wrapper builds, prebuilt once.
    args = C.fi_attn_args()
    from fiattn._common import fill_tensor
    fill_tensor(args.q, qn, list(qn.shape), qn.stride())
    fill_tensor(args.q_rope, qp, list(qp.shape), qp.stride())
    fill_tensor(args.k, ckv, [P, ps, 1, 512], [ps * 512, 512, 512, 1])
    fill_tensor(args.k_rope, kpe, [P, ps, 1, 64], [ps * 64, 64, 64, 1])
    tab = w._planned["table"]
    fill_tensor(args.page_table, tab, [tab.numel()], [1])
    args.page_table.dtype = C.FI_DTYPE_I32
    fill_tensor(args.out, out, list(out.shape), out.stride())
    args.bmm1_scale, args.bmm2_scale, args.enable_pdl = 0.07, 1.0, 1
    lib, stream = C.lib(), torch.cuda.current_stream().cuda_stream
    pa = ctypes.byref(args)

    def c_run():
        lib.fi_run(entry.plan, pa, stream)

    b = C.fi_batch(form=C.FI_FORM_INDPTR, batch_size=B, qo_indptr=plan_args[0].data_ptr(),
                   kv_indptr=indptr.data_ptr(), kv_indices=indices.data_ptr(),
                   kv_len=lens.data_ptr(), causal=0, window_left=-1)
    pb = ctypes.byref(b)

    def c_plan():
        lib.fi_plan_update(entry.plan, pb, stream)

    bt = indices.reshape(B, ppr).to(dev)
    q4 = torch.cat([qn, qp], -1).reshape(B, 1, H, 576)
    cache = torch.cat([ckv, kpe], -1)
    out4 = out.reshape(B, 1, H, 512)
    lens_dev = lens.to(dev)

    def functional(sl):
        return lambda: fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
            q4, cache, ws, 128, 512, 64, bt, sl, a.len, out=out4, bmm1_scale=0.07)

    rows = [("C fi_run", timeit(c_run, a.calls)),
            ("wrapper.run", timeit(lambda: w.run(qn, qp, ckv, kpe, out=out), a.calls)),
            ("C fi_plan_update", timeit(c_plan, a.calls)),
            ("wrapper.plan (CPU arrays)", timeit(lambda: w.plan(*plan_args), a.calls))]
    rows.append(("C fi_plan_update + fi_run", rows[0][1] + rows[2][1]))
    rows.append(("functional, CPU seq_lens", timeit(functional(lens), a.calls)))
    rows.append(("functional, CUDA seq_lens", timeit(functional(lens_dev), a.calls)))
    print(f"MLA decode B {B} x {a.len}, heads {H}, {torch.cuda.get_device_name()}")
    print(f"{'call':32s} {'us/call':>9s}")
    for n, us in rows:
        print(f"{n:32s} {us:9.2f}")
    print(f"python overhead: run {rows[1][1] - rows[0][1]:.2f} us, plan "
          f"{rows[3][1] - rows[2][1]:.2f} us, functional (CPU lens) "
          f"{rows[5][1] - rows[4][1]:.2f} us")
    print("plans created:", E.stats["plans_created"])


if __name__ == "__main__":
    main()
