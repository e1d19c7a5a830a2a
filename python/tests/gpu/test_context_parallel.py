"""examples/cp_decode.py on two GPUs: context-parallel MLA and GQA decode (each GPU a slice
of every request's KV, all-gather over NCCL, fiattn.merge_states) equal to the one-GPU
output within 1e-2.  Skipped with fewer than two CUDA devices."""
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(torch.cuda.device_count() < 2, reason="fewer than two GPUs")

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "cp_decode.py")


def _run_example(port, args):
    env = dict(os.environ, NCCL_NVLS_ENABLE="0")
    r = subprocess.run([sys.executable, EXAMPLE, "--gpus", "2", "--batch", "3", "--iters", "2",
                        "--port", str(port)] + args,
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "relative error" in r.stdout


@pytest.mark.parametrize("heads,kv_len", [(16, 4096), (128, 8192)])
def test_context_parallel_mla_matches_one_gpu(heads, kv_len):
    _run_example(29600 + heads, ["--family", "mla", "--kv-len", str(kv_len),
                                 "--heads", str(heads)])


@pytest.mark.parametrize("heads,kv_heads,head_dim,kv_len", [(32, 8, 128, 8192),
                                                            (16, 1, 64, 4096)])
def test_context_parallel_gqa_matches_one_gpu(heads, kv_heads, head_dim, kv_len):
    """xqa_batch_decode_with_lse per GPU: Llama-3-8B's heads, and group 16 at head_dim 64."""
    _run_example(29800 + heads + kv_heads, ["--family", "gqa", "--kv-len", str(kv_len),
                                            "--heads", str(heads), "--kv-heads", str(kv_heads),
                                            "--head-dim", str(head_dim)])
