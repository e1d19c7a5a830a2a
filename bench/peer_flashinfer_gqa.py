#!/usr/bin/env python3
"""bench/peer_flashinfer_gqa.py - the peer of bench/bench_gqa.c: the same GQA decode shapes
through FlashInfer 0.7.2 on the GPU machine, timed the same way, so both land in one run.

APIs (each shape on each API that runs it; a refusal prints one "skip" line):
  xqa        flashinfer.decode.xqa_batch_decode_with_kv_cache (NHD single kv_cache tensor
             [pages, 2, page_size, H_kv, D], block_tables, seq_lens)
  tc_decode  flashinfer.BatchDecodeWithPagedKVCacheWrapper(use_tensor_cores=True,
             use_cuda_graph=True), planned once outside the graph (indptr / indices /
             last_page_len of the same block tables)
Shapes: those of bench_gqa (case ids identical); the trace case rebuilds the decode
snapshot of bench_gqa (viz/trace.c fitrace_decode: 128 slots from row 0, step 100,
continuous batching over data/azure_conv_2048.csv).  NVFP4 KV: skipped (FlashInfer has no
NVFP4 KV on Hopper).  Page ids shuffled (seeded), bf16 q and out, random inputs.
Timing: the call captured in a CUDA graph per input set (up to 4 sets of q, KV, out rotated
so replays do not reuse L2); each replay timed alone between two CUDA events, median of
--reps: b2b (back to back) and flush (a read of 4x the L2 size before each replay,
outside the timing).  GB/s counts the KV of the tokens read once (K and V) + q + out, as
bench_gqa.
Output: "peer <case> <api> <mode> us <x> GBps <x>" lines on stdout; comments start with #.
JIT: FlashInfer compiles its kernels on first use.  If $OUT is set, FLASHINFER_JIT_DIR /
FLASHINFER_WORKSPACE_BASE / FLASHINFER_CUBIN_DIR (unless already set) point under
$OUT/flashinfer-cache so the built modules can be kept and reused; the time the first call
of each (case, api) took (JIT included) is printed.
Usage: python3 bench/peer_flashinfer_gqa.py [--case SUBSTR] [--reps N] [--sets N] [--api xqa|tc_decode]
Without `import flashinfer` (or torch / a GPU) it prints one "skip" line and exits 0.
"""
import argparse
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_common import (flashinfer_cache_under_out, flush_buffer, median_replays,  # noqa: E402
                          trace_decode)

flashinfer_cache_under_out()

# name, batch, H_q, H_kv, D, kv_len (-1: trace snapshot), page_size, kv dtype
CASES = [
    ("gqa_32x8_d128_b128_kv4096_p64_bf16", 128, 32, 8, 128, 4096, 64, "bf16"),
    ("gqa_32x8_d128_b128_kv4096_p16_bf16", 128, 32, 8, 128, 4096, 16, "bf16"),
    ("gqa_32x8_d128_b128_kv4096_p64_fp8", 128, 32, 8, 128, 4096, 64, "fp8"),
    ("gqa_32x8_d128_b128_kv4096_p64_nvfp4", 128, 32, 8, 128, 4096, 64, "nvfp4"),
    ("gqa_32x8_d128_trace128", 128, 32, 8, 128, -1, 64, "bf16"),
    ("gqa_32x8_d128_b1_kv32768", 1, 32, 8, 128, 32768, 64, "bf16"),
    ("gqa_64x8_d128_b64_kv8192", 64, 64, 8, 128, 8192, 64, "bf16"),
]
MAX_SETS = 4


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default=None)
    ap.add_argument("--reps", type=int, default=100)
    ap.add_argument("--sets", type=int, default=MAX_SETS)
    ap.add_argument("--api", default=None, choices=["xqa", "tc_decode"])
    ap.add_argument("--trace-step", type=int, default=100)
    args = ap.parse_args()
    reps = max(args.reps, 50)
    try:
        import torch
    except Exception as e:  # noqa: BLE001
        print(f"skip peer flashinfer: import torch failed ({e})")
        return 0
    if not torch.cuda.is_available():
        print("skip peer flashinfer: no CUDA device")
        return 0
    t0 = time.time()
    try:
        import flashinfer
        import flashinfer.decode
    except Exception as e:  # noqa: BLE001
        print(f"skip peer flashinfer: import flashinfer failed ({type(e).__name__}: {e})")
        return 0
    dev = torch.device("cuda")
    prop = torch.cuda.get_device_properties(dev)
    print(f"# peer flashinfer {getattr(flashinfer, '__version__', '?')} on {prop.name}, "
          f"import {time.time() - t0:.1f} s, JIT dir {os.environ.get('FLASHINFER_JIT_DIR', 'default')}")
    flush = flush_buffer(torch, dev)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int(os.environ.get("FI_TEST_SEED", "1234")) & 0x7FFFFFFF)
    workspace = torch.zeros(256 << 20, dtype=torch.uint8, device=dev)  # zero before first use
    failed = 0
    for name, B, hq, hkv, D, kvl, ps, kvdt in CASES:
        if args.case and args.case not in name:
            continue
        if kvdt == "nvfp4":
            print(f"skip peer {name}: FlashInfer has no NVFP4 KV cache on Hopper")
            continue
        kv_lens = trace_decode(B, args.trace_step) if kvl < 0 else [kvl] * B
        try:
            failed |= run_case(torch, flashinfer, dev, name, B, hq, hkv, D, kv_lens, ps, kvdt,
                               reps, max(1, min(args.sets, MAX_SETS)), flush, workspace, gen,
                               args.api)
        except torch.cuda.OutOfMemoryError as e:
            print(f"skip peer {name}: out of memory ({e})")
            torch.cuda.empty_cache()
    return failed


