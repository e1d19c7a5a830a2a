"""examples/cp_decode.py without GPUs: each rank's part (its page slicing, tables, LSE and
LSE base) run on CPU tensors, both ranks in one process, merged with fiattn.merge_states as
the example merges the all-gathered pairs, equal to its one-GPU (whole-KV) result.  The NCCL
exchange and the timing run on two GPUs only (python/tests/gpu/test_context_parallel.py)."""
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import fiattn  # noqa: E402
from reference import rel_err  # noqa: E402

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


@pytest.mark.parametrize("family,extra", [("mla", ["--heads", "16"]),
                                          ("gqa", ["--heads", "8", "--kv-heads", "2",
                                                   "--head-dim", "64"])])
def test_cp_decode_example_slices_merge_to_the_whole(family, extra):
    """Fresh seed; out / lse poisoned with NaN; the halves alone are far from the whole."""
    sys.path.insert(0, EXAMPLES)
    try:
        import cp_decode
    finally:
        sys.path.remove(EXAMPLES)
    a = cp_decode.parse(["--family", family, "--batch", "3", "--kv-len", "256",
                         "--page-size", "16", "--seed", str(torch.randint(1 << 30, (1,)).item())]
                        + extra)
    dev = torch.device("cpu")
    fams = [cp_decode.FAMILIES[family](a, dev, rank) for rank in range(a.gpus)]
    assert fams[1].run_whole is None
    outs, lses = [], []
    for f in fams:
        out = torch.full(f.out_shape, float("nan"), dtype=torch.bfloat16)
        lse = torch.full(f.out_shape[:2], float("nan"))
        f.run_part(out=out, lse=lse)
        outs.append(out)
        lses.append(lse)
    merged, _ = fiattn.merge_states(torch.stack(outs, 1), torch.stack(lses, 1),
                                    base=fams[0].lse_base)
    whole = torch.full(fams[0].out_shape, float("nan"), dtype=torch.bfloat16)
    fams[0].run_whole(out=whole)
    assert not torch.isnan(whole).any()
    assert rel_err(merged, whole) < 1e-2
    # the halves differ (each is its own attention), so a merge that ignored lse would fail
    assert rel_err(outs[0], whole) > 5e-2
