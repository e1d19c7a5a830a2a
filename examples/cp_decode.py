"""Context-parallel MLA decode over several GPUs with torch.distributed (NCCL).

Every GPU holds a contiguous slice of every request's KV pages (rank r: pages
[r * P / N, (r + 1) * P / N) of each request), runs fiattn's BatchMLAPagedAttentionWrapper on
its slice with return_lse, the partial (out, lse) pairs are all-gathered over NCCL and merged
with fiattn.merge_states (log-sum-exp merge of attention over disjoint key sets; the
wrapper's LSE is base 2, FlashInfer's convention).  Rank 0 also runs the whole KV on one GPU
and reports the relative error of the merged output against it, and both step times.

    python3 examples/cp_decode.py --gpus 2 --batch 8 --kv-len 131072
Exit status 0 when the merged output is within --tol of the one-GPU output.
NCCL's NVLink multicast is turned off (NCCL_NVLS_ENABLE=0), as the GPU machines need.
"""
import argparse
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fiattn  # noqa: E402


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--kv-len", type=int, default=131072, help="keys per request")
    p.add_argument("--heads", type=int, default=128)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--iters", type=int, default=20, help="timed steps")
    p.add_argument("--tol", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    return p.parse_args(argv)


def full_inputs(a, dev):
    """q and the whole paged cache, identical on every rank (seeded on the GPU)."""
    g = torch.Generator(device=dev).manual_seed(a.seed)
    P = a.kv_len // a.page_size
    ckv = torch.randn(a.batch * P, a.page_size, 512, generator=g, device=dev).bfloat16()
    kpe = torch.randn(a.batch * P, a.page_size, 64, generator=g, device=dev).bfloat16()
    qn = torch.randn(a.batch, a.heads, 512, generator=g, device=dev).bfloat16()
    qp = torch.randn(a.batch, a.heads, 64, generator=g, device=dev).bfloat16()
    return qn, qp, ckv, kpe, P


def wrapper_for(a, ws, dev, pages_per_req):
    """A wrapper planned for B requests of pages_per_req pages each (request b's pages are
    b * pages_per_req ..), decode (one query row a request)."""
    B = a.batch
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(ws)
    qo = torch.arange(B + 1, dtype=torch.int32, device=dev)
    kv_indptr = qo * pages_per_req
    kv_indices = torch.arange(B * pages_per_req, dtype=torch.int32, device=dev)
    kv_len = torch.full((B,), pages_per_req * a.page_size, dtype=torch.int32, device=dev)
    w.plan(qo, kv_indptr, kv_indices, kv_len, a.heads, 512, 64, a.page_size, False,
           1.0 / math.sqrt(192), torch.bfloat16, torch.bfloat16)
    return w


def time_us(fn, iters):
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000.0 / iters


def worker(rank, a, result):
    os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{a.port}", rank=rank,
                            world_size=a.gpus)
    dev = torch.device("cuda", rank)
    torch.cuda.set_device(dev)
    qn, qp, ckv, kpe, P = full_inputs(a, dev)
    share = P // a.gpus
    # this rank's slice of every request's pages, compacted into its own cache
    view = (a.batch, P, a.page_size)
    my_ckv = ckv.view(*view, 512)[:, rank * share:(rank + 1) * share].reshape(-1, a.page_size,
                                                                              512).contiguous()
    my_kpe = kpe.view(*view, 64)[:, rank * share:(rank + 1) * share].reshape(-1, a.page_size,
                                                                             64).contiguous()
    ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
    w = wrapper_for(a, ws, dev, share)
    out = torch.empty(a.batch, a.heads, 512, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(a.batch, a.heads, dtype=torch.float32, device=dev)
    outs = [torch.empty_like(out) for _ in range(a.gpus)]
    lses = [torch.empty_like(lse) for _ in range(a.gpus)]

    def cp_step():
        w.run(qn, qp, my_ckv, my_kpe, True, out=out, lse=lse)
        dist.all_gather(outs, out)
        dist.all_gather(lses, lse)
        return fiattn.merge_states(torch.stack(outs, 1), torch.stack(lses, 1), base=2)

    merged, _ = cp_step()
    cp_us = time_us(cp_step, a.iters)
    if rank == 0:
        ws1 = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        w1 = wrapper_for(a, ws1, dev, P)
        full = torch.empty_like(out)

        def one_gpu():
            w1.run(qn, qp, ckv, kpe, out=full)
        one_gpu()
        torch.cuda.synchronize()
        err = ((merged.float() - full.float()).norm() / full.float().norm()).item()
        one_us = time_us(one_gpu, a.iters)
        result.put((err, cp_us, one_us))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    a = parse(argv)
    if torch.cuda.device_count() < a.gpus:
        print(f"cp_decode: needs {a.gpus} GPUs, found {torch.cuda.device_count()}: skipped")
        return 0
    if (a.kv_len // a.page_size) % a.gpus:
        print("cp_decode: kv_len / page_size must divide by --gpus", file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a, q), nprocs=a.gpus, join=True)
    err, cp_us, one_us = q.get()
    print(f"context-parallel MLA decode: {a.gpus} GPUs, batch {a.batch} x {a.kv_len} keys, "
          f"heads {a.heads}, page {a.page_size}")
    print(f"  merged vs one GPU: relative error {err:.2e} (tolerance {a.tol:g})")
    print(f"  step: {cp_us:.1f} us on {a.gpus} GPUs (run + all-gather + merge) vs "
          f"{one_us:.1f} us on one GPU")
    return 0 if err <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
