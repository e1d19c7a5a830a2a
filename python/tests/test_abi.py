"""The ctypes structures mirror the C layout: sizeof / offsetof printed by a C program
compiled from the public headers, compared field by field."""
import ctypes
import os
import shutil
import subprocess

import pytest

from conftest import ROOT
from fiattn import _capi as C

STRUCTS = {
    "fi_caps": C.fi_caps, "fi_batch": C.fi_batch, "fi_tensor": C.fi_tensor,
    "fi_attn_args": C.fi_attn_args, "fi_error_detail": C.fi_error_detail,
    "fi_allocator": C.fi_allocator,
}


@pytest.fixture(scope="module")
def c_layout(tmp_path_factory):
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if not cc:
        pytest.skip("no C compiler")
    lines = ["#include <stdio.h>", "#include <stddef.h>", '#include "fiattn_run.h"',
             "int main(void) {"]
    for name, cls in STRUCTS.items():
        lines.append(f'printf("{name} sizeof %zu\\n", sizeof({name}));')
        for f, _ in cls._fields_:
            lines.append(f'printf("{name} {f} %zu\\n", offsetof({name}, {f}));')
    lines += ['printf("enum sizeof %zu\\n", sizeof(fi_status));', "return 0; }"]
    d = tmp_path_factory.mktemp("abi")
    src, exe = d / "abi.c", d / "abi"
    src.write_text("\n".join(lines))
    subprocess.check_call([cc, "-std=c11", "-I", os.path.join(ROOT, "include"), str(src),
                           "-o", str(exe)])
    out = {}
    for line in subprocess.check_output([str(exe)]).decode().splitlines():
        a, b, v = line.split()
        out[(a, b)] = int(v)
    return out


@pytest.mark.parametrize("name", sorted(STRUCTS))
def test_struct_layout_matches_c(c_layout, name):
    cls = STRUCTS[name]
    assert ctypes.sizeof(cls) == c_layout[(name, "sizeof")]
    for f, _ in cls._fields_:
        assert getattr(cls, f).offset == c_layout[(name, f)], f"{name}.{f}"


def test_enum_size(c_layout):
    assert c_layout[("enum", "sizeof")] == ctypes.sizeof(ctypes.c_int)


def test_status_names_come_from_the_library():
    assert C.status_name(0) == "FI_OK"
    assert C.status_name(17) == "FI_ERR_WORKSPACE_TOO_SMALL"
    assert C.status_name(42) == "FI_ERR_GRID_NOT_RESIDENT"
    assert C.status_name(10 ** 6) == "FI_STATUS_UNKNOWN"


def test_header_enum_values():
    h = open(os.path.join(ROOT, "include", "fiattn.h")).read()
    for name in ("FI_ERR_UNSUPPORTED_KIND = 3", "FI_ERR_UNSUPPORTED_DTYPE = 6",
                 "FI_ERR_WORKSPACE_TOO_SMALL = 17", "FI_KIND_MLA_DECODE = 1",
                 "FI_KIND_GQA_DECODE = 2", "FI_KIND_CONTEXT = 3", "FI_DTYPE_BF16 = 3",
                 "FI_DTYPE_E4M3 = 4", "FI_FORM_INDPTR = 2"):
        sym, val = name.split(" = ")
        assert f"{sym} = {val}" in h
        assert getattr(C, sym) == int(val)


def test_run_supported():
    c = C.fi_caps(kind=C.FI_KIND_MLA_DECODE, max_batch=4, max_q_tokens=4, num_pages=4,
                  page_size=64, num_qo_heads=128, num_kv_heads=1, head_dim_qk=576,
                  head_dim_vo=512, q_dtype=3, kv_dtype=3, o_dtype=3, num_ctas=8)
    assert C.run_supported(c) == C.FI_OK
    c.kind = C.FI_KIND_CONTEXT  # every kind has a GPU family since the context one
    c.num_qo_heads, c.num_kv_heads, c.head_dim_qk, c.head_dim_vo = 8, 8, 128, 128
    assert C.run_supported(c) == C.FI_OK
    c.num_qo_heads = 7  # invalid caps: 7 % 8
    assert C.run_supported(c) not in (C.FI_OK, C.FI_ERR_UNSUPPORTED_KIND)
