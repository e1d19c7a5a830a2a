"""torch fp64 references of the attention fiattn computes (fiattn_run.h, DESIGN.md 7)."""
import math

import torch


def paged_attention_ref(q, k_pages, v_pages, page_rows, kv_lens, q_lens, q_offsets, scale,
                        bmm2=1.0, causal=True, window_left=-1, sinks=None):
    """q: [tokens, H, Dqk]; k_pages: [num_pages, page_size, H_kv, Dqk]; v_pages:
    [num_pages, page_size, H_kv, Dvo]; page_rows: list of per-request page index lists.
    Returns (out [tokens, H, Dvo] fp64, lse [tokens, H] natural log)."""
    q = q.double()
    k_pages, v_pages = k_pages.double(), v_pages.double()
    T, H, _ = q.shape
    Hkv = k_pages.shape[2]
    g = H // Hkv
    ps = k_pages.shape[1]
    out = torch.zeros(T, H, v_pages.shape[-1], dtype=torch.float64)
    lse = torch.full((T, H), -math.inf, dtype=torch.float64)
    for b, (kv_len, ql, qo) in enumerate(zip(kv_lens, q_lens, q_offsets)):
        if kv_len == 0:
            continue
        pages = page_rows[b]
        idx = torch.tensor([pages[tk // ps] for tk in range(kv_len)], dtype=torch.long)
        slot = torch.arange(kv_len) % ps
        K = k_pages[idx, slot]  # [kv, Hkv, D]
        V = v_pages[idx, slot]
        for i in range(ql):
            p = kv_len - ql + i
            hi = p if causal else kv_len - 1
            lo = max(0, p - window_left) if window_left >= 0 else 0
            if hi < lo:
                continue
            for h in range(H):
                kh = h // g
                s = scale * (K[lo:hi + 1, kh] @ q[qo + i, h])
                m = s.max()
                if sinks is not None:
                    m = max(m, torch.tensor(float(sinks[h]), dtype=torch.float64))
                e = torch.exp(s - m)
                den = e.sum() + (math.exp(float(sinks[h]) - float(m)) if sinks is not None else 0.0)
                out[qo + i, h] = bmm2 * (e @ V[lo:hi + 1, kh]) / den
                lse[qo + i, h] = math.log(den) + float(m)
    return out, lse


def split_pages(bt, lens, ps):
    """Cut every request's pages in two for context-parallel checks: part 0 is its first
    ceil(pages / 2) pages, part 1 the rest (no key for a one-page request).  bt: int32
    [B, P] block tables, lens: int32 [B] KV lengths (tokens), ps: page size.  Returns
    [(block_tables [B, P] int32, seq_lens [B] int32)] for the two parts, on bt's / lens'
    devices; unused table entries are 0."""
    parts = []
    for first in (True, False):
        rows, part_lens = torch.zeros_like(bt), []
        for b, n in enumerate(lens.tolist()):
            half = ((n + ps - 1) // ps + 1) // 2
            sel = bt[b, :half] if first else bt[b, half:(n + ps - 1) // ps]
            rows[b, :len(sel)] = sel
            part_lens.append(min(n, half * ps) if first else max(0, n - half * ps))
        parts.append((rows, torch.tensor(part_lens, dtype=torch.int32, device=lens.device)))
    return parts


def rel_err(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / max(b.norm(), 1e-30))


# e2m1 code (sign bit 3, exponent bits 2..1, mantissa bit 0) -> value
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
               -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def e4m3_bytes_to_float(b):
    """uint8 tensor of fp8 e4m3 bit patterns -> float64 tensor (0x7f / 0xff are NaN)."""
    b = b.to(torch.int64)
    e = (b >> 3) & 0xF
    m = (b & 7).double()
    mag = torch.where(e == 0, m * 2.0 ** -9, (8 + m) * torch.pow(2.0, (e - 10).double()))
    mag = torch.where((e == 15) & ((b & 7) == 7), torch.full_like(mag, math.nan), mag)
    return torch.where((b & 0x80) != 0, -mag, mag)


def nvfp4_dequant(packed, sf):
    """NVFP4 -> float64: packed uint8 [..., D / 2] (two e2m1 values a byte, low nibble =
    the even element) and e4m3 block-scale bytes sf [..., D / 16]; element d =
    e2m1(d) x sf[d // 16] (the global scale is applied by the caller's bmm scales)."""
    lut = torch.tensor(E2M1_VALUES, dtype=torch.float64)
    p = packed.to(torch.int64)
    vals = torch.stack([lut[p & 0xF], lut[p >> 4]], dim=-1).flatten(-2)  # [..., D]
    scale = e4m3_bytes_to_float(sf).repeat_interleave(16, dim=-1)
    return vals * scale
