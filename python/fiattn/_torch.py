"""Lazy torch import and tensor -> fi_tensor helpers (internal)."""
from . import _capi as C

_torch = None


def torch():
    """The torch module; ImportError with an install hint when torch is missing."""
    global _torch
    if _torch is None:
        try:
            import torch as t
        except ImportError as e:  # pragma: no cover - exercised by test_no_torch
            raise ImportError(
                "fiattn: this function takes torch tensors and needs PyTorch "
                "(pip install torch); the C-level helpers (fiattn.capi, fiattn.workspace_size, "
                "fiattn.status_name) work without it") from e
        _torch = t
    return _torch


_DTYPES = None


def fi_dtype(dt):
    """fi_dtype of a torch dtype, or None."""
    global _DTYPES
    if _DTYPES is None:
        t = torch()
        m = {t.float32: C.FI_DTYPE_F32, t.float16: C.FI_DTYPE_F16,
             t.bfloat16: C.FI_DTYPE_BF16, t.int32: C.FI_DTYPE_I32}
        for name, v in (("float8_e4m3fn", C.FI_DTYPE_E4M3), ("float8_e5m2", C.FI_DTYPE_E5M2),
                        ("uint32", C.FI_DTYPE_I32)):
            if hasattr(t, name):
                m[getattr(t, name)] = v
        _DTYPES = m
    return _DTYPES.get(dt)


def check_tensor(x, name, dtypes=None, device=None, ndim=None, last_contiguous=True):
    """Validate a tensor argument before any C call (TypeError / ValueError)."""
    t = _torch if _torch is not None else torch()
    if not isinstance(x, t.Tensor):
        raise TypeError(f"fiattn: {name} must be a torch.Tensor, got {type(x).__name__}")
    if dtypes is not None and x.dtype not in dtypes:
        raise TypeError(f"fiattn: {name} has dtype {x.dtype}; expected one of "
                        + ", ".join(str(d) for d in dtypes))
    if device is not None and x.device != device:
        raise ValueError(f"fiattn: {name} is on {x.device}, the call runs on {device}")
    if ndim is not None and x.dim() not in ((ndim,) if isinstance(ndim, int) else ndim):
        raise ValueError(f"fiattn: {name} must have {ndim} dims, got shape {tuple(x.shape)}")
    if last_contiguous and x.dim() > 0 and x.shape[-1] > 1 and x.stride(-1) != 1:
        raise ValueError(f"fiattn: {name} must be contiguous in its last dimension "
                         f"(stride {x.stride(-1)})")
    return x


_FLOAT = _FP8 = _I32 = None


def float_dtypes():
    global _FLOAT
    if _FLOAT is None:
        t = torch()
        _FLOAT = (t.float32, t.float16, t.bfloat16)
    return _FLOAT


def fp8_dtypes():
    global _FP8
    if _FP8 is None:
        t = torch()
        _FP8 = tuple(getattr(t, n) for n in ("float8_e4m3fn", "float8_e5m2") if hasattr(t, n))
    return _FP8


def i32_dtypes():
    global _I32
    if _I32 is None:
        t = torch()
        _I32 = (t.int32, t.uint32) if hasattr(t, "uint32") else (t.int32,)
    return _I32


def set_tensor(ft, x, shape=None, stride=None, offset=0, dtype=None):
    """Fill fi_tensor `ft` from torch tensor x (optionally a view: shape / element strides /
    element offset given explicitly)."""
    if shape is None:
        shape = tuple(x.shape)
    if stride is None:
        stride = x.stride()
    ptr = x.data_ptr() + offset * x.element_size()
    ft.set(ptr, dtype if dtype is not None else fi_dtype(x.dtype), shape, stride)
    return ft
