"""ctypes binding of the fiattn C ABI (include/fiattn.h, fiattn_run.h, fiattn_ref.h).

Everything here works without torch: the structures mirror the C layout field by field
(python/tests/test_abi.py compares sizeof / offsetof with a C program built from the
headers), the library is located and its prototypes declared once, and every fi_status
becomes a Python exception through :func:`check`.

Library lookup order (first that exists wins):

1. ``$FIATTN_LIBRARY`` (a path to libfiattn.so);
2. the copy bundled in the installed package (``fiattn/libfiattn.so``, put there by
   ``pip install ./python``);
3. the source tree's ``build/libfiattn.so`` (running from a checkout after ``make lib``);
4. ``libfiattn.so.0`` on the loader path (``make install``).
"""
import ctypes
import os
import threading

from .errors import error_for_status

# ---- enums (values fixed forever by the C headers) ------------------------------------
FI_OK = 0
FI_ERR_UNSUPPORTED_KIND = 3
FI_ERR_UNSUPPORTED_DTYPE = 6
FI_ERR_PAGE_INDEX_OUT_OF_RANGE = 15
FI_ERR_WORKSPACE_TOO_SMALL = 17
FI_ERR_STREAM_CAPTURING = 19
FI_ERR_SHAPE_MISMATCH = 25
FI_ERR_BAD_STRIDE = 26
FI_ERR_MISALIGNED_POINTER = 27
FI_ERR_INVALID_ARGUMENT = 29

FI_KIND_MLA_DECODE = 1
FI_KIND_GQA_DECODE = 2
FI_KIND_CONTEXT = 3
KIND_NAMES = {1: "MLA decode", 2: "GQA decode", 3: "context (prefill)"}

FI_DTYPE_F32 = 1
FI_DTYPE_F16 = 2
FI_DTYPE_BF16 = 3
FI_DTYPE_E4M3 = 4
FI_DTYPE_I32 = 5
FI_DTYPE_E5M2 = 6
FI_DTYPE_E2M1 = 7
DTYPE_NAMES = {1: "fp32", 2: "fp16", 3: "bf16", 4: "fp8 e4m3", 5: "int32", 6: "fp8 e5m2",
               7: "nvfp4 e2m1"}

FI_FORM_BLOCK_TABLES = 1
FI_FORM_INDPTR = 2
FI_FORM_CUM_SEQ_LENS = 3

FI_MAX_DIMS = 5


class fi_caps(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int),
        ("max_batch", ctypes.c_int32),
        ("max_q_tokens", ctypes.c_int32),
        ("num_pages", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("num_qo_heads", ctypes.c_int32),
        ("num_kv_heads", ctypes.c_int32),
        ("head_dim_qk", ctypes.c_int32),
        ("head_dim_vo", ctypes.c_int32),
        ("q_dtype", ctypes.c_int),
        ("kv_dtype", ctypes.c_int),
        ("o_dtype", ctypes.c_int),
        ("num_ctas", ctypes.c_int32),
        ("variant", ctypes.c_int32),
        ("sparse_top_k", ctypes.c_int32),
    ]


class fi_error_detail(ctypes.Structure):
    _fields_ = [
        ("status", ctypes.c_int),
        ("needed", ctypes.c_int64),
        ("limit", ctypes.c_int64),
        ("request", ctypes.c_int32),
        ("cuda_error", ctypes.c_int32),
    ]


_I32P = ctypes.POINTER(ctypes.c_int32)


class fi_batch(ctypes.Structure):
    _fields_ = [
        ("form", ctypes.c_int),
        ("batch_size", ctypes.c_int32),
        ("block_tables", ctypes.c_void_p),
        ("max_pages_per_seq", ctypes.c_int32),
        ("kv_split_pages", ctypes.c_int32),
        ("seq_lens", ctypes.c_void_p),
        ("q_len_per_request", ctypes.c_int32),
        ("qo_indptr", ctypes.c_void_p),
        ("kv_indptr", ctypes.c_void_p),
        ("kv_indices", ctypes.c_void_p),
        ("kv_len", ctypes.c_void_p),
        ("cum_seq_lens_q", ctypes.c_void_p),
        ("cum_seq_lens_kv", ctypes.c_void_p),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
    ]


