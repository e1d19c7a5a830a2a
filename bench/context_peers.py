#!/usr/bin/env python3
"""bench/context_peers.py - context (prefill) attention, issue 14's cases: fiattn's
trtllm_batch_context_with_kv_cache beside torch SDPA and FlashInfer's fa3 paged prefill,
on the same GPU, inputs and run.

Cases (BENCHMARKS.md ids; bf16, head_dim 128, page_size 64, causal with each request's
query block aligned to the end of its KV range, no cached prefix unless said):
  context_8k_causal_h32_d128     1 request, 8192 new tokens, 32 / 32 heads
  context_8k_causal_h32x8_d128   the same, 32 / 8 heads
  context_trace16k               the prefill batch of the bundled trace (DESIGN.md 10):
                                 consecutive rows from row 0 until >= 16000 tokens (24
                                 requests, 16391 tokens, q_len = kv_len = ContextTokens),
                                 32 / 8 heads
  mixed_4k_chunk_127_decodes     one 4096-token chunk (over --chunk-prefix cached tokens,
                                 default 0) + 127 decodes (q_len 1) of the trace's decode
                                 snapshot (127 slots from row 1, step 100), 32 / 8 heads
Peers (each captured in a CUDA graph after its planning / warm-up call):
  fiattn                  trtllm_batch_context_with_kv_cache, one launch (CPU length arrays)
  fiattn 2 launches       mixed only: the chunk through the context API, then the decodes
                          through xqa_batch_decode_with_kv_cache (the work as two launches)
  torch sdpa              F.scaled_dot_product_attention (default backend) on dense K / V
                          gathered from the pages before timing; is_causal=True (exact:
                          q_len = kv_len).  GQA as the row says: enable_gqa=True, or K / V
                          repeat_interleave'd to 32 heads before timing.  Trace batch:
                          "padded" (one call, [24, H, 4085, D], padding at the end, which
                          causal masking keeps out of real rows) and "per-request" (24 calls).
                          Mixed: the chunk (is_causal; with a prefix, a bottom-right boolean
                          mask), then the decodes padded in one call with a key mask, each
                          KV head's query heads as its query rows (exact GQA for q_len 1).
  flashinfer fa3          BatchPrefillWithPagedKVCacheWrapper(backend="fa3"), causal, the
                          same paged cache and page lists; skipped when `import flashinfer`
                          fails (0.7.2 on the GPU machine JIT-compiles on first use).
Timing (bench_common.py): per peer, the graph replayed alone between two CUDA events, ten
untimed replays first, median of --reps; b2b = back to back, flushed = a read of 4x L2
before each replay.  TFLOP/s: causal FLOPs counted once, 4 * head_dim * (query, key) pairs
a query head sees, summed over query heads (QK^T and PV, 2 FLOPs a multiply-add), the same
count for every peer (padding not counted).  "of matmul": that rate over the bf16
torch.matmul 8192^3 rate measured in the same run.  Max abs diff: over the batch's rows,
against fiattn's output.  Correctness before timing: fiattn against an fp32 SDPA reference
per request (relative 2-norm error <= 1e-2, else the case is marked and the exit status 1).
Usage (repository root, GPU machine):
  PYTHONPATH=python FIATTN_LIBRARY=build/libfiattn.so python3 bench/context_peers.py
      [--case SUBSTR] [--reps 30] [--chunk-prefix 0] [--no-flashinfer]
Prints "skip: ..." and exits 0 without torch or a GPU.
"""
import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from bench_common import (flashinfer_cache_under_out, flush_buffer, matmul_tflops,  # noqa: E402
                          time_graph, torch_with_cuda, trace_decode, trace_prefill)

flashinfer_cache_under_out()

D, PS, TOL = 128, 64, 1e-2


def case_lengths(name, chunk_prefix):
    """(q_lens, kv_lens, H_q, H_kv) of a case."""
    if name == "context_8k_causal_h32_d128":
        return [8192], [8192], 32, 32
    if name == "context_8k_causal_h32x8_d128":
        return [8192], [8192], 32, 8
    if name == "context_trace16k":
        lens = trace_prefill(16000)
        return lens, list(lens), 32, 8
    dec = trace_decode(127, 100, first=1)
    return [4096] + [1] * 127, [4096 + chunk_prefix] + dec, 32, 8


