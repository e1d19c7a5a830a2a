"""bench/bench_common.py - what the Python benches share (as bench_common.h for the C ones):
CUDA-graph timing (single replays timed by CUDA events, median, back to back or with L2
flushed before each), the bf16 matmul rate of the same run, FlashInfer's JIT cache kept
under $OUT, and request lengths from the bundled trace (docs/DESIGN.md section 10).

Imports nothing heavy: the functions that need torch take the module as an argument, so a
bench prints its "skip" line without torch or a GPU.
"""
import os
import statistics

TRACE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data",
                     "azure_conv_2048.csv")


def flashinfer_cache_under_out():
    """With $OUT set (the GPU machine's result folder), point FlashInfer's JIT, workspace and
    cubin caches under $OUT/flashinfer-cache unless already set, so the modules it compiles
    come back and can be reused.  Call before importing flashinfer."""
    if not os.environ.get("OUT"):
        return
    cache = os.path.join(os.environ["OUT"], "flashinfer-cache")
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", cache)
    os.environ.setdefault("FLASHINFER_JIT_DIR", os.path.join(cache, "jit"))
    os.environ.setdefault("FLASHINFER_CUBIN_DIR", os.path.join(cache, "cubins"))
    os.makedirs(os.environ["FLASHINFER_JIT_DIR"], exist_ok=True)


def torch_with_cuda():
    """The torch module when it imports and sees a CUDA device; otherwise prints
    "skip: <why>" (a bench then exits 0) and returns None."""
    try:
        import torch
        if not torch.cuda.is_available():
            raise ImportError("no CUDA device")
    except ImportError as e:
        print(f"skip: {e}")
        return None
    return torch


# ---- the trace ------------------------------------------------------------------------
def read_trace(path=TRACE):
    """(ContextTokens, GeneratedTokens) of every request of the trace CSV, in row order."""
    ctx, gen = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line or line.startswith("TIMESTAMP"):
                continue
            _, c, g = line.split(",")
            ctx.append(int(c))
            gen.append(int(g))
    return ctx, gen


def trace_decode(n, step, first=0, mtp=1):
    """kv lengths of the decode snapshot of n slots at global step `step`, as viz/trace.c
    fitrace_decode (continuous batching from row `first`, rows wrapping around)."""
    ctx, gen = read_trace()
    rows = len(ctx)
    nxt = [first]

    def admit():
        while True:
            row = nxt[0] % rows
            nxt[0] += 1
            if gen[row] > 0:
                return row

    src = [admit() for _ in range(n)]
    t = [0] * n
    for _ in range(1, step + 1):
        for k in range(n):
            t[k] += 1
            if t[k] >= gen[src[k]]:
                src[k] = admit()
                t[k] = 0
    return [ctx[src[k]] + min(t[k], gen[src[k]]) + (mtp - 1) for k in range(n)]


def trace_prefill(min_tokens, first=0):
    """Prompt lengths (ContextTokens) of consecutive trace rows from `first` until their sum
    reaches min_tokens, the row that crosses it included: a prefill batch of DESIGN.md 10
    with no cached prefix (q_len = kv_len = ContextTokens)."""
    ctx, _ = read_trace()
    lens, row = [], first
    while sum(lens) < min_tokens:
        lens.append(ctx[row % len(ctx)])
        row += 1
    return lens


# ---- timing ---------------------------------------------------------------------------
def capture(torch, fn):
    """fn() run once on a side stream (warm-up: plans, JIT compiles, allocations), then
    captured in a CUDA graph, which is returned."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph


def flush_buffer(torch, dev):
    """A buffer of 4x the device's L2: reading it before a replay evicts its inputs and
    leaves clean lines, as bench/support/l2_flush.h does for the C benches (a write would
    leave dirty lines whose write-back the timed kernel pays)."""
    l2 = getattr(torch.cuda.get_device_properties(dev), "L2_cache_size", 50 << 20)
    return torch.zeros(l2, dtype=torch.int32, device=dev)


def median_replays(torch, graphs, reps, flush):
    """Median seconds of one replay, each timed alone between two CUDA events, graphs
    rotated (input sets at other addresses); flush: None (back to back) or flush_buffer()'s
    buffer, read (summed) before each replay outside the timed span.  Ten untimed replays
    first."""
    stream = torch.cuda.current_stream()
    for w in range(10):
        graphs[w % len(graphs)].replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for i in range(reps):
        if flush is not None:
            flush.sum()
        ev[i][0].record(stream)
        graphs[i % len(graphs)].replay()
        ev[i][1].record(stream)
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) * 1e-3 for a, b in ev)
    return t[reps // 2]


def time_graph(torch, fn, reps, flush):
    """(back-to-back us, L2-flushed us): medians of replays of fn captured in a CUDA graph."""
    graph = capture(torch, fn)
    return tuple(median_replays(torch, [graph], reps, f) * 1e6 for f in (None, flush))


def matmul_tflops(torch, dev, n=8192, reps=20):
    """bf16 dense rate of this run: torch.matmul of two n x n bf16 matrices (2 n^3 FLOPs),
    TFLOP/s of the median of `reps` calls each timed alone by CUDA events."""
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    torch.matmul(x, x)
    ts = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        torch.matmul(x, x)
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e) * 1e-3)
    return 2.0 * n ** 3 / statistics.median(ts) / 1e12