class fi_device_batch(ctypes.Structure):
    """fiattn.h fi_device_batch: a fi_batch over device arrays plus declared capacities."""
    _fields_ = [
        ("batch", fi_batch),
        ("batch_size", ctypes.c_void_p),
        ("max_q_tokens", ctypes.c_int32),
        ("kv_indices_len", ctypes.c_int32),
    ]


class fi_tensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * FI_MAX_DIMS),
        ("stride", ctypes.c_int64 * FI_MAX_DIMS),
    ]

    def set(self, data, dtype, shape, stride):
        """Fill the descriptor: data (int address or 0), fi_dtype, shape / element strides."""
        self.data = data
        self.dtype = dtype
        n = len(shape)
        self.ndim = n
        self.shape[:n] = shape
        self.stride[:n] = stride
        return self


class fi_attn_args(ctypes.Structure):
    _fields_ = [
        ("q", fi_tensor),
        ("q_rope", fi_tensor),
        ("k", fi_tensor),
        ("k_rope", fi_tensor),
        ("v", fi_tensor),
        ("page_table", fi_tensor),
        ("out", fi_tensor),
        ("lse", fi_tensor),
        ("bmm1_scale", ctypes.c_float),
        ("bmm2_scale", ctypes.c_float),
        ("bmm1_scale_ptr", ctypes.c_void_p),
        ("bmm2_scale_ptr", ctypes.c_void_p),
        ("sinks", ctypes.c_void_p),
        ("enable_pdl", ctypes.c_int32),
        # appended in 0.2
        ("o_scale", ctypes.c_float),
        ("k_sf", fi_tensor),
        ("v_sf", fi_tensor),
        # appended in 0.3
        ("skip_softmax_threshold_scale_factor", ctypes.c_float),
        ("skip_softmax_stats", ctypes.c_void_p),
        # appended in 0.3 (NVFP4 out)
        ("o_sf", fi_tensor),
        ("o_sf_scale", ctypes.c_float),
        ("o_sf_vec_size", ctypes.c_int32),
    ]


ALLOC_FN = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t)
FREE_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p)


class fi_allocator(ctypes.Structure):
    _fields_ = [("alloc", ALLOC_FN), ("free", FREE_FN), ("ctx", ctypes.c_void_p)]


# ---- library --------------------------------------------------------------------------
_here = os.path.dirname(os.path.abspath(__file__))
_lib = None
_lib_path = None
_lock = threading.Lock()


def _candidates():
    env = os.environ.get("FIATTN_LIBRARY")
    if env:
        return [env]  # an explicit override is never silently bypassed
    return [
        os.path.join(_here, "libfiattn.so"),
        os.path.join(_here, "..", "..", "build", "libfiattn.so"),
        "libfiattn.so.0",
    ]


def _declare(lib):
    c = ctypes
    P = c.c_void_p
    sig = {
        "fi_status_name": (c.c_char_p, [c.c_int]),
        "fi_caps_validate": (c.c_int, [c.POINTER(fi_caps)]),
        "fi_workspace_size": (c.c_int, [c.POINTER(fi_caps), c.POINTER(c.c_size_t)]),
        "fi_plan_create": (c.c_int, [c.POINTER(fi_caps), P, c.c_size_t,
                                     c.POINTER(fi_allocator), c.POINTER(P)]),
        "fi_plan_destroy": (None, [P]),
        "fi_plan_update": (c.c_int, [P, c.POINTER(fi_batch), P]),
        "fi_plan_error": (fi_error_detail, [P]),
        "fi_plan_caps": (c.POINTER(fi_caps), [P]),
        "fi_plan_balance": (c.c_double, [P]),
        "fi_run": (c.c_int, [P, c.POINTER(fi_attn_args), P]),
        "fi_ref_run": (c.c_int, [P, c.POINTER(fi_attn_args)]),
        "fi_naive_attention": (c.c_int, [c.POINTER(fi_caps), c.POINTER(fi_batch),
                                         c.POINTER(fi_attn_args)]),
    }
    for name, (res, args) in sig.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args
    # Optional (added with the Python layer); older libraries lack it.
    fn = getattr(lib, "fi_run_supported", None)
    if fn is not None:
        fn.restype = c.c_int
        fn.argtypes = [c.POINTER(fi_caps)]
    # Optional (libraries before it lack it): host-to-device staging of index arrays.
    fn = getattr(lib, "fi_copy_to_device", None)
    if fn is not None:
        fn.restype = c.c_int
        fn.argtypes = [P, P, c.c_size_t, P]
    # Optional (the device planner, issue 17).
    fn = getattr(lib, "fi_plan_update_device", None)
    if fn is not None:
        fn.restype = c.c_int
        fn.argtypes = [P, c.POINTER(fi_device_batch), c.c_int, P]
    fn = getattr(lib, "fi_plan_device_error", None)
    if fn is not None:
        fn.restype = c.c_int
        fn.argtypes = [P, c.POINTER(fi_error_detail), P]
    fn = getattr(lib, "fi_caps_parallel_variant", None)
    if fn is not None:
        fn.restype = c.c_int
        fn.argtypes = [c.POINTER(fi_caps), c.POINTER(c.c_int32)]
    return lib


