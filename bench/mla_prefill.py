#!/usr/bin/env python3
"""bench/mla_prefill.py - MLA incremental (chunked) prefill through the wrapper, H200 figure
of issue 12: one request of Q new tokens over C cached ones (INDPTR form, causal, the query
block aligned to the end of the KV range), heads 128, bf16, page_size 64, absorbed weights
(q_nope 512 + q_pe 64, ckv 512 + kpe 64).

fiattn.BatchMLAPagedAttentionWrapper (the default row: the wgmma body at 128 heads) and, in
the same run when importable, FlashInfer's BatchMLAPagedAttentionWrapper (backend "fa3") on
the same inputs: outputs compared (relative 2-norm over the whole output), each timed as
CUDA-graph replays back to back (median of --reps) and with L2 flushed before each replay
(bench_common.py: ten untimed replays first, each timed replay alone between two events).
TFLOP/s count causal FLOPs once: 2 * H * (576 + 512) * sum over rows of the keys it sees.
The bf16 matmul rate of the same run: torch.matmul 8192^3 bf16, median of 20.
Usage: PYTHONPATH=python FIATTN_LIBRARY=build/libfiattn.so python3 bench/mla_prefill.py
       [--q 4096] [--cached 8192] [--heads 128] [--reps 30]
Prints "| case | ..." rows for BENCHMARKS.md and exits 0 without torch / a GPU ("skip").
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import flush_buffer, matmul_tflops, time_graph, torch_with_cuda  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--q", type=int, default=4096)
    ap.add_argument("--cached", type=int, default=8192)
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--reps", type=int, default=30)
    a = ap.parse_args()
    torch = torch_with_cuda()
    if torch is None:
        return 0
    import fiattn

    dev, dt = "cuda", torch.bfloat16
    H, Q, C, ps = a.heads, a.q, a.cached, 64
    kv = Q + C
    pages = (kv + ps - 1) // ps
    g = torch.Generator(device=dev).manual_seed(1234)
    q_nope = torch.randn(Q, H, 512, device=dev, dtype=dt, generator=g)
    q_pe = torch.randn(Q, H, 64, device=dev, dtype=dt, generator=g)
    cache = torch.randn(pages, ps, 576, device=dev, dtype=dt, generator=g)
    ckv, kpe = cache[..., :512], cache[..., 512:]
    perm = torch.randperm(pages, device=dev, generator=g).to(torch.int32)
    qo_indptr = torch.tensor([0, Q], dtype=torch.int32, device=dev)
    kv_indptr = torch.tensor([0, pages], dtype=torch.int32, device=dev)
    kv_len = torch.tensor([kv], dtype=torch.int32, device=dev)
    scale = 1.0 / (192 ** 0.5)
    flops = 2.0 * H * (576 + 512) * sum(C + i + 1 for i in range(Q))
    case = f"mla_prefill_h{H}_q{Q}_kv{C}"
    flush = flush_buffer(torch, dev)

    def timed(fn):
        """b2b and flushed medians (us) of fn captured in a CUDA graph."""
        return time_graph(torch, fn, a.reps, flush)

    ceiling = matmul_tflops(torch, dev)
    print(f"# {torch.cuda.get_device_name()}: bf16 torch.matmul 8192^3 {ceiling:.1f} TFLOP/s")

    ws = torch.empty(512 * 2 ** 20, dtype=torch.uint8, device=dev)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(qo_indptr, kv_indptr, perm, kv_len, H, 512, 64, ps, True, scale, dt, dt)
    out = torch.empty(Q, H, 512, device=dev, dtype=dt)
    b2b, fl = timed(lambda: w.run(q_nope, q_pe, ckv, kpe, out=out))
    rows = [("fiattn", b2b, fl)]
    ref = None
    try:
        import flashinfer
        fw = flashinfer.mla.BatchMLAPagedAttentionWrapper(
            torch.empty(512 * 2 ** 20, dtype=torch.uint8, device=dev), backend="fa3")
        fw.plan(qo_indptr, kv_indptr, perm, kv_len, H, 512, 64, ps, True, scale, dt, dt)
        ref = torch.empty_like(out)
        fb2b, ffl = timed(lambda: fw.run(q_nope, q_pe, ckv, kpe, out=ref))
        rows.append(("flashinfer fa3", fb2b, ffl))
    except Exception as e:  # noqa: BLE001 - a peer that does not run is reported, not fatal
        print(f"# flashinfer fa3: skip ({type(e).__name__}: {str(e)[:120]})")
    if ref is not None:
        err = (out.float() - ref.float()).norm() / ref.float().norm()
        print(f"# fiattn vs flashinfer fa3: relative 2-norm difference {err.item():.2e}")
    print("| case | impl | b2b us | flush us | TFLOP/s (b2b) | % bf16 matmul |")
    print("|---|---|---:|---:|---:|---:|")
    for name, t, tf in rows:
        tfl = flops / t / 1e6
        print(f"| {case} | {name} | {t:.1f} | {tf:.1f} | {tfl:.1f} | {100 * tfl / ceiling:.1f}% |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
