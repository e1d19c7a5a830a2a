"""The package version, from its one source: include/fiattn.h (FIATTN_VERSION_*).

An installed package carries _build_version.py, written by setup.py from the header it
was built with; a source checkout parses the header directly."""
import os
import re


def _from_header(path):
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    parts = []
    for k in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(r"^#define FIATTN_VERSION_%s\s+(\d+)" % k, text, re.M)
        if not m:
            return None
        parts.append(m.group(1))
    return ".".join(parts)


try:
    from ._build_version import version  # noqa: F401  (installed package)
except ImportError:
    _h = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "include",
                      "fiattn.h")
    version = _from_header(_h) or "0+unknown"
