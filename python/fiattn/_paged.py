"""GQA / context paged KV caches -> fi_tensor views (internal)."""
from . import _capi as C
from ._common import fill_tensor
from ._torch import check_tensor, torch


def unpack_kv(kv_cache, kv_layout, device, dtypes):
    """Split the reference's kv_cache forms into logical K and V views
    [num_pages, page_size, num_kv_heads, head_dim] (shape, element strides, tensor).

    Forms: one tensor [num_pages, 1 or 2, page_size, H_kv, D] (NHD) or
    [num_pages, 1 or 2, H_kv, page_size, D] (HND) (1: K and V are the same tensor), or a
    tuple (K, V) of [num_pages, page_size, H_kv, D] (NHD) / [num_pages, H_kv, page_size, D]
    (HND).  No copy: HND is expressed through strides."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"fiattn: kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    t = torch()
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError("fiattn: kv_cache as a tuple must be (k_cache, v_cache)")
        k, v = kv_cache
        check_tensor(k, "k_cache", dtypes, device, 4)
        check_tensor(v, "v_cache", dtypes, device, 4)
        parts = [(k, list(k.shape), list(k.stride())), (v, list(v.shape), list(v.stride()))]
    else:
        check_tensor(kv_cache, "kv_cache", dtypes, device, 5)
        n = kv_cache.shape[1]
        if n not in (1, 2):
            raise ValueError(f"fiattn: kv_cache's dim 1 must be 1 or 2, got {n}")
        sh, st = list(kv_cache.shape), list(kv_cache.stride())
        ks = [sh[0]] + sh[2:], [st[0]] + st[2:]
        k = (kv_cache, ks[0], ks[1])
        parts = [k, k]
        if n == 2:
            parts[1] = (kv_cache, ks[0], ks[1], st[1])
    out = []
    for p in parts:
        x, sh, st = p[0], list(p[1]), list(p[2])
        off = p[3] if len(p) > 3 else 0
        if kv_layout == "HND":
            sh[1], sh[2] = sh[2], sh[1]
            st[1], st[2] = st[2], st[1]
        out.append((x, sh, st, off))
    (kx, ksh, kst, koff), (vx, vsh, vst, voff) = out
    if ksh[:3] != vsh[:3]:
        raise ValueError(f"fiattn: K and V caches disagree: {ksh} vs {vsh}")
    if kx.dtype != vx.dtype:
        raise TypeError("fiattn: K and V caches must have one dtype")
    return (kx, ksh, kst, koff), (vx, vsh, vst, voff)


def fill_kv(args, kpart, vpart):
    kx, ksh, kst, koff = kpart
    vx, vsh, vst, voff = vpart
    fill_tensor(args.k, kx, ksh, kst, koff)
    fill_tensor(args.v, vx, vsh, vst, voff)
