#!/usr/bin/env python3
"""Host time per call of fiattn's Python layer against the bare C calls and against
FlashInfer's same APIs, plus the CUDA-graph time per call; one markdown table on stdout.

    python3 python/bench_host.py [--batch 64] [--heads 128] [--len 1024] [--calls 300]
                                 [--gqa-heads 32/8] [--flashinfer auto|none]

GPU machine (FIATTN_LIBRARY=build/libfiattn.so, or run from the checkout after make lib).
Shapes: MLA decode B x len, 128 heads, bf16, page 64 (indptr / block-table forms); GQA decode
(xqa_batch_decode_with_kv_cache) B x len, 32 / 8 heads, head_dim 128, bf16, page 64, NHD
single tensor.  Rows:
  C fi_run, C fi_plan_update     ctypes calls with the descriptors fiattn built (the floor)
  fiattn / FlashInfer MLA wrapper plan (CPU index arrays; fiattn also device arrays) and
  run; FlashInfer fa2 and fa3
  fiattn trtllm_batch_decode_with_kv_cache_mla (plan + run; CPU seq_lens, then CUDA)
  fiattn / FlashInfer xqa_batch_decode_with_kv_cache (fiattn: CPU seq_lens, then CUDA)
  (both functional APIs also with CUDA seq_lens under fiattn.device_planning())
Host us: each call timed alone with the GPU drained before it (torch.cuda.synchronize()
outside the timed region), median of --calls.  Draining matters: back-to-back plan + run
calls queue GPU work faster than it drains, and fiattn's double-buffered plan staging (or
a device-to-host copy) then waits for the queue, so a loop would time the kernels.  The
functional calls' block_tables is on the device (never copied: the planner validates the
lengths against a host table of zeros).  "python over C": the row minus the C floor rows
of the calls it makes (run: fi_run; plan: fi_plan_update; functional: both), timed alone;
"python over C timed inside": the call minus its own C calls, each timed where it runs
(the two differ by what the C calls cost in the call's cache and driver state).
CUDA graph us: the call (run only; plans happen before capture) captured once and
replayed, each replay timed by CUDA events, median.
FlashInfer: imported if installed (`--flashinfer none` skips it); each API that fails
(not installed, JIT error, unsupported on this GPU) becomes a "skipped" row with the reason.
FlashInfer's first call JIT-compiles (minutes on a fresh cache; printed below the table).

    python3 python/bench_host.py --cpu-overhead [--batch 64] [--heads 128] [--calls 300]

No GPU needed: the same fiattn calls on CPU tensors with fi_run / fi_ref_run /
fi_plan_update replaced by a Python no-op (its own call cost subtracted): the Python side
alone.  Without torch, or on the GPU path without CUDA, prints one "skip" line, exits 0.
"""
import argparse
import ctypes
import os
import statistics
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--heads", type=int, default=128, help="MLA query heads")
    ap.add_argument("--len", type=int, default=1024, help="KV tokens per request")
    ap.add_argument("--calls", type=int, default=300, help="timed calls (median)")
    ap.add_argument("--gqa-heads", default="32/8", help="GQA query / KV heads")
    ap.add_argument("--flashinfer", choices=("auto", "none"), default="auto")
    ap.add_argument("--cpu-overhead", action="store_true",
                    help="time the Python side only, on CPU tensors, C calls stubbed")
    a = ap.parse_args(argv)
    try:
        hq, hk = (int(x) for x in a.gqa_heads.split("/"))
    except ValueError:
        ap.error(f"--gqa-heads must be Q/KV, e.g. 32/8, got {a.gqa_heads!r}")
    if hq % hk or min(a.batch, a.heads, a.len, a.calls, hq, hk) < 1:
        ap.error("sizes must be positive and the GQA query heads a multiple of the KV heads")
    a.gqa_q, a.gqa_kv = hq, hk
    return a


def fmt(x):
    return "-" if x is None else f"{x:.1f}"


def render_table(rows, title):
    """rows: dicts with api, call, host, over (python over C), inside (python over the C
    calls timed inside the call), graph (us or None), note."""
    out = [f"### {title}", "",
           "| API | call | host us / call | python over C us | python over C timed inside us "
           "| CUDA graph us / call |",
           "|---|---|---:|---:|---:|---:|"]
    for r in rows:
        call = r["call"] + (f" ({r['note']})" if r.get("note") else "")
        out.append(f"| {r['api']} | {call} | {fmt(r.get('host'))} | {fmt(r.get('over'))} | "
                   f"{fmt(r.get('inside'))} | {fmt(r.get('graph'))} |")
    return "\n".join(out)


