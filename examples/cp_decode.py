"""Context-parallel MLA / GQA decode over several GPUs with torch.distributed (NCCL).

Every GPU holds a contiguous slice of every request's KV pages (rank r: pages
[r * P / N, (r + 1) * P / N) of each request), runs fiattn on its slice and returns the
slice's LSE, the partial (out, lse) pairs are all-gathered over NCCL and merged with
fiattn.merge_states (log-sum-exp merge of attention over disjoint key sets).  Families:

  --family mla  BatchMLAPagedAttentionWrapper.run(..., return_lse=True): base-2 LSE
                (FlashInfer's convention, merged with base=2); --heads 128 by default.
  --family gqa  fiattn.decode.xqa_batch_decode_with_lse: natural-log LSE; Llama-3-8B's
                shape by default (--heads 32, --kv-heads 8, --head-dim 128).

bf16 throughout, one query row a request.  Rank 0 also runs the whole KV on one GPU (MLA:
the wrapper; GQA: xqa_batch_decode_with_kv_cache) and reports the relative error
||merged - one GPU|| / ||one GPU|| and both step times (CUDA events, mean of --iters steps;
the context-parallel step is run + two all-gathers + merge).

    python3 examples/cp_decode.py --gpus 2 --batch 8 --kv-len 131072 [--family gqa]
Exit status 0 when the merged output is within --tol of the one-GPU output.
NCCL's NVLink multicast is turned off (NCCL_NVLS_ENABLE=0), as the GPU machines need.
"""
import argparse
import collections
import functools
import math
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import fiattn  # noqa: E402

WS_BYTES = 256 << 20

# One family's side of a context-parallel step, built per rank by mla_family / gqa_family:
#   label       the shape, for the report
#   out_shape   (batch, query heads, output dim) of out (bf16); lse is out_shape[:2] fp32
#   lse_base    the base of run_part's LSE, for merge_states (2 or "e")
#   run_part    run_part(out=, lse=): this rank's slice of every request, written in place
#   run_whole   run_whole(out=): the whole KV on this GPU (rank 0 only; None elsewhere)
Family = collections.namedtuple("Family", "label out_shape lse_base run_part run_whole")


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--family", choices=("mla", "gqa"), default="mla")
    p.add_argument("--gpus", type=int, default=2)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--kv-len", type=int, default=131072, help="keys per request")
    p.add_argument("--heads", type=int, default=None,
                   help="query heads (default: MLA 128, GQA 32)")
    p.add_argument("--kv-heads", type=int, default=8, help="GQA only: KV heads")
    p.add_argument("--head-dim", type=int, default=128, help="GQA only: head_dim (64 / 128 / 256)")
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--iters", type=int, default=20, help="timed steps")
    p.add_argument("--tol", type=float, default=1e-2)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--port", type=int, default=29517)
    a = p.parse_args(argv)
    if a.heads is None:
        a.heads = 128 if a.family == "mla" else 32
    return a


def pages_per_request(a):
    return a.kv_len // a.page_size


def rank_pages(x, a, rank):
    """This rank's slice of every request's pages of a cache x [batch * P, ...] (request b's
    pages are b * P ..), compacted into a new cache [batch * P / gpus, ...]."""
    P = pages_per_request(a)
    share = P // a.gpus
    per_request = x.view(a.batch, P, *x.shape[1:])
    return per_request[:, rank * share:(rank + 1) * share].reshape(-1, *x.shape[1:]).contiguous()


def mla_wrapper(a, dev, pages):
    """A wrapper planned for `batch` requests of `pages` pages each (request b's pages are
    b * pages ..), decode (one query row a request), on its own workspace."""
    B = a.batch
    w = fiattn.mla.BatchMLAPagedAttentionWrapper(
        torch.empty(WS_BYTES, dtype=torch.uint8, device=dev))
    qo = torch.arange(B + 1, dtype=torch.int32, device=dev)
    kv_indices = torch.arange(B * pages, dtype=torch.int32, device=dev)
    kv_len = torch.full((B,), pages * a.page_size, dtype=torch.int32, device=dev)
    w.plan(qo, qo * pages, kv_indices, kv_len, a.heads, 512, 64, a.page_size, False,
           1.0 / math.sqrt(192), torch.bfloat16, torch.bfloat16)
    return w