def run_case(torch, flashinfer, dev, name, B, hq, hkv, D, kv_lens, ps, kvdt, reps, nsets,
             flush, workspace, gen, only_api):
    pages_per = [(k + ps - 1) // ps for k in kv_lens]
    P = max(pages_per)
    num_pages = sum(pages_per)
    perm = torch.randperm(num_pages, generator=gen).to(torch.int32)
    block_tables = torch.zeros(B, P, dtype=torch.int32)
    indices, indptr, last = [], [0], []
    off = 0
    for b in range(B):
        row = perm[off:off + pages_per[b]]
        off += pages_per[b]
        block_tables[b, :pages_per[b]] = row
        indices.append(row)
        indptr.append(indptr[-1] + pages_per[b])
        last.append(kv_lens[b] - (pages_per[b] - 1) * ps if kv_lens[b] > 0 else 0)
    block_tables = block_tables.to(dev)
    indices = torch.cat(indices).to(dev)
    indptr = torch.tensor(indptr, dtype=torch.int32, device=dev)
    last = torch.tensor(last, dtype=torch.int32, device=dev)
    kv_dtype = torch.float8_e4m3fn if kvdt == "fp8" else torch.bfloat16
    esize = 1 if kvdt == "fp8" else 2
    bmm1 = 1.0 / math.sqrt(D)
    bmm2 = 1.0
    # set 0 random on the device (uniform [-1, 1)), the other sets copies at other addresses
    dgen = torch.Generator(device=dev)
    dgen.manual_seed(int(torch.randint(0, 1 << 30, (1,), generator=gen)))
    q0 = (torch.rand(B, hq, D, generator=dgen, device=dev) * 2 - 1).to(torch.bfloat16)
    kv0 = torch.empty(num_pages, 2, ps, hkv, D, dtype=kv_dtype, device=dev)
    for p0 in range(0, num_pages, 1024):  # in slices: no fp32 copy of the whole cache
        p1 = min(num_pages, p0 + 1024)
        kv0[p0:p1] = (torch.rand(p1 - p0, 2, ps, hkv, D, generator=dgen, device=dev) * 2 - 1).to(kv_dtype)
    sets = [(q0, kv0, torch.empty(B, hq, D, dtype=torch.bfloat16, device=dev))]
    for _ in range(1, nsets):
        free_b, _total = torch.cuda.mem_get_info()
        if kv0.numel() * esize * 2 > free_b:
            break
        sets.append((q0.clone(), kv0.clone(), torch.empty_like(sets[0][2])))
    nsets = len(sets)
    kv_tokens = sum(kv_lens)
    nbytes = kv_tokens * hkv * D * 2 * esize + 2 * B * hq * D * 2
    seq_lens = torch.tensor(kv_lens, dtype=torch.int32, device=dev)
    try:
        seq_lens_u32 = seq_lens.to(torch.uint32)
    except Exception:  # noqa: BLE001 (older torch: no uint32)
        seq_lens_u32 = seq_lens
    failed = 0
    for api in ("xqa", "tc_decode"):
        if only_api and api != only_api:
            continue
        try:
            if api == "xqa":
                def call(s, q, kv, out):  # noqa: ARG001
                    flashinfer.decode.xqa_batch_decode_with_kv_cache(
                        q, kv, workspace, block_tables, seq_lens_u32, max(kv_lens),
                        bmm1_scale=bmm1, bmm2_scale=bmm2, out=out, kv_layout="NHD",
                        enable_pdl=False)
                prep = None
            else:
                wrappers = []
                for _ in range(nsets):
                    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(
                        torch.empty(128 << 20, dtype=torch.uint8, device=dev), "NHD",
                        use_cuda_graph=True, use_tensor_cores=True,
                        paged_kv_indptr_buffer=indptr.clone(),
                        paged_kv_indices_buffer=indices.clone(),
                        paged_kv_last_page_len_buffer=last.clone())
                    w.plan(indptr, indices, last, hq, hkv, D, ps, pos_encoding_mode="NONE",
                           q_data_type=torch.bfloat16, kv_data_type=kv_dtype,
                           sm_scale=bmm1)
                    wrappers.append(w)
                prep = wrappers

                def call(s, q, kv, out):
                    prep[s].run(q, kv, out=out)
            t0 = time.time()
            call(0, *sets[0])  # first call: JIT compile / load
            torch.cuda.synchronize()
            print(f"# peer {name} {api}: first call (JIT or load) {time.time() - t0:.1f} s")
            graphs = []
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm up on a side stream before capture
                for s in range(nsets):
                    call(s, *sets[s])
            torch.cuda.current_stream().wait_stream(side)
            torch.cuda.synchronize()
            for s in range(nsets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g):
                    call(s, *sets[s])
                graphs.append(g)
            for mode, fl in (("b2b", None), ("flush", flush)):
                sec = median_replays(torch, graphs, reps, fl)
                print(f"peer {name} {api} {mode} us {sec * 1e6:.2f} GBps {nbytes / sec / 1e9:.1f}")
            sys.stdout.flush()
        except Exception as e:  # noqa: BLE001 (an API that does not run the shape)
            msg = str(e).splitlines()[0] if str(e) else ""
            print(f"skip peer {name} {api}: {type(e).__name__}: {msg[:200]}")
            torch.cuda.synchronize()
    return failed


if __name__ == "__main__":
    sys.exit(main())