CASES = ("context_8k_causal_h32_d128", "context_8k_causal_h32x8_d128", "context_trace16k",
         "mixed_4k_chunk_127_decodes")


def causal_pairs(q_lens, kv_lens):
    """(query, key) pairs one query head sees: row i of a request at kv - q + i sees
    kv - q + i + 1 keys."""
    return sum(q * (k - q) + q * (q + 1) // 2 for q, k in zip(q_lens, kv_lens))


class Batch:
    """A case's inputs: q [T, H, D]; a paged NHD cache [pages, 2, page_size, H_kv, D] (K at
    [:, 0], V at [:, 1]) with each request's pages drawn from one shuffled permutation;
    block_tables [B, P] (device), the FlashInfer page lists, and CPU length arrays.
    Uniform [-1, 1) bf16 data."""

    def __init__(self, torch, dev, q_lens, kv_lens, H, Hkv, gen):
        self.q_lens, self.kv_lens, self.H, self.Hkv = q_lens, kv_lens, H, Hkv
        self.B, self.T = len(q_lens), sum(q_lens)
        npg = [(k + PS - 1) // PS for k in kv_lens]
        num_pages = sum(npg)
        perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
        self.rows, bt, off = [], torch.zeros(self.B, max(npg), dtype=torch.int32), 0
        for b, n in enumerate(npg):
            self.rows.append(perm[off:off + n])
            bt[b, :n] = perm[off:off + n]
            off += n
        self.block_tables = bt.to(dev)
        self.kv_indices = perm.to(dev)  # rows concatenated in request order
        i32 = dict(dtype=torch.int32)
        self.kv_indptr = torch.tensor([0] + npg, **i32).cumsum(0).to(torch.int32).to(dev)
        self.last_page_len = torch.tensor([k - (n - 1) * PS for k, n in zip(kv_lens, npg)],
                                          **i32).to(dev)
        self.cq = torch.tensor([0] + q_lens, **i32).cumsum(0).to(torch.int32)
        self.ck = torch.tensor([0] + kv_lens, **i32).cumsum(0).to(torch.int32)
        self.sl = torch.tensor(kv_lens, **i32)
        self.qo_indptr = self.cq.to(dev)
        dg = torch.Generator(device=dev)
        dg.manual_seed(int(torch.randint(0, 1 << 30, (1,), generator=gen)))

        def uniform(*shape):
            return (torch.rand(*shape, generator=dg, device=dev) * 2 - 1).to(torch.bfloat16)
        self.q = uniform(self.T, H, D)
        self.kv = torch.empty(num_pages, 2, PS, Hkv, D, dtype=torch.bfloat16, device=dev)
        for p0 in range(0, num_pages, 1024):  # in slices: no fp32 copy of the whole cache
            p1 = min(num_pages, p0 + 1024)
            self.kv[p0:p1] = uniform(p1 - p0, 2, PS, Hkv, D)
        self.q_off = [int(x) for x in self.cq[:-1]]

    def dense_kv(self, b):
        """Request b's K, V as [H_kv, kv_len, D] (contiguous copies)."""
        pages = self.kv[self.rows[b].to(self.kv.device).long()]  # [n, 2, PS, H_kv, D]
        kv = pages.transpose(0, 1).reshape(2, -1, self.Hkv, D)[:, :self.kv_lens[b]]
        return kv[0].transpose(0, 1).contiguous(), kv[1].transpose(0, 1).contiguous()

    def dense_q(self, b):
        """Request b's query as [H, q_len, D] (contiguous)."""
        o = self.q_off[b]
        return self.q[o:o + self.q_lens[b]].transpose(0, 1).contiguous()


def sdpa_gqa_modes(torch, dev, H, Hkv):
    """How the SDPA rows do GQA: [None] without GQA; else ["enable_gqa", "repeat_interleave"]
    where this torch takes enable_gqa, else ["repeat_interleave"]."""
    if H == Hkv:
        return [None]
    F = torch.nn.functional
    x = torch.zeros(1, 2, 4, 64, device=dev, dtype=torch.bfloat16)
    try:
        F.scaled_dot_product_attention(x, x[:, :1], x[:, :1], enable_gqa=True)
        return ["enable_gqa", "repeat_interleave"]
    except (TypeError, RuntimeError):
        return ["repeat_interleave"]


def sdpa(torch, q, k, v, scale, mode, is_causal=False, mask=None):
    """SDPA of [.., H, L, D] q over [.., H_kv, S, D] k / v with the GQA mode (K / V already
    expanded by the caller for repeat_interleave)."""
    F = torch.nn.functional
    kw = dict(enable_gqa=True) if mode == "enable_gqa" else {}
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal,
                                          scale=scale, **kw)


def bottom_right_mask(torch, q_len, kv_len, dev):
    """[q_len, kv_len] bool, row i sees keys 0 .. kv_len - q_len + i."""
    i = torch.arange(q_len, device=dev)[:, None]
    j = torch.arange(kv_len, device=dev)[None, :]
    return j <= i + (kv_len - q_len)


def reference(torch, bt, scale):
    """fp32 SDPA per request ([T, H, D] fp32): the correctness gate of fiattn's output."""
    out = torch.empty(bt.T, bt.H, D, dtype=torch.float32, device=bt.q.device)
    g = bt.H // bt.Hkv
    for b in range(bt.B):
        ql, kl = bt.q_lens[b], bt.kv_lens[b]
        if ql == 0:
            continue
        k, v = (x.float().repeat_interleave(g, 0)[None] for x in bt.dense_kv(b))
        q = bt.dense_q(b).float()[None]
        mask = None if ql == kl else bottom_right_mask(torch, ql, kl, q.device)
        o = sdpa(torch, q, k, v, scale, None, is_causal=(ql == kl and ql > 1), mask=mask)
        out[bt.q_off[b]:bt.q_off[b] + ql] = o[0].transpose(0, 1)
    return out


class Peer:
    """A timed peer: fn() (graph-capturable, launches the work), result() -> [T, H, D]."""

    def __init__(self, name, fn, result):
        self.name, self.fn, self.result = name, fn, result


def fiattn_peers(torch, fiattn, bt, scale, mixed):
    dev = bt.q.device
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    out = torch.empty_like(bt.q)
    ctx = fiattn.prefill.trtllm_batch_context_with_kv_cache

    def one():
        ctx(bt.q, bt.kv, ws, bt.block_tables, bt.sl, max(bt.q_lens), max(bt.kv_lens), scale,
            1.0, bt.B, bt.cq, bt.ck, out=out, kv_layout="NHD")
    peers = [Peer("fiattn", one, lambda: out)]
    if mixed:  # request 0 the chunk, 1.. the decodes
        ws1 = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        ws2 = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        out2 = torch.empty_like(bt.q)
        q0, kl0 = bt.q_lens[0], bt.kv_lens[0]
        bt0, bt1 = bt.block_tables[:1], bt.block_tables[1:]
        sl0, sl1 = bt.sl[:1], bt.sl[1:]
        cq0 = torch.tensor([0, q0], dtype=torch.int32)
        ck0 = torch.tensor([0, kl0], dtype=torch.int32)

        def two():
            ctx(bt.q[:q0], bt.kv, ws1, bt0, sl0, q0, kl0, scale, 1.0, 1, cq0, ck0,
                out=out2[:q0], kv_layout="NHD")
            fiattn.decode.xqa_batch_decode_with_kv_cache(
                bt.q[q0:], bt.kv, ws2, bt1, sl1, max(bt.kv_lens[1:]), bmm1_scale=scale,
                out=out2[q0:], kv_layout="NHD")
        peers.append(Peer("fiattn 2 launches (context + xqa decode)", two, lambda: out2))
    return peers


def sdpa_peers(torch, bt, scale, case):
    """The SDPA rows of a case (dense inputs built here, before timing)."""
    dev, H, Hkv = bt.q.device, bt.H, bt.Hkv
    g = H // Hkv
    modes = sdpa_gqa_modes(torch, dev, H, Hkv)
    peers = []

    def kv_for(b, mode):
        k, v = bt.dense_kv(b)
        if mode == "repeat_interleave":
            k, v = k.repeat_interleave(g, 0), v.repeat_interleave(g, 0)
        return k[None], v[None]

    def label(base, mode):
        return base if mode is None else f"{base} ({mode})"

    if case.startswith("context_8k"):
        for mode in modes:
            q = bt.dense_q(0)[None]
            k, v = kv_for(0, mode)
            res = {}

            def fn(q=q, k=k, v=v, mode=mode, res=res):
                res["o"] = sdpa(torch, q, k, v, scale, mode, is_causal=True)
            peers.append(Peer(label("torch sdpa", mode), fn,
                              lambda res=res: res["o"][0].transpose(0, 1)))
        return peers
    if case == "context_trace16k":
        mode = modes[0]
        L = max(bt.q_lens)
        qp = torch.zeros(bt.B, H, L, D, dtype=torch.bfloat16, device=dev)
        kh = H if mode == "repeat_interleave" else Hkv
        kp = torch.zeros(bt.B, kh, L, D, dtype=torch.bfloat16, device=dev)
        vp = torch.zeros_like(kp)
        per = []
        for b in range(bt.B):
            n = bt.q_lens[b]
            k, v = kv_for(b, mode)
            qp[b, :, :n], kp[b, :, :n], vp[b, :, :n] = bt.dense_q(b), k[0], v[0]
            per.append((bt.dense_q(b)[None], k, v))
        res = {}

        def padded():
            res["p"] = sdpa(torch, qp, kp, vp, scale, mode, is_causal=True)

        def unpad_padded():
            return torch.cat([res["p"][b, :, :n].transpose(0, 1)
                              for b, n in enumerate(bt.q_lens)])

        def per_request():
            res["r"] = [sdpa(torch, q, k, v, scale, mode, is_causal=True) for q, k, v in per]

        def unpad_per():
            return torch.cat([o[0].transpose(0, 1) for o in res["r"]])
        peers.append(Peer(label("torch sdpa padded", mode), padded, unpad_padded))
        peers.append(Peer(label("torch sdpa per-request", mode), per_request, unpad_per))
        return peers
    # mixed: the chunk, then the decodes padded with a key mask (query heads as rows)
    mode = modes[0]
    q0 = bt.dense_q(0)[None]
    k0, v0 = kv_for(0, mode)
    ql0, kl0 = bt.q_lens[0], bt.kv_lens[0]
    mask0 = None if ql0 == kl0 else bottom_right_mask(torch, ql0, kl0, dev)
    nd = bt.B - 1
    L = max(bt.kv_lens[1:])
    qd = bt.q[ql0:].reshape(nd, Hkv, g, D)  # head h = kv head h // g, row h % g
    kd = torch.zeros(nd, Hkv, L, D, dtype=torch.bfloat16, device=dev)
    vd = torch.zeros_like(kd)
    for b in range(1, bt.B):
        k, v = bt.dense_kv(b)
        kd[b - 1, :, :bt.kv_lens[b]], vd[b - 1, :, :bt.kv_lens[b]] = k, v
    lens = torch.tensor(bt.kv_lens[1:], device=dev)
    maskd = (torch.arange(L, device=dev)[None, :] < lens[:, None])[:, None, None, :]
    res = {}

    def mixed():
        res["c"] = sdpa(torch, q0, k0, v0, scale, mode, is_causal=mask0 is None, mask=mask0)
        res["d"] = sdpa(torch, qd, kd, vd, scale, None, mask=maskd)

    def unpad():
        return torch.cat([res["c"][0].transpose(0, 1), res["d"].reshape(nd, H, D)])
    peers.append(Peer(label("torch sdpa chunk + padded decodes", mode), mixed, unpad))
    return peers


def flashinfer_peer(torch, flashinfer, bt, scale):
    dev = bt.q.device
    w = flashinfer.BatchPrefillWithPagedKVCacheWrapper(
        torch.zeros(256 << 20, dtype=torch.uint8, device=dev), "NHD", backend="fa3")
    w.plan(bt.qo_indptr, bt.kv_indptr, bt.kv_indices, bt.last_page_len, bt.H, bt.Hkv, D, PS,
           causal=True, sm_scale=scale, q_data_type=torch.bfloat16,
           kv_data_type=torch.bfloat16)
    out = torch.empty_like(bt.q)
    return Peer("flashinfer fa3", lambda: w.run(bt.q, bt.kv, out=out), lambda: out)


def run_case(torch, fiattn, flashinfer, dev, case, a, gen, flush, mm, rows):
    """Builds the case, checks fiattn, times every peer; appends table rows; returns 0 / 1."""
    q_lens, kv_lens, H, Hkv = case_lengths(case, a.chunk_prefix)
    bt = Batch(torch, dev, q_lens, kv_lens, H, Hkv, gen)
    scale = D ** -0.5
    flops = 4.0 * D * H * causal_pairs(q_lens, kv_lens)
    print(f"# {case}: {bt.B} requests, {bt.T} query tokens, {sum(kv_lens)} KV tokens, "
          f"heads {H}/{Hkv}, {flops / 1e12:.3f} TFLOP")
    mixed = case.startswith("mixed")
    peers = fiattn_peers(torch, fiattn, bt, scale, mixed)
    base = peers[0]
    base.fn()
    torch.cuda.synchronize()
    ref = reference(torch, bt, scale)
    err = float((base.result().float() - ref).norm() / ref.norm())
    bad = not err <= TOL
    print(f"# {case}: fiattn vs fp32 SDPA reference: relative 2-norm error {err:.2e}"
          + ("  FAIL" if bad else ""))
    del ref
    try:
        peers += sdpa_peers(torch, bt, scale, case)
    except Exception as e:  # noqa: BLE001 - a peer that does not run is reported
        print(f"# {case}: torch sdpa: skip ({type(e).__name__}: {str(e)[:160]})")
    if flashinfer is not None:
        try:
            t0 = time.time()
            peers.append(flashinfer_peer(torch, flashinfer, bt, scale))
            print(f"# {case}: flashinfer fa3 plan {time.time() - t0:.1f} s (JIT included)")
        except Exception as e:  # noqa: BLE001
            print(f"# {case}: flashinfer fa3: skip ({type(e).__name__}: {str(e)[:160]})")
    want = None
    for p in peers:
        try:
            b2b, fl = time_graph(torch, p.fn, a.reps, flush)
            torch.cuda.synchronize()
            got = p.result()[:bt.T].float()
        except Exception as e:  # noqa: BLE001
            print(f"# {case}: {p.name}: skip ({type(e).__name__}: {str(e)[:160]})")
            torch.cuda.synchronize()
            continue
        if want is None:
            want = got.clone()
        diff = float((got - want).abs().max())
        tf = flops / (b2b * 1e-6) / 1e12
        name = p.name + (" (FAILED the check)" if bad and p is base else "")
        rows.append(f"| {case} | {name} | {b2b:.1f} | {fl:.1f} | {tf:.1f} | {tf / mm:.2f} | "
                    f"{diff:.2e} |")
        sys.stdout.flush()
    del peers, bt
    torch.cuda.empty_cache()
    return int(bad)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default=None, help="run the cases whose id contains this")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--chunk-prefix", type=int, default=0,
                    help="mixed case: cached tokens before the 4096-token chunk")
    ap.add_argument("--no-flashinfer", action="store_true")
    a = ap.parse_args()
    torch = torch_with_cuda()
    if torch is None:
        return 0
    sys.path.insert(0, os.path.join(HERE, "..", "python"))  # the checkout's package
    import fiattn
    flashinfer = None
    if not a.no_flashinfer:
        try:
            import flashinfer
        except Exception as e:  # noqa: BLE001
            print(f"# flashinfer: skip (import failed: {type(e).__name__}: {str(e)[:120]})")
    dev = torch.device("cuda")
    gen = torch.Generator().manual_seed(int(os.environ.get("FI_TEST_SEED", "1234")) & 0x7FFFFFFF)
    mm = matmul_tflops(torch, dev)
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, fiattn "
          f"{fiattn.__version__} ({fiattn.library_path()}), flashinfer "
          f"{getattr(flashinfer, '__version__', '-')}")
    print(f"# bf16 torch.matmul 8192^3: {mm:.1f} TFLOP/s (median of 20)")
    flush = flush_buffer(torch, dev)
    rows, failed = [], 0
    for case in CASES:
        if a.case and a.case not in case:
            continue
        failed |= run_case(torch, fiattn, flashinfer, dev, case, a, gen, flush, mm, rows)
    print("| case | peer | us b2b | us flushed | TFLOP/s (b2b) | of matmul | "
          "max abs diff vs fiattn |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for r in rows:
        print(r)
    return failed


if __name__ == "__main__":
    sys.exit(main())
