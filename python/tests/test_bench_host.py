"""python/bench_host.py without a GPU: argument parsing, the table, the skips without torch
or CUDA, and the --cpu-overhead run (which goes through the same fiattn calls)."""
import os
import subprocess
import sys

import pytest

from conftest import ROOT

BENCH = os.path.join(ROOT, "python", "bench_host.py")
sys.path.insert(0, os.path.dirname(BENCH))
import bench_host  # noqa: E402  (imports without torch)


def test_parse_args_defaults_and_errors():
    a = bench_host.parse_args([])
    assert (a.batch, a.heads, a.len, a.gqa_q, a.gqa_kv, a.flashinfer) == (64, 128, 1024, 32,
                                                                          8, "auto")
    a = bench_host.parse_args(["--gqa-heads", "64/8", "--flashinfer", "none", "--calls", "5"])
    assert (a.gqa_q, a.gqa_kv, a.flashinfer, a.calls) == (64, 8, "none", 5)
    for bad in (["--gqa-heads", "30/8"], ["--gqa-heads", "x"], ["--batch", "0"],
                ["--flashinfer", "maybe"]):
        with pytest.raises(SystemExit):
            bench_host.parse_args(bad)


def test_render_table_is_markdown_with_skips():
    t = bench_host.render_table(
        [dict(api="C", call="fi_run", host=4.06), dict(api="fiattn", call="run", host=17.94,
                                                       over=13.88, inside=12.04, graph=120.5),
         dict(api="FlashInfer fa3", call="run", note="skipped: ImportError: x")], "T")
    lines = t.splitlines()
    assert lines[0] == "### T" and lines[2].startswith("| API | call | host us / call")
    assert lines[4] == "| C | fi_run | 4.1 | - | - | - |"
    assert lines[5] == "| fiattn | run | 17.9 | 13.9 | 12.0 | 120.5 |"
    assert lines[6] == "| FlashInfer fa3 | run (skipped: ImportError: x) | - | - | - | - |"


def _run(args, block_torch=False):
    code = ("import sys\n"
            "class B:\n"
            "    def find_spec(self, n, p=None, t=None):\n"
            "        if n == 'torch' or n.startswith('torch.'): raise ImportError('blocked')\n"
            + ("sys.meta_path.insert(0, B())\n" if block_torch else "")
            + f"sys.argv = ['bench_host.py'] + {args!r}\n"
            f"sys.path.insert(0, {os.path.dirname(BENCH)!r})\n"
            "import bench_host\n"
            "sys.exit(bench_host.main())\n")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=dict(os.environ))


def test_without_torch_prints_one_skip_line():
    r = _run(["--calls", "3"], block_torch=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("skip bench_host: torch is not importable")


def test_cpu_overhead_runs_every_api():
    pytest.importorskip("torch")
    r = _run(["--cpu-overhead", "--batch", "4", "--len", "128", "--heads", "16",
              "--calls", "20"])
    assert r.returncode == 0, r.stderr
    rows = [l for l in r.stdout.splitlines() if l.startswith("| fiattn |")]
    names = [l.split("|")[2].strip() for l in rows]
    assert names == ["BatchMLAPagedAttentionWrapper.run",
                     "BatchMLAPagedAttentionWrapper.plan (CPU arrays)",
                     "trtllm_batch_decode_with_kv_cache_mla", "xqa_mla",
                     "xqa_batch_decode_with_kv_cache"]
    for l in rows:
        assert float(l.split("|")[4]) > 0  # python over C, us


def test_gpu_path_without_cuda_skips():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = _run(["--calls", "3"])
    assert r.returncode == 0 and r.stdout.startswith("skip bench_host: no CUDA device")


def test_python_inside_us_subtracts_the_c_calls():
    import time
    import types

    class Lib:
        def fi_run(self, *a):
            time.sleep(0.002)
            return 0
        fi_ref_run = fi_plan_update = fi_run
    lib = Lib()
    C = types.SimpleNamespace(_lib=lib)
    C.lib = lambda: C._lib
    us = bench_host.python_inside_us(None, C, lambda: C.lib().fi_run(0), 5, cuda=False)
    assert 0 <= us < 1000 and C._lib is lib  # the 2 ms sleep is not counted


def test_noop_lib_stubs_only_the_per_call_functions():
    """host_breakdown.py and --cpu-overhead stub the C calls with bench_host.NoopLib."""
    class Real:
        def fi_run(self, *a):
            return 7

        def fi_plan_update(self, *a):
            return 7

        def fi_plan_create(self, *a):
            return 5

    stub = bench_host.NoopLib(Real())
    assert stub.fi_run(1, 2, 3) == 0 and stub.fi_plan_update(1) == 0
    assert stub.fi_plan_create(1) == 5  # everything else is the real library's


def test_host_breakdown_without_cuda_skips():
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "python", "host_breakdown.py"),
                        "--calls", "3"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("skip host_breakdown: no CUDA device")
