#!/usr/bin/env python3
"""Where the Python layer's host time goes, call by call, on CUDA tensors: the diagnostic
behind bench_host.py's "python over C" column (issue 16's bar is 15 us).

    FIATTN_LIBRARY=build/libfiattn.so python3 python/host_breakdown.py [--calls 300]

Shapes: bench_host.py's defaults (MLA B 64 x 1024, 128 heads; GQA 32/8 heads, D 128;
bf16, page 64).  For each of wrapper.run, wrapper.plan (CPU index arrays), the MLA and the
GQA functional calls (CPU seq_lens), median host us of 300 calls with the GPU drained
before each:
  full          the call as a user makes it
  C stubbed     the per-call C functions replaced by no-ops (bench_host.NoopLib): the
                Python side alone, on CUDA tensors
  slow path     how many calls missed the recorded fast path (must be 0 after warm-up)
Then the GQA fast path's pieces (key build, plan-cache lookup, fast_call with the C
stubbed) and the CPU -> device copy of kv_indices that plan() makes (sliced as plan()
does, pre-sliced, from pinned memory).  Without CUDA: one "skip" line, exit 0.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--calls", type=int, default=300)
    a = ap.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("skip host_breakdown: torch is not importable")
        return 0
    if not torch.cuda.is_available():
        print("skip host_breakdown: no CUDA device")
        return 0
    import bench_host as bh
    from bench_host import NoopLib, host_us
    import fiattn
    from fiattn import _capi as C, _engine as E, decode as D
    from fiattn._common import flat, sig_arg

    x = bh.Inputs(torch, bh.parse_args(["--flashinfer", "none"]), torch.device("cuda"))
    ws = [torch.empty(128 << 20, dtype=torch.uint8, device="cuda") for _ in range(3)]
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws[0])
    w.plan(*x.plan_args)
    calls = {
        "wrapper.run": lambda: w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out),
        "wrapper.plan (CPU arrays)": lambda: w.plan(*x.plan_args),
        "trtllm_batch_decode_with_kv_cache_mla": lambda:
            fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
                x.q4, x.cache, ws[1], 128, 512, 64, x.bt, x.lens, x.L, out=x.out4,
                bmm1_scale=0.07),
        "xqa_batch_decode_with_kv_cache": lambda:
            fiattn.decode.xqa_batch_decode_with_kv_cache(
                x.gq, x.gkv, ws[2], x.bt, x.lens, x.L, bmm1_scale=x.gqa_scale, out=x.gout),
    }
    slow = [0]
    checked = D._checked

    def counted(*args, **kw):
        slow[0] += 1
        return checked(*args, **kw)

    D._checked = counted
    real = C.lib()
    print("| call | full us | C stubbed us | slow path calls |")
    print("|---|---:|---:|---:|")
    for name, fn in calls.items():
        for _ in range(5):
            fn()
        slow[0] = 0
        full = host_us(torch, fn, a.calls)
        C._lib = NoopLib(real)
        try:
            py = host_us(torch, fn, a.calls)
        finally:
            C._lib = real
        print(f"| {name} | {full:.1f} | {py:.1f} | {slow[0]} |")
    D._checked = checked

    sig = E.tensor_sig
    q, kv, bt, sl, out = x.gq, x.gkv, x.bt, x.lens, x.gout

    def key():
        return ("gqa", sig(q), sig_arg(kv, sig), sig(bt), sig(sl), sig(out), None, None,
                None, None, -1, "NHD", None, 1, E._device_planning())

    k = key()
    entry, fast = E.lookup(ws[2], k)
    print(f"\nGQA fast path: recorded call found {fast is not None}")
    print(f"  key build {host_us(torch, key, 2000, cuda=False):.2f} us, lookup "
          f"{host_us(torch, lambda: E.lookup(ws[2], k), 2000, cuda=False):.2f} us")
    if fast is not None:
        ts = (q,) + flat(kv) + (bt, sl, out)
        C._lib = NoopLib(real)
        try:
            us = host_us(torch, lambda: E.fast_call(entry, fast, ts), 2000, cuda=False)
        finally:
            C._lib = real
        print(f"  fast_call with the C stubbed {us:.2f} us")

    kvi, nnz = x.plan_args[2], int(x.plan_args[1][-1])
    buf = torch.empty(2 * nnz, dtype=torch.int32, device="cuda")
    dst, src = buf[:nnz], kvi[:nnz]
    pinned = torch.empty(nnz, dtype=torch.int32, pin_memory=True)
    pinned.copy_(src)
    forms = (("sliced as plan() does", lambda: buf[:nnz].copy_(kvi[:nnz], non_blocking=True)),
             ("pre-sliced", lambda: dst.copy_(src, non_blocking=True)),
             ("from pinned memory", lambda: dst.copy_(pinned, non_blocking=True)))
    print(f"\nplan()'s kv_indices copy ({nnz} int32, CPU -> device, non_blocking):")
    for name, fn in forms:
        print(f"  {name}: {host_us(torch, fn, a.calls):.2f} us")
    return 0


if __name__ == "__main__":
    sys.exit(main())