# ---- timing -----------------------------------------------------------------------------
def host_us(torch, fn, calls, cuda=True, timed=None):
    """Median host time of fn() with the GPU drained before each call; less the C time a
    TimedLib `timed` summed during the call, when given."""
    for _ in range(10):
        fn()
    ts = []
    for _ in range(calls):
        if cuda:
            torch.cuda.synchronize()
        if timed is not None:
            timed.acc = 0.0
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0 - (0.0 if timed is None else timed.acc))
    if cuda:
        torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


class TimedLib:
    """libfiattn with fi_run / fi_ref_run / fi_plan_update timed (perf_counter around each
    call, summed in .acc): the C time inside a fiattn call, against the floor measured
    alone (cache and driver state differ between the two)."""

    HOT = ("fi_run", "fi_ref_run", "fi_plan_update", "fi_plan_update_device")

    def __init__(self, real):
        self._real = real
        self.acc = 0.0
        for n in self.HOT:
            if hasattr(real, n):  # (a test's stand-in library may lack some)
                setattr(self, n, self._timed(getattr(real, n)))

    def _timed(self, f):
        def timed(*args):
            t0 = time.perf_counter()
            try:
                return f(*args)
            finally:
                self.acc += time.perf_counter() - t0
        return timed

    def __getattr__(self, name):
        return getattr(self._real, name)


def python_inside_us(torch, C, fn, calls, cuda=True):
    """Median of (host time of fn() minus the C calls timed inside it), GPU drained before
    each call; the timing wrappers' own cost (well under 1 us) is left in."""
    real = C.lib()
    C._lib = timed = TimedLib(real)
    try:
        return host_us(torch, fn, calls, cuda, timed)
    finally:
        C._lib = real


