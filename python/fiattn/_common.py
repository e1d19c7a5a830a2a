"""Argument handling shared by the public modules (internal)."""
import ctypes
import math
import os

from . import _capi as C
from ._torch import torch, check_tensor, fi_dtype, i32_dtypes

LOG2E = 1.0 / math.log(2.0)


def cpu_ctas():
    """CTAs of a CPU-path (host) plan: $FIATTN_CPU_CTAS, default 8 (small, so the CPU
    path splits requests and exercises the merge)."""
    return int(os.environ.get("FIATTN_CPU_CTAS", "8"))


def num_ctas_for(device, sm_count=None):
    if device.type == "cpu":
        return int(sm_count) if sm_count else cpu_ctas()
    return int(sm_count) if sm_count else 0  # 0: the SM count of the current device


def check_device(x, name, device):
    if x.device != device:
        raise ValueError(f"fiattn: {name} is on {x.device}, the call runs on {device}")


def require_device(device):
    if device.type not in ("cuda", "cpu"):
        raise ValueError(f"fiattn: tensors on {device} are not supported (cuda or cpu)")
    if device.type == "cuda":
        t = torch()
        if t.cuda.current_device() != (device.index if device.index is not None else 0):
            raise ValueError(f"fiattn: inputs are on {device} but the current CUDA device is "
                             f"cuda:{t.cuda.current_device()} (use torch.cuda.device(...))")


def set_scale(args, which, value, device, name):
    """bmm1 / bmm2 scale: a number, or a one-element fp32 tensor on the call's device (read
    by the kernel at run time, so it may change between CUDA graph replays)."""
    t = torch()
    if isinstance(value, t.Tensor):
        check_tensor(value, name, (t.float32,), device)
        if value.numel() != 1:
            raise ValueError(f"fiattn: {name} tensor must hold one element, got {value.numel()}")
        setattr(args, which + "_ptr", value.data_ptr())
        setattr(args, which, 1.0)
        return value
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"fiattn: {name} must be a float or a float32 tensor") from None
    if not math.isfinite(v):
        raise ValueError(f"fiattn: {name} must be finite, got {v}")
    setattr(args, which, v)
    return None


def set_sinks(args, sinks, heads, device):
    """sinks: None, a float32 tensor [num_qo_heads] (one logit per query head), or a list /
    tuple holding exactly one such tensor (the reference's List[Tensor] form)."""
    if sinks is None:
        return None
    t = torch()
    if isinstance(sinks, (list, tuple)):
        if len(sinks) != 1:
            raise ValueError(f"fiattn: sinks as a list must hold one tensor, got {len(sinks)}")
        sinks = sinks[0]
    check_tensor(sinks, "sinks", (t.float32,), device)
    if sinks.numel() != heads or not sinks.is_contiguous():
        raise ValueError(f"fiattn: sinks must be a contiguous float32 tensor of {heads} "
                         f"elements (one per query head), got shape {tuple(sinks.shape)}")
    args.sinks = sinks.data_ptr()
    return sinks


def set_pdl(args, enable_pdl, device):
    if enable_pdl is None:
        enable_pdl = device.type == "cuda"  # every GPU fiattn runs on is sm_90
    args.enable_pdl = 1 if enable_pdl else 0


def check_block_tables(bt, name, device, batch=None, ndim=2):
    check_tensor(bt, name, i32_dtypes(), device, ndim)
    if batch is not None and bt.shape[0] != batch:
        raise ValueError(f"fiattn: {name} has {bt.shape[0]} rows, the batch has {batch}")
    if not bt.is_contiguous():
        raise ValueError(f"fiattn: {name} must be contiguous (row stride = its width)")
    return bt


def check_lengths(x, name, n, ndim=1):
    """An int32 / uint32 length or offset array of n elements (any device: it is read on
    the host)."""
    check_tensor(x, name, i32_dtypes(), None, None, last_contiguous=False)
    if x.numel() != n:
        raise ValueError(f"fiattn: {name} must have {n} elements, got shape {tuple(x.shape)}")
    return x.reshape(n) if x.dim() != 1 else x


def token_view(x, name, lead):
    """Shape / strides of x's first `lead` dims merged into one token axis, then the rest.
    Raises ValueError when the leading dims cannot be merged without a copy."""
    shape, stride = list(x.shape), list(x.stride())
    n = 1
    for d in shape[:lead]:
        n *= d
    # the innermost lead dim with extent > 1 gives the token stride; outer ones must nest
    tok = None
    inner = None
    for i in range(lead - 1, -1, -1):
        if shape[i] == 1:
            continue
        if tok is None:
            tok, inner = stride[i], shape[i] * stride[i]
        else:
            if stride[i] != inner:
                raise ValueError(f"fiattn: {name}'s leading dims {tuple(shape[:lead])} with "
                                 f"strides {tuple(stride[:lead])} cannot be read as one "
                                 f"token axis (make it contiguous)")
            inner = shape[i] * stride[i]
    if tok is None:
        tok = 0  # a single token: its stride is never used
    return [n] + shape[lead:], [tok] + stride[lead:]


def dtypes_text(q, kv, o):
    return (f"q {C.DTYPE_NAMES.get(fi_dtype(q), q)}, kv {C.DTYPE_NAMES.get(fi_dtype(kv), kv)}, "
            f"out {C.DTYPE_NAMES.get(fi_dtype(o), o)}")


def fill_tensor(ft, x, shape, stride, offset=0):
    ft.set(x.data_ptr() + offset * x.element_size(), fi_dtype(x.dtype), shape, stride)


# ---- the functional APIs' repeat calls (E.FastCall keys and refreshes) ------------------
NUM = (float, int)  # scale types the fast paths take (tensor scales go the checked way)


def sig_arg(x, sig):
    """Signature of an argument that is a tensor, a tuple / list of tensors, or None."""
    if x is None:
        return None
    if isinstance(x, (tuple, list)):
        # from a list, not a generator: a tuple of unknown length is made large and then
        # shrunk, which grows the interpreter's small-tuple free list at every call
        return tuple([sig(e) for e in x])
    return sig(x)


def flat(x):
    """The tensors of a tensor / tuple / list / None argument, in order."""
    if x is None:
        return ()
    if isinstance(x, (tuple, list)):
        return tuple(x)
    return (x,)


def finite_scalar(v, name):
    """A finite float from a number (the fast paths' check of bmm1 / bmm2 / o_scale)."""
    f = float(v)
    if not math.isfinite(f):
        raise ValueError(f"fiattn: {name} must be finite, got {f}")
    return f


def last_i32(x):
    """x[-1] of a contiguous host int32 / uint32 tensor with at least one element, read
    directly (int32 bits)."""
    return ctypes.c_int32.from_address(x.data_ptr() + 4 * (x.numel() - 1)).value
