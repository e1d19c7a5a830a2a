"""docs/python.md's example runs as written (CPU tensors, the C reference executor): the
page's context-parallel claim (two disjoint KV parts merged by fiattn.merge_state equal the
whole GQA decode) is checked by its own assert, on fresh random data at every run."""
import os
import re

import pytest

torch = pytest.importorskip("torch")

DOC = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "python.md")
MARK = "<!-- run by python/tests/test_docs_python.py -->"


def marked_blocks(text):
    """The ```python blocks that directly follow the marker line."""
    return re.findall(re.escape(MARK) + r"\n```python\n(.*?)\n```", text, re.S)


def test_marked_example_runs():
    with open(DOC) as f:
        blocks = marked_blocks(f.read())
    assert len(blocks) == 1, "docs/python.md should hold one marked example"
    code = compile(blocks[0], "docs/python.md", "exec")
    exec(code, {"__name__": "docs_python_example"})  # its assert checks the merge


def test_marked_example_assert_can_fail():
    """The example's check is live: a merge of the first part with itself differs."""
    with open(DOC) as f:
        src = marked_blocks(f.read())[0]
    broken = src.replace("fiattn.merge_state(out_a, lse_a, out_b, lse_b)",
                         "fiattn.merge_state(out_a, lse_a, out_a, lse_a)")
    assert broken != src
    with pytest.raises(AssertionError):
        exec(compile(broken, "docs/python.md", "exec"), {"__name__": "docs_python_example"})