def mla_family(a, dev, rank):
    """MLA (kv_lora_rank 512 + rope 64): q and the whole cache identical on every rank
    (seeded on the GPU), this rank's slice compacted."""
    g = torch.Generator(device=dev).manual_seed(a.seed)
    P = pages_per_request(a)
    ckv = torch.randn(a.batch * P, a.page_size, 512, generator=g, device=dev).bfloat16()
    kpe = torch.randn(a.batch * P, a.page_size, 64, generator=g, device=dev).bfloat16()
    qn = torch.randn(a.batch, a.heads, 512, generator=g, device=dev).bfloat16()
    qp = torch.randn(a.batch, a.heads, 64, generator=g, device=dev).bfloat16()
    my_ckv, my_kpe = rank_pages(ckv, a, rank), rank_pages(kpe, a, rank)
    run_part = functools.partial(mla_wrapper(a, dev, P // a.gpus).run, qn, qp, my_ckv, my_kpe,
                                 True)
    run_whole = None
    if rank == 0:
        run_whole = functools.partial(mla_wrapper(a, dev, P).run, qn, qp, ckv, kpe)
    return Family(f"heads {a.heads}", (a.batch, a.heads, 512), 2, run_part, run_whole)


def gqa_tables(a, dev, pages):
    """block_tables int32 [batch, pages] (device; request b's pages are b * pages ..) and
    seq_lens int32 [batch] (host: the planner reads them without a copy) of full pages."""
    bt = torch.arange(a.batch * pages, dtype=torch.int32, device=dev).view(a.batch, pages)
    return bt, torch.full((a.batch,), pages * a.page_size, dtype=torch.int32)


def gqa_family(a, dev, rank):
    """GQA: q [batch, heads, head_dim] and the whole cache [batch * P, 2, page, kv_heads,
    head_dim] (NHD, K and V in one tensor) identical on every rank (seeded on the GPU), this
    rank's slice compacted.  bmm1_scale = 1 / sqrt(head_dim)."""
    g = torch.Generator(device=dev).manual_seed(a.seed)
    P = pages_per_request(a)
    D = a.head_dim
    # drawn in bf16 (no fp32 copy: 8 x 131072 keys are 2^31 elements, 4 GiB in bf16)
    kv = torch.empty(a.batch * P, 2, a.page_size, a.kv_heads, D, dtype=torch.bfloat16,
                     device=dev).normal_(generator=g)
    q = torch.empty(a.batch, a.heads, D, dtype=torch.bfloat16, device=dev).normal_(generator=g)
    my_kv = rank_pages(kv, a, rank)
    scale = 1.0 / math.sqrt(D)
    run_part = functools.partial(  # its own workspace: the part and the whole are two plans
        fiattn.decode.xqa_batch_decode_with_lse, q, my_kv,
        torch.empty(WS_BYTES, dtype=torch.uint8, device=dev), *gqa_tables(a, dev, P // a.gpus),
        a.kv_len // a.gpus, bmm1_scale=scale)
    run_whole = None
    if rank == 0:
        run_whole = functools.partial(
            fiattn.decode.xqa_batch_decode_with_kv_cache, q, kv,
            torch.empty(WS_BYTES, dtype=torch.uint8, device=dev), *gqa_tables(a, dev, P),
            a.kv_len, bmm1_scale=scale)
    return Family(f"heads {a.heads} / {a.kv_heads} KV, head_dim {D}", (a.batch, a.heads, D),
                  "e", run_part, run_whole)


FAMILIES = {"mla": mla_family, "gqa": gqa_family}


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
    fam = FAMILIES[a.family](a, dev, rank)
    out = torch.empty(fam.out_shape, dtype=torch.bfloat16, device=dev)
    lse = torch.empty(fam.out_shape[:2], dtype=torch.float32, device=dev)
    outs = [torch.empty_like(out) for _ in range(a.gpus)]
    lses = [torch.empty_like(lse) for _ in range(a.gpus)]

    def cp_step():
        fam.run_part(out=out, lse=lse)
        dist.all_gather(outs, out)
        dist.all_gather(lses, lse)
        return fiattn.merge_states(torch.stack(outs, 1), torch.stack(lses, 1),
                                   base=fam.lse_base)

    merged, _ = cp_step()
    cp_us = time_us(cp_step, a.iters)
    if rank == 0:
        full = torch.empty_like(out)

        def one_gpu():
            fam.run_whole(out=full)
        one_gpu()
        torch.cuda.synchronize()
        err = ((merged.float() - full.float()).norm() / full.float().norm()).item()
        one_us = time_us(one_gpu, a.iters)
        result.put((fam.label, err, cp_us, one_us))
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    a = parse(argv)
    if torch.cuda.device_count() < a.gpus:
        print(f"cp_decode: needs {a.gpus} GPUs, found {torch.cuda.device_count()}: skipped")
        return 0
    if pages_per_request(a) % a.gpus or a.kv_len % a.page_size:
        print("cp_decode: kv_len must be whole pages and its pages divide by --gpus",
              file=sys.stderr)
        return 2
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    mp.spawn(worker, args=(a, q), nprocs=a.gpus, join=True)
    label, err, cp_us, one_us = q.get()
    print(f"context-parallel {a.family.upper()} decode: {a.gpus} GPUs, batch {a.batch} x "
          f"{a.kv_len} keys, {label}, page {a.page_size}")
    print(f"  merged vs one GPU: relative error {err:.2e} (tolerance {a.tol:g})")
    print(f"  step: {cp_us:.1f} us on {a.gpus} GPUs (run + all-gather + merge) vs "
          f"{one_us:.1f} us on one GPU")
    return 0 if err <= a.tol else 1


if __name__ == "__main__":
    sys.exit(main())