def lib():
    """The loaded libfiattn (ctypes.CDLL), loaded on first use.

    Raises OSError naming every path tried when none loads."""
    global _lib, _lib_path
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            tried = []
            for p in _candidates():
                if os.sep in p and not os.path.exists(p):
                    tried.append(p + " (missing)")
                    continue
                try:
                    l = ctypes.CDLL(p)
                except OSError as e:
                    tried.append(f"{p} ({e})")
                    continue
                _lib_path = os.path.realpath(p) if os.sep in p else p
                _lib = _declare(l)
                break
            if _lib is None:
                raise OSError("fiattn: cannot load libfiattn.so; tried: " + "; ".join(tried) +
                              ". Set FIATTN_LIBRARY to its path, run `make lib` in the "
                              "source tree, or `pip install ./python`.")
    return _lib


def library_path():
    """Path of the loaded libfiattn (loads it if needed)."""
    lib()
    return _lib_path


def status_name(status):
    """fi_status_name(status): 'FI_ERR_BATCH_OVER_CAPS', or 'FI_STATUS_UNKNOWN'."""
    return lib().fi_status_name(int(status)).decode()


def _detail_text(d):
    parts = []
    if d.request >= 0:
        parts.append(f"request {d.request}")
    if d.needed >= 0:
        parts.append(f"needed {d.needed}")
    if d.limit >= 0:
        parts.append(f"limit {d.limit}")
    if d.cuda_error:
        parts.append(f"cudaError {d.cuda_error}")
    return ", ".join(parts)


def check(status, what, plan=None, context=""):
    """Raise the FiattnError subclass of a non-FI_OK status.

    The message carries fi_status_name(status), fi_plan_error(plan)'s detail when a plan is
    given, and `context`.  Unknown (future) status values map to FiattnError."""
    if status == FI_OK:
        return
    name = status_name(status)
    detail = None
    if plan:
        d = lib().fi_plan_error(plan)
        if d.status == status:
            detail = d
    msg = f"{what}: {name}"
    if detail is not None:
        t = _detail_text(detail)
        if t:
            msg += f" ({t})"
    if context:
        msg += f"; {context}"
    raise error_for_status(status, name, msg, detail)


def workspace_size(caps):
    """Bytes of device workspace a plan with `caps` (fi_caps) needs.  Raises FiattnError."""
    n = ctypes.c_size_t(0)
    check(lib().fi_workspace_size(ctypes.byref(caps), ctypes.byref(n)), "fi_workspace_size")
    return n.value


def run_supported(caps):
    """fi_run_supported(caps) status (FI_OK when a GPU family runs the caps' kind).

    Libraries built before fi_run_supported existed answer FI_OK for MLA decode only."""
    fn = getattr(lib(), "fi_run_supported", None)
    if fn is None:
        return FI_OK if caps.kind == FI_KIND_MLA_DECODE else FI_ERR_UNSUPPORTED_KIND
    return fn(ctypes.byref(caps))