def graph_us(torch, fn, reps=50):
    """Median device time of one CUDA-graph replay of fn()."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    for _ in range(5):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3


def attempt(rows, api, call, fn, notes):
    """Run fn() -> row fields; a failure becomes a 'skipped' row naming the reason."""
    try:
        rows.append(dict(api=api, call=call, **fn()))
    except Exception as e:  # noqa: BLE001 (any API that cannot run here)
        msg = (str(e).splitlines() or [""])[0][:120]
        rows.append(dict(api=api, call=call, note=f"skipped: {type(e).__name__}: {msg}"))
        notes.append(f"{api} {call}: {type(e).__name__}: {msg}")


# ---- inputs -----------------------------------------------------------------------------
class Inputs:
    """The MLA and GQA problems on `dev` (bf16, page size 64, pages in request order)."""

    def __init__(self, torch, a, dev):
        t = torch
        g = t.Generator().manual_seed(0)
        dt = t.bfloat16
        B, H, L, ps = a.batch, a.heads, a.len, 64
        self.B, self.H, self.L, self.ps = B, H, L, ps
        ppr = (L + ps - 1) // ps
        P = B * ppr
        self.ckv = t.randn(P, ps, 512, generator=g).to(dt).to(dev)
        self.kpe = t.randn(P, ps, 64, generator=g).to(dt).to(dev)
        self.qn = t.randn(B, H, 512, generator=g).to(dt).to(dev)
        self.qp = t.randn(B, H, 64, generator=g).to(dt).to(dev)
        self.out = t.empty(B, H, 512, dtype=dt, device=dev)
        self.lens = t.full((B,), L, dtype=t.int32)
        self.indptr = t.arange(B + 1, dtype=t.int32) * ppr
        self.indices = t.arange(P, dtype=t.int32)
        self.qo = t.arange(B + 1, dtype=t.int32)
        self.plan_args = (self.qo, self.indptr, self.indices, self.lens, H, 512, 64, ps, False,
                          0.07, dt, dt)
        self.bt = self.indices.reshape(B, ppr).to(dev)
        self.q4 = t.cat([self.qn, self.qp], -1).reshape(B, 1, H, 576)
        self.cache = t.cat([self.ckv, self.kpe], -1)
        self.out4 = self.out.reshape(B, 1, H, 512)
        self.lens_dev = self.lens.to(dev)
        Hq, Hk, D = a.gqa_q, a.gqa_kv, 128
        self.gkv = t.randn(P, 2, ps, Hk, D, generator=g).to(dt).to(dev)
        self.gq = t.randn(B, Hq, D, generator=g).to(dt).to(dev)
        self.gout = t.empty(B, Hq, D, dtype=dt, device=dev)
        try:
            self.lens_u32 = self.lens_dev.to(t.uint32)
        except (AttributeError, RuntimeError, TypeError):  # older torch: no uint32
            self.lens_u32 = self.lens_dev
        self.gqa_scale = D ** -0.5


# ---- the GPU run ------------------------------------------------------------------------
def fiattn_rows(torch, fiattn, C, E, x, ws, ws_g, calls, rows):
    lib = C.lib()
    stream = torch.cuda.current_stream().cuda_stream
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    w.plan(*x.plan_args)
    w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out)
    args = w._run_memo[next(iter(w._run_memo))][0]  # the fi_attn_args run() reuses
    pa, pb = ctypes.byref(args), ctypes.byref(w._batch)
    c_run = host_us(torch, lambda: lib.fi_run(w._entry.plan, pa, stream), calls)
    c_plan = host_us(torch, lambda: lib.fi_plan_update(w._entry.plan, pb, stream), calls)
    rows.append(dict(api="C", call="fi_run (MLA, prebuilt args)", host=c_run))
    rows.append(dict(api="C", call="fi_plan_update (MLA, indptr form)", host=c_plan))
    run = host_us(torch, lambda: w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out), calls)
    plan = host_us(torch, lambda: w.plan(*x.plan_args), calls)
    gr = graph_us(torch, lambda: w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out))
    rows.append(dict(api="fiattn", call="BatchMLAPagedAttentionWrapper.plan (CPU arrays)",
                     host=plan, over=plan - c_plan,
                     inside=python_inside_us(torch, C, lambda: w.plan(*x.plan_args), calls)))
    rows.append(dict(api="fiattn", call="BatchMLAPagedAttentionWrapper.run", host=run,
                     over=run - c_run, graph=gr, inside=python_inside_us(
                         torch, C, lambda: w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out), calls)))
    # FlashInfer's usual form: the index arrays on the device (each copied to the host
    # synchronously); then back to the CPU arrays' plan
    dargs = tuple(a.to(x.qn.device) if isinstance(a, torch.Tensor) else a for a in x.plan_args)
    w.plan(*dargs)
    plan_dev = host_us(torch, lambda: w.plan(*dargs), calls)
    rows.append(dict(api="fiattn", call="BatchMLAPagedAttentionWrapper.plan (device arrays)",
                     host=plan_dev, over=plan_dev - c_plan,
                     inside=python_inside_us(torch, C, lambda: w.plan(*dargs), calls)))
    w.plan(*x.plan_args)

    def functional(sl, ws_):
        return lambda: fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
            x.q4, x.cache, ws_, 128, 512, 64, x.bt, sl, x.L, out=x.out4, bmm1_scale=0.07)
    fiattn_functional(torch, C, E, lib, stream, ws, functional(x.lens, ws),
                      functional(x.lens_dev, ws), "trtllm_batch_decode_with_kv_cache_mla",
                      calls, rows)

    def gqa(sl):
        return lambda: fiattn.decode.xqa_batch_decode_with_kv_cache(
            x.gq, x.gkv, ws_g, x.bt, sl, x.L, bmm1_scale=x.gqa_scale, out=x.gout)
    fiattn_functional(torch, C, E, lib, stream, ws_g, gqa(x.lens), gqa(x.lens_dev),
                      "xqa_batch_decode_with_kv_cache", calls, rows)


def fiattn_functional(torch, C, E, lib, stream, ws, call_host_lens, call_dev_lens, name, calls,
                      rows):
    """Rows for a functional API: C floor (its recorded plan + run), host time with CPU and
    CUDA seq_lens, graph time."""
    E.release_workspace(ws)  # a plan of its own (not the wrapper's, which shares ws)
    call_host_lens()
    entry = E.cached_entry(ws)
    fast = next(iter(entry.memo.values()))  # the recorded call: its fi_batch and args
    pb, pa = ctypes.byref(fast.batch), ctypes.byref(fast.args)
    c_both = host_us(torch, lambda: (lib.fi_plan_update(entry.plan, pb, stream),
                                     lib.fi_run(entry.plan, pa, stream)), calls)
    rows.append(dict(api="C", call=f"fi_plan_update + fi_run ({name}'s descriptors)",
                     host=c_both))
    h = host_us(torch, call_host_lens, calls)
    gr = graph_us(torch, call_host_lens)
    rows.append(dict(api="fiattn", call=f"{name}, CPU seq_lens", host=h, over=h - c_both,
                     graph=gr, inside=python_inside_us(torch, C, call_host_lens, calls)))
    h = host_us(torch, call_dev_lens, calls)
    rows.append(dict(api="fiattn", call=f"{name}, CUDA seq_lens", host=h, over=h - c_both,
                     note="one more D2H copy",
                     inside=python_inside_us(torch, C, call_dev_lens, calls)))
    import fiattn
    with fiattn.device_planning():  # planned on the GPU: no copy, no sync
        call_dev_lens()  # records the call (its own plan: the parallel partition row)
        h = host_us(torch, call_dev_lens, calls)
        rows.append(dict(api="fiattn", call=f"{name}, CUDA seq_lens, device_planning()",
                         host=h, over=h - c_both, note="fi_plan_update_device + fi_run",
                         inside=python_inside_us(torch, C, call_dev_lens, calls)))


def flashinfer_rows(torch, x, dev, calls, rows, notes):
    try:
        import flashinfer  # noqa: F401
        import flashinfer.decode
        import flashinfer.mla
    except Exception as e:  # noqa: BLE001
        rows.append(dict(api="FlashInfer", call="all", note=f"skipped: import failed: "
                         f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:100]}"))
        return
    notes.append(f"FlashInfer {getattr(flashinfer, '__version__', '?')}")
    warnings.simplefilter("ignore")  # the legacy positional plan() form warns per call
    for backend in ("fa2", "fa3"):
        def mla(backend=backend):
            ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
            w = flashinfer.mla.BatchMLAPagedAttentionWrapper(ws, backend=backend)
            dargs = tuple(a.to(dev) if isinstance(a, torch.Tensor) and a.dtype == torch.int32
                          else a for a in x.plan_args)
            t0 = time.perf_counter()
            w.plan(*dargs)
            w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out)
            torch.cuda.synchronize()
            notes.append(f"FlashInfer MLA {backend}: first plan + run (JIT or load) "
                         f"{time.perf_counter() - t0:.1f} s")
            plan = host_us(torch, lambda: w.plan(*dargs), calls)
            run = host_us(torch, lambda: w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out), calls)
            rows.append(dict(api=f"FlashInfer {backend}",
                             call="BatchMLAPagedAttentionWrapper.plan (device arrays)",
                             host=plan))
            gr = None
            try:  # a use_cuda_graph wrapper with its preallocated index buffers
                bufs = [a.clone() for a in dargs[:4]]
                wg = flashinfer.mla.BatchMLAPagedAttentionWrapper(
                    torch.empty(128 << 20, dtype=torch.uint8, device=dev), True, *bufs,
                    backend=backend)
                wg.plan(*dargs)
                gr = graph_us(torch, lambda: wg.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out))
            except Exception as e:  # noqa: BLE001
                notes.append(f"FlashInfer MLA {backend}: CUDA graph not measured: "
                             f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}")
                torch.cuda.synchronize()
            return dict(host=run, graph=gr)
        attempt(rows, f"FlashInfer {backend}", "BatchMLAPagedAttentionWrapper.run", mla, notes)

    def xqa():
        ws = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)  # zeroed before first use

        def call():
            flashinfer.decode.xqa_batch_decode_with_kv_cache(
                x.gq, x.gkv, ws, x.bt, x.lens_u32, x.L, bmm1_scale=x.gqa_scale, out=x.gout)
        t0 = time.perf_counter()
        call()
        torch.cuda.synchronize()
        notes.append(f"FlashInfer xqa: first call (JIT or load) {time.perf_counter() - t0:.1f} s")
        return dict(host=host_us(torch, call, calls), graph=graph_us(torch, call))
    attempt(rows, "FlashInfer", "xqa_batch_decode_with_kv_cache", xqa, notes)


def gpu_main(a, torch):
    import fiattn
    from fiattn import _capi as C
    from fiattn import _engine as E
    dev = torch.device("cuda")
    x = Inputs(torch, a, dev)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    ws_g = torch.empty(128 << 20, dtype=torch.uint8, device=dev)
    rows, notes = [], []
    rc = 0
    try:
        fiattn_rows(torch, fiattn, C, E, x, ws, ws_g, a.calls, rows)
    except Exception as e:  # noqa: BLE001 (print what was measured, then fail)
        import traceback
        traceback.print_exc()
        rows.append(dict(api="fiattn", call="(remaining rows)", note=f"failed: "
                         f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:120]}"))
        rc = 1
        torch.cuda.synchronize()
    if a.flashinfer == "auto":
        flashinfer_rows(torch, x, dev, a.calls, rows, notes)
    gpu = torch.cuda.get_device_name()
    print(render_table(rows, f"Python host time per call, {gpu}, MLA B {a.batch} x {a.len} "
                             f"heads {a.heads}, GQA {a.gqa_q}/{a.gqa_kv} heads D 128, bf16, "
                             f"page 64"))
    print()
    print(f"- host: median of {a.calls} calls, GPU drained before each; CUDA graph: median "
          f"of 50 replays (CUDA events).  fiattn {fiattn.__version__}, torch "
          f"{torch.__version__}, plans created {E.stats['plans_created']}.")
    for n in notes:
        print(f"- {n}")
    return rc


# ---- --cpu-overhead ---------------------------------------------------------------------
class NoopLib:
    """libfiattn with its per-call entry points replaced by no-ops."""

    HOT = ("fi_run", "fi_ref_run", "fi_plan_update", "fi_plan_update_device")

    def __init__(self, real):
        self._real = real
        self.calls = 0

        def noop(*_):
            self.calls += 1
            return 0
        for n in self.HOT:
            setattr(self, n, noop)

    def __getattr__(self, name):
        return getattr(self._real, name)


def cpu_overhead(a, torch):
    import fiattn
    from fiattn import _capi as C
    x = Inputs(torch, a, torch.device("cpu"))
    ws, ws_g = torch.empty(16, dtype=torch.uint8), torch.empty(16, dtype=torch.uint8)
    ws_x = torch.empty(16, dtype=torch.uint8)
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    real = C.lib()
    noop = NoopLib(real)
    C._lib = noop
    sl2 = x.lens.reshape(x.B, 1)
    try:
        w.plan(*x.plan_args)
        w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out)
        floor = host_us(torch, lambda: noop.fi_ref_run(0, 0), a.calls, cuda=False)
        calls = [
            ("BatchMLAPagedAttentionWrapper.run",
             lambda: w.run(x.qn, x.qp, x.ckv, x.kpe, out=x.out)),
            ("BatchMLAPagedAttentionWrapper.plan (CPU arrays)", lambda: w.plan(*x.plan_args)),
            ("trtllm_batch_decode_with_kv_cache_mla",
             lambda: fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(
                 x.q4, x.cache, ws, 128, 512, 64, x.bt, x.lens, x.L, out=x.out4,
                 bmm1_scale=0.07)),
            ("xqa_mla", lambda: fiattn.xqa.xqa_mla(
                x.q4, x.cache.reshape(-1, 576), x.cache.reshape(-1, 576), x.bt, sl2, x.out4,
                ws_x, None, 64, q_scale=0.07)),
            ("xqa_batch_decode_with_kv_cache",
             lambda: fiattn.decode.xqa_batch_decode_with_kv_cache(
                 x.gq, x.gkv, ws_g, x.bt, x.lens, x.L, bmm1_scale=x.gqa_scale, out=x.gout)),
        ]
        rows = [dict(api="fiattn", call=n, over=host_us(torch, f, a.calls, cuda=False) - floor)
                for n, f in calls]
    finally:
        C._lib = real
    print(render_table(rows, f"Python-side host time per call, CPU tensors, C calls stubbed "
                             f"(no-op call {floor:.2f} us subtracted), MLA B {a.batch} x "
                             f"{a.len} heads {a.heads}, GQA {a.gqa_q}/{a.gqa_kv}"))
    return 0


def main(argv=None):
    a = parse_args(argv)
    try:
        import torch
    except ImportError as e:
        print(f"skip bench_host: torch is not importable ({e})")
        return 0
    if a.cpu_overhead:
        return cpu_overhead(a, torch)
    if not torch.cuda.is_available():
        print("skip bench_host: no CUDA device (--cpu-overhead times the Python side alone)")
        return 0
    return gpu_main(a, torch)


if __name__ == "__main__":
    sys.exit(main())
