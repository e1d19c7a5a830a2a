"""Merging attention states computed over disjoint KV sets.

A state is (v, s): v the attention output normalised over its own keys, s its log-sum-exp
of logits.  fiattn's convention is the natural log (lse = log(sum_j exp(s_j))), which is
what fi_run / fi_ref_run write.  FlashInfer's merge_state / merge_states and its MLA
wrapper's default LSE use base 2: pass ``base=2`` (or convert: lse_e = lse_2 * ln 2).

Merge (flash-decoding / FlashInfer cascade algebra, Dao et al. 2023)::

    S = log(sum_i exp(s_i)),   V = sum_i exp(s_i - S) v_i

computed in fp32 with the maximum subtracted first; a state with s = -inf (no keys)
contributes nothing, and when every state is empty V = 0 and S = -inf (never NaN).
Works on CPU and CUDA tensors, capturable (plain torch ops), allocates its outputs.
"""
import math

from ._torch import torch

__all__ = ["merge_state", "merge_states"]

_LN2 = math.log(2.0)


def _to_e(s, base):
    if base in ("e", math.e, None):
        return s.float()
    if base == 2:
        return s.float() * _LN2
    raise ValueError(f"fiattn: base must be 'e' or 2, got {base!r}")


def _from_e(s, base):
    return s if base in ("e", math.e, None) else s / _LN2


def merge_states(v, s, base="e"):
    """Merge num_states states per (token, head).

    Args:
        v: [seq_len, num_states, num_heads, head_dim], float16 / bfloat16 / float32.
        s: [seq_len, num_states, num_heads] float32 log-sum-exp (natural log; base=2 for
            FlashInfer's log2 LSE).
        base: "e" (default) or 2, the base of s and of the returned S.
    Returns: (V [seq_len, num_heads, head_dim] in v's dtype, S [seq_len, num_heads] fp32).
    Raises ValueError on mismatched shapes.
    """
    t = torch()
    if v.dim() != 4 or s.dim() != 3 or tuple(v.shape[:3]) != tuple(s.shape):
        raise ValueError(f"fiattn: merge_states wants v [n, states, heads, dim] and s [n, "
                         f"states, heads], got {tuple(v.shape)} / {tuple(s.shape)}")
    se = _to_e(s, base)
    m = se.amax(dim=1, keepdim=True)
    m = t.where(t.isfinite(m), m, t.zeros_like(m))
    w = t.exp(se - m)                       # [n, states, heads]; exp(-inf) = 0
    den = w.sum(dim=1)                      # [n, heads]
    num = (w.unsqueeze(-1) * v.float()).sum(dim=1)
    safe = t.where(den > 0, den, t.ones_like(den))
    V = t.where((den > 0).unsqueeze(-1), num / safe.unsqueeze(-1), t.zeros_like(num))
    S = t.where(den > 0, t.log(safe) + m.squeeze(1), t.full_like(den, -math.inf))
    return V.to(v.dtype), _from_e(S, base)


def merge_state(v_a, s_a, v_b, s_b, base="e"):
    """Merge two states.

    Args:
        v_a, v_b: [seq_len, num_heads, head_dim] outputs over disjoint KV sets.
        s_a, s_b: [seq_len, num_heads] float32 log-sum-exp (natural log; base=2 for
            FlashInfer's convention).
    Returns: (V [seq_len, num_heads, head_dim] in v_a's dtype, S [seq_len, num_heads] fp32).
    """
    t = torch()
    if v_a.shape != v_b.shape or s_a.shape != s_b.shape or tuple(v_a.shape[:2]) != tuple(s_a.shape):
        raise ValueError("fiattn: merge_state wants v [n, heads, dim] and s [n, heads] pairs "
                         "of equal shapes")
    return merge_states(t.stack([v_a, v_b], dim=1), t.stack([s_a, s_b], dim=1), base)
