"""GQA / context paged KV caches -> fi_tensor views, and the record of a paged call's
repeats (internal)."""
from . import _capi as C
from . import _engine as E
from ._common import fill_tensor, flat
from ._torch import check_tensor, torch


def unpack_kv(kv_cache, kv_layout, device, dtypes, names=("kv_cache", "k_cache", "v_cache")):
    """Split the reference's kv_cache forms into logical K and V views
    [num_pages, page_size, num_kv_heads, head_dim] (shape, element strides, tensor).
    names: the argument's name and its tuple members' names, for messages (the NVFP4
    block scales, kv_cache_sf, come in the same forms).

    Forms: one tensor [num_pages, 1 or 2, page_size, H_kv, D] (NHD) or
    [num_pages, 1 or 2, H_kv, page_size, D] (HND) (1: K and V are the same tensor), or a
    tuple (K, V) of [num_pages, page_size, H_kv, D] (NHD) / [num_pages, H_kv, page_size, D]
    (HND).  No copy: HND is expressed through strides."""
    if kv_layout not in ("NHD", "HND"):
        raise ValueError(f"fiattn: kv_layout must be 'NHD' or 'HND', got {kv_layout!r}")
    if isinstance(kv_cache, (tuple, list)):
        if len(kv_cache) != 2:
            raise ValueError(f"fiattn: {names[0]} as a tuple must be ({names[1]}, {names[2]})")
        k, v = kv_cache
        check_tensor(k, names[1], dtypes, device, 4)
        check_tensor(v, names[2], dtypes, device, 4)
        parts = [(k, list(k.shape), list(k.stride())), (v, list(v.shape), list(v.stride()))]
    else:
        check_tensor(kv_cache, names[0], dtypes, device, 5)
        n = kv_cache.shape[1]
        if n not in (1, 2):
            raise ValueError(f"fiattn: {names[0]}'s dim 1 must be 1 or 2, got {n}")
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
        raise ValueError(f"fiattn: {names[1]} and {names[2]} disagree: {ksh} vs {vsh}")
    if kx.dtype != vx.dtype:
        raise TypeError(f"fiattn: {names[1]} and {names[2]} must have one dtype")
    return (kx, ksh, kst, koff), (vx, vsh, vst, voff)


def fill_kv(args, kpart, vpart):
    kx, ksh, kst, koff = kpart
    vx, vsh, vst, voff = vpart
    fill_tensor(args.k, kx, ksh, kst, koff)
    fill_tensor(args.v, vx, vsh, vst, voff)


def record_paged_call(entry, key, args, batch, ts, kpart, vpart, block_tables, seq_lens,
                      sinks, total, out_rows, out_alloc, family, dts, device, sf_parts=(),
                      dev=None, lens=(), total_from=None, lse=None):
    """Memoise a checked paged-KV functional call (GQA decode, context) on its plan entry
    under `key`, for E.fast_call.

    ts: the call's tensors in the order its repeats pass them: query first, out last, and
    between them every other tensor the descriptors point into (kv_cache's, block_tables,
    seq_lens, sinks, ...), found here by identity.  kpart / vpart: unpack_kv's views;
    sf_parts: fill_sf's (NVFP4), or ().  lens: (fi_batch field name, tensor, pinned slot)
    of further length arrays the host planner reads (the context form's cum_seq_lens_q /
    _kv); total / total_from: as E.FastCall.  lse: the LSE output tensor (in ts) or None.
    The other arguments: as E.FastCall."""
    def at(x):
        return next(i for i, y in enumerate(ts) if y is x)
    ptrs = [(args.q, 0, 0), (args.k, at(kpart[0]), kpart[3] * kpart[0].element_size()),
            (args.v, at(vpart[0]), vpart[3] * vpart[0].element_size()),
            (args.page_table, at(block_tables), 0), (args.out, len(ts) - 1, 0)]
    for ft, (x, _, _, off) in zip((args.k_sf, args.v_sf), sf_parts):
        ptrs.append((ft, at(x), off * x.element_size()))
    if lse is not None:
        ptrs.append((args.lse, at(lse), 0))
    fields = (("sinks", at(flat(sinks)[0])),) if sinks is not None else ()
    E.remember(entry, key, E.FastCall(
        entry, args, batch, tuple(ptrs), ts, at(block_tables), at(seq_lens), total, out_rows,
        out_alloc, family, dts, device, fields, dev,
        tuple((name, at(x), slot) for name, x, slot in lens), total_from))


# ---- NVFP4 (e2m1 values + e4m3 block scales) ----------------------------------------------
_NVFP4 = None


def nvfp4_dtypes():
    """torch dtypes read as packed NVFP4 KV (two e2m1 values a byte, low nibble first):
    uint8 (the reference's form) and float4_e2m1fn_x2 where torch has it."""
    global _NVFP4
    if _NVFP4 is None:
        t = torch()
        _NVFP4 = (t.uint8,) + tuple(getattr(t, n) for n in ("float4_e2m1fn_x2",) if hasattr(t, n))
    return _NVFP4


