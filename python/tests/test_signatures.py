"""fiattn's public functions have the reference signatures: names, order, defaults."""
import inspect

import pytest

import fiattn
import signatures as S


def _resolve(path):
    obj = fiattn
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def _ours(path):
    params = list(inspect.signature(_resolve(path)).parameters.values())
    if params and params[0].name == "self":
        params = params[1:]
    return params


SIGS = S.load()


@pytest.mark.parametrize("path", [a[2] for a in S.APIS])
def test_signature_matches_reference(path):
    ref = S.parse_params(SIGS[path])
    ours = [p for p in _ours(path) if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)]
    assert [p.name for p in ours] == [n for n, _ in ref], path
    for p, (name, default) in zip(ours, ref):
        if default == "<required>":
            assert p.default is inspect.Parameter.empty, f"{path}: {name} must be required"
        else:
            assert p.default == default and type(p.default) is type(default), \
                f"{path}: {name} default {p.default!r} != {default!r}"


def test_wrapper_run_documented_keywords():
    # The reference documents out / lse for run(); fiattn takes them as keywords after the
    # documented positional list (FlashInfer's own extension return_lse_base_on_e too).
    params = {p.name: p for p in _ours("mla.BatchMLAPagedAttentionWrapper.run")}
    for name in ("out", "lse", "return_lse_base_on_e"):
        assert params[name].kind is inspect.Parameter.KEYWORD_ONLY


def test_snapshot_matches_documents():
    d = S.reference_dir()
    if not d:
        pytest.skip("reference documents not beside the checkout")
    assert S.from_documents(d) == {k: v for k, v in S.load().items()}
    snap = {}
    for line in open(S.SNAPSHOT, encoding="utf-8"):
        if line.strip() and not line.startswith("#"):
            k, v = line.rstrip("\n").split("\t")
            snap[k] = v
    assert snap == S.from_documents(d)


def test_every_public_function_has_a_docstring():
    for path in [a[2] for a in S.APIS] + ["merge_state", "merge_states", "workspace_size",
                                          "plan_only", "release_workspace", "clear_plan_cache",
                                          "decode.xqa_batch_decode_with_lse"]:
        doc = inspect.getdoc(_resolve(path))
        assert doc and len(doc) > 40, path
