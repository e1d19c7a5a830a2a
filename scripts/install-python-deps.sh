#!/bin/sh
# scripts/install-python-deps.sh - what the Python layer's tests need (python/tests):
# pytest, numpy and torch from the package index through pip, and pyflakes for make lint.  The CPU tests use torch's
# CPU ops only; the index's default Linux wheel (with CUDA libraries) is what pip finds here,
# a CPU-only wheel works as well when an index offers one (PIP_INDEX_URL / --index-url).
# Debian's system python refuses pip without --break-system-packages (PEP 668): retried so.
set -eu
PY=${PYTHON:-python3}
if $PY -c 'import pytest, torch, numpy, pyflakes' 2>/dev/null; then
    echo "install-python-deps.sh: pytest, torch, numpy and pyflakes already installed"
    exit 0
fi
$PY -m pip install -q pytest numpy torch pyflakes ||
    $PY -m pip install -q --break-system-packages pytest numpy torch pyflakes
