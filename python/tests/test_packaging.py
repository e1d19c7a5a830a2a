"""import fiattn without torch; version from the header; FIATTN_LIBRARY override."""
import os
import subprocess
import sys

from conftest import ROOT

PKG = os.path.join(ROOT, "python")

NO_TORCH = """
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == 'torch' or name.startswith('torch.'):
            raise ImportError('torch blocked by the test')
sys.meta_path.insert(0, Block())
import fiattn
assert fiattn.workspace_size('mla_decode', 8, 8, 16, num_ctas=4) > 0
assert fiattn.status_name(17) == 'FI_ERR_WORKSPACE_TOO_SMALL'
try:
    fiattn.mla.trtllm_batch_decode_with_kv_cache_mla(*([None] * 9))
except ImportError as e:
    assert 'PyTorch' in str(e) and 'pip install torch' in str(e), e
    print('clear-error')
"""


def _run(code, env=None):
    e = dict(os.environ, PYTHONPATH=PKG)
    e.update(env or {})
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=e)


def test_import_without_torch():
    r = _run(NO_TORCH)
    assert r.returncode == 0, r.stderr
    assert "clear-error" in r.stdout


def test_version_from_header():
    import re
    import fiattn
    h = open(os.path.join(ROOT, "include", "fiattn.h")).read()
    v = ".".join(re.search(r"#define FIATTN_VERSION_%s\s+(\d+)" % k, h).group(1)
                 for k in ("MAJOR", "MINOR", "PATCH"))
    assert fiattn.__version__ == v


def test_library_env_override():
    r = _run("import fiattn; print(fiattn.library_path())",
             {"FIATTN_LIBRARY": "/nonexistent/libfiattn.so"})
    assert r.returncode != 0 and "/nonexistent/libfiattn.so" in r.stderr
    import fiattn
    real = fiattn.library_path()
    r = _run("import fiattn; print(fiattn.library_path())", {"FIATTN_LIBRARY": real})
    assert r.returncode == 0 and r.stdout.strip() == os.path.realpath(real)
