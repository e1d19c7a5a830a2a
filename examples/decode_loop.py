#!/usr/bin/env python3
"""A captured multi-layer MLA decode loop over the bundled Azure trace excerpt.

    python3 examples/decode_loop.py            # from the repository root, on a GPU machine
    python3 examples/decode_loop.py --batch 64 --layers 8 --steps 50 --heads 16

(needs torch with CUDA and libfiattn: `make lib`, or `pip install ./python`).

The batch is B requests of data/azure_conv_2048.csv (Azure LLM inference trace 2023,
CC-BY, data/README.md): request i starts with kv_len = ContextTokens_i and gains one token
per decode step.  Every layer has its own paged MLA cache (bf16, [pages, 64, 576]) and all
layers share one page table and one workspace, so a step is: one host re-plan
(fiattn.plan_only(), fi_plan_update) and one replay of a CUDA graph holding the attention
of all layers.  Prints the time per step and the tokens/s this attention alone would
allow (B tokens per step), an upper bound for a real model.
"""
import argparse
import csv
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "python"))

import torch  # noqa: E402

import fiattn  # noqa: E402


def load_trace(path):
    with open(path) as f:
        rows = list(csv.DictReader(f))
    return [(int(r["ContextTokens"]), int(r["GeneratedTokens"])) for r in rows]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--heads", type=int, default=128, choices=(16, 32, 64, 128))
    ap.add_argument("--first", type=int, default=0, help="first trace row")
    ap.add_argument("--trace", default=os.path.join(HERE, "..", "data", "azure_conv_2048.csv"))
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("decode_loop.py needs a CUDA GPU")
    dev = "cuda"
    trace = load_trace(a.trace)
    B, L, H, ps = a.batch, a.layers, a.heads, 64
    ctx = [trace[(a.first + i) % len(trace)][0] for i in range(B)]
    max_len = max(ctx) + a.steps
    ppr = (max_len + ps - 1) // ps
    num_pages = B * ppr
    gib = L * num_pages * ps * 576 * 2 / 2 ** 30
    print(f"batch {B}, layers {L}, heads {H}, page_size {ps}; context tokens mean "
          f"{sum(ctx) / B:.0f}, max {max(ctx)}; KV caches {gib:.2f} GiB")
    g = torch.Generator(device=dev).manual_seed(0)
    caches = [torch.randn(num_pages, ps, 576, device=dev, generator=g, dtype=torch.bfloat16)
              for _ in range(L)]
    queries = [torch.randn(B, 1, H, 576, device=dev, generator=g, dtype=torch.bfloat16)
               for _ in range(L)]
    outs = [torch.empty(B, 1, H, 512, device=dev, dtype=torch.bfloat16) for _ in range(L)]
    block_tables = torch.arange(num_pages, dtype=torch.int32, device=dev).reshape(B, ppr)
    seq_lens = torch.tensor(ctx, dtype=torch.int32).pin_memory()  # host: no device sync
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    scale = 1.0 / math.sqrt(192)

    def layer(i):
        fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
            queries[i], caches[i], ws, 128, 512, 64, block_tables, seq_lens, max_len,
            out=outs[i], bmm1_scale=scale)

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(L):
            layer(i)  # plans the workspace, warms up
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(L):
            layer(i)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    plan_us, step_ms = [], []
    for step in range(a.steps):
        seq_lens += 1  # every request decoded one token
        t0 = time.perf_counter()
        with fiattn.plan_only():
            layer(0)  # one host re-plan for all layers (shared page table and workspace)
        plan_us.append((time.perf_counter() - t0) * 1e6)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        step_ms.append(start.elapsed_time(end))
    step_ms.sort()
    med = step_ms[len(step_ms) // 2]
    print(f"{a.steps} steps: attention of {L} layers {med * 1000:.1f} us per step (median; "
          f"{med * 1000 / L:.1f} us per layer), host re-plan {sorted(plan_us)[len(plan_us) // 2]:.1f} us")
    print(f"throughput-equivalent: {B / (med / 1000):.0f} tokens/s "
          f"({B} tokens per step, attention only, {L} layers)")
    ok = all(torch.isfinite(o).all().item() for o in outs)
    print("outputs finite:", ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