def sf_dtypes():
    """torch dtypes read as e4m3 block-scale bytes: uint8 (the reference's) and float8_e4m3fn."""
    t = torch()
    return (t.uint8,) + tuple(getattr(t, n) for n in ("float8_e4m3fn",) if hasattr(t, n))


def fill_paged_kv(args, kpart, vpart, scales, kv_layout, device, head_dim,
                  sf_names=("kv_cache_sf", "k_cache_sf", "v_cache_sf")):
    """Check unpack_kv's K / V views against head_dim and fill args.k / v, and for an NVFP4
    cache (uint8 / float4_e2m1fn_x2: last dim head_dim / 2 bytes) its block scales `scales`
    (fill_sf; sf_names: the argument's name and its tuple members' names, for messages).
    Raises ValueError: a last dim that is not head_dim (NVFP4: head_dim / 2), an NVFP4 cache
    without scales, scales with another cache; fill_sf's errors.
    Returns (nvfp4, the scale parts to keep alive until the call returns, or ())."""
    nvfp4 = kpart[0].dtype in nvfp4_dtypes()
    W = head_dim // 2 if nvfp4 else head_dim
    if kpart[1][3] != W or vpart[1][3] != W:
        what = "head_dim / 2 bytes (NVFP4)" if nvfp4 else "head_dim"
        raise ValueError(f"fiattn: the caches' last dim ({kpart[1][3]}, {vpart[1][3]}) must be "
                         f"{what} = {W} (query head_dim {head_dim})")
    if nvfp4 and scales is None:
        raise ValueError(f"fiattn: a {kpart[0].dtype} KV cache is NVFP4 (two e2m1 values a "
                         f"byte) and needs its block scales, {sf_names[0]}")
    if not nvfp4 and scales is not None:
        raise ValueError(f"fiattn: {sf_names[0]} belongs to an NVFP4 (uint8) KV cache, this "
                         f"one is {kpart[0].dtype}")
    if not nvfp4:
        fill_kv(args, kpart, vpart)
        return False, ()
    # bytes: shape and strides as given, dtype E2M1
    args.k.set(kpart[0].data_ptr() + kpart[3], C.FI_DTYPE_E2M1, kpart[1], kpart[2])
    args.v.set(vpart[0].data_ptr() + vpart[3], C.FI_DTYPE_E2M1, vpart[1], vpart[2])
    return True, fill_sf(args, scales, kv_layout, device, kpart, head_dim, sf_names)


def fill_sf(args, kv_cache_sf, kv_layout, device, kpart, head_dim,
            names=("kv_cache_sf", "k_cache_sf", "v_cache_sf")):
    """Check the NVFP4 block scales against the KV views and fill args.k_sf / v_sf.

    kv_cache_sf: the kv_cache forms with head_dim / 16 scale bytes as the last dim:
    [num_pages, 1 or 2, page_size, H_kv, D / 16] (NHD) / [num_pages, 1 or 2, H_kv, page_size,
    D / 16] (HND), or a (k_sf, v_sf) tuple of 4-D tensors; uint8 or float8_e4m3fn.
    names: the argument's name and its tuple members' names (messages).
    Raises TypeError / ValueError (dtype, dims, a shape that disagrees with the cache), or
    FiattnValueError with the status fi_run returns for a layout the GPU families cannot
    read (gqa_check_sf: FI_ERR_MISALIGNED_POINTER for a base, FI_ERR_BAD_STRIDE for an outer
    stride, not a multiple of the D / 16-byte row), so CPU and GPU calls fail alike.
    Returns the two parts (kept alive by the caller until the call returns)."""
    from .errors import error_for_status
    ksf, vsf = unpack_kv(kv_cache_sf, kv_layout, device, sf_dtypes(), names)
    row = head_dim // 16
    want = [kpart[1][0], kpart[1][1], kpart[1][2], row]
    for (x, sh, st, off), name in ((ksf, names[1]), (vsf, names[2])):
        if sh[0] < want[0] or sh[1:] != want[1:]:
            raise ValueError(f"fiattn: {name} must be [num_pages >= {want[0]}, page_size "
                             f"{want[1]}, H_kv {want[2]}, head_dim / 16 = {row}] (in the "
                             f"layout's axis order), got {sh}")
        base = x.data_ptr() + off * x.element_size()
        status = None
        if base % row:
            status = C.FI_ERR_MISALIGNED_POINTER
        elif any(s < 0 or (s * x.element_size()) % row for s in st[:3]):
            status = C.FI_ERR_BAD_STRIDE
        if status is not None:
            sname = C.status_name(status)
            raise error_for_status(status, sname, f"fiattn: {name}: {sname} (the GPU families "
                                   f"read {row}-byte scale rows: base address and page / "
                                   f"token / head strides must be multiples of {row} bytes; "
                                   f"got base %{row} = {base % row}, strides {st[:3]})")
    for ft, (x, sh, st, off) in ((args.k_sf, ksf), (args.v_sf, vsf)):
        ft.set(x.data_ptr() + off * x.element_size(), C.FI_DTYPE_E4M3, sh, st)
    return ksf, vsf
