"""Extract the API signatures from the reference documents (../shared/reference-api/*.txt)."""
import ast
import os

from conftest import ROOT

SNAPSHOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "reference_signatures.txt")


def reference_dir():
    d = os.environ.get("FIATTN_REFERENCE_API") or os.path.join(ROOT, "..", "shared",
                                                                 "reference-api")
    return d if os.path.isdir(d) else None


def _split_top(s):
    parts, depth, cur = [], 0, ""
    for ch in s:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return [p.strip() for p in parts]


def _find_call(text, name):
    """The parameter text of the first `name(` ... matching `)` in text."""
    i = text.find(name + "(")
    if i < 0:
        return None
    j = i + len(name) + 1
    depth = 1
    k = j
    while depth:
        if text[k] in "([":
            depth += 1
        elif text[k] in ")]":
            depth -= 1
        k += 1
    return text[j:k - 1]


def parse_params(ptext):
    """[(name, default or MISSING)] of a parameter list."""
    out = []
    for p in _split_top(ptext):
        name = p.split(":")[0].split("=")[0].strip()
        if "=" in p:
            d = p.rsplit("=", 1)[1].strip()
            try:
                d = ast.literal_eval(d)
            except (ValueError, SyntaxError):
                pass
            out.append((name, d))
        else:
            out.append((name, "<required>"))
    return out


# (document, qualified name in the document, fiattn attribute path)
APIS = [
    ("mla.trtllm_batch_decode_with_kv_cache_mla.txt",
     "flashinfer.mla.trtllm_batch_decode_with_kv_cache_mla", "mla.trtllm_batch_decode_with_kv_cache_mla"),
    ("xqa.xqa_mla.txt", "flashinfer.xqa.xqa_mla", "xqa.xqa_mla"),
    ("decode.xqa_batch_decode_with_kv_cache.txt",
     "flashinfer.decode.xqa_batch_decode_with_kv_cache", "decode.xqa_batch_decode_with_kv_cache"),
    ("prefill.trtllm_batch_context_with_kv_cache.txt",
     "flashinfer.prefill.trtllm_batch_context_with_kv_cache",
     "prefill.trtllm_batch_context_with_kv_cache"),
    ("mla.BatchMLAPagedAttentionWrapper.txt", "__init__",
     "mla.BatchMLAPagedAttentionWrapper.__init__"),
    ("mla.BatchMLAPagedAttentionWrapper.txt", "- plan", "mla.BatchMLAPagedAttentionWrapper.plan"),
    ("mla.BatchMLAPagedAttentionWrapper.txt", "- run", "mla.BatchMLAPagedAttentionWrapper.run"),
]


def from_documents(d):
    """{fiattn path: params text} read from the reference documents."""
    res = {}
    for doc, qname, path in APIS:
        text = open(os.path.join(d, doc), encoding="utf-8").read()
        p = _find_call(text, qname)
        assert p is not None, f"{qname} not found in {doc}"
        res[path] = p
    return res


def load():
    """Signatures from the documents when present, else from the snapshot kept beside the
    tests (written from the documents; test_snapshot_matches_documents keeps it honest)."""
    d = reference_dir()
    if d:
        return from_documents(d)
    res = {}
    for line in open(SNAPSHOT, encoding="utf-8"):
        if line.strip() and not line.startswith("#"):
            path, p = line.rstrip("\n").split("\t")
            res[path] = p
    return res
