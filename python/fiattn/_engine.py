"""Plan cache and execution shared by every public API (internal).

One plan per workspace buffer: the functional APIs (which take a workspace_buffer and no
plan object) look their plan up by the buffer's address, re-plan it on the host for every
call (fi_plan_update: no allocation, no device sync) and run.  A plan is created (host
allocation, one synchronous zeroing of the workspace's semaphores) only when none exists
for the buffer or its caps no longer cover the call (another head count, dtype, page size,
KV cache size, or a batch / query-token count above the plan's rounded-up capacity).
The cache keeps a reference to the workspace tensor so its memory cannot be reused under
a live plan; fiattn.release_workspace(buf) / fiattn.clear_plan_cache() drop it.
"""
import contextlib
import ctypes
import threading

from . import _capi as C
from ._torch import torch
from .errors import FiattnError, FiattnNotImplementedError, WorkspaceTooSmallError

# Statistics the tests read: plans created since import.
stats = {"plans_created": 0, "plans_destroyed": 0}

_state = threading.local()


def _plan_only():
    return getattr(_state, "plan_only", False)


@contextlib.contextmanager
def plan_only():
    """Inside this context the functional APIs plan (fi_plan_update) and return without
    launching anything: use it before replaying a CUDA graph that captured those calls,
    with the step's new block_tables / seq_lens, so the captured kernels read the new plan
    from the workspace.  The returned `out` is not written."""
    prev = _plan_only()
    _state.plan_only = True
    try:
        yield
    finally:
        _state.plan_only = prev


def _pow2(n, floor=8):
    p = floor
    while p < n:
        p *= 2
    return p


class PlanEntry:
    """One fi_plan over one workspace buffer (or a host plan for the CPU path)."""

    def __init__(self, caps, workspace, host):
        self.caps = caps
        self.key = caps_key(caps)
        self.workspace = workspace  # strong reference: the plan lives in its memory
        self.host = host
        self.plan = ctypes.c_void_p()
        self.planned = False
        self.bufs = {}
        self.captured_rows = None  # smallest out row count captured in a CUDA graph
        if host:
            st = C.lib().fi_plan_create(ctypes.byref(caps), None, 0, None,
                                        ctypes.byref(self.plan))
        else:
            nbytes = workspace.numel() * workspace.element_size()
            st = C.lib().fi_plan_create(ctypes.byref(caps), ctypes.c_void_p(workspace.data_ptr()),
                                        nbytes, None, ctypes.byref(self.plan))
        C.check(st, "fi_plan_create")
        stats["plans_created"] += 1

    def destroy(self):
        if self.plan:
            try:
                C.lib().fi_plan_destroy(self.plan)
            except Exception:  # pragma: no cover - interpreter shutdown
                pass
            self.plan = ctypes.c_void_p()
            stats["plans_destroyed"] += 1

    def __del__(self):
        self.destroy()

    def host_i32(self, slot, x):
        """A host int32 view of tensor x (int32 / uint32): x itself when it is a contiguous
        CPU tensor, else a copy into this entry's pinned buffer `slot` (grown, never
        shrunk).  Device copies are asynchronous; call sync() before reading."""
        t = torch()
        if x.dtype != t.int32:
            x = x.view(t.int32)
        if x.device.type == "cpu":
            return x if x.is_contiguous() else x.contiguous()
        n = x.numel()
        buf = self.bufs.get(slot)
        if buf is None or buf.numel() < n:
            buf = t.empty(max(n, 64) * 2, dtype=t.int32, pin_memory=True)
            self.bufs[slot] = buf
        h = buf[:n].view(x.shape)
        h.copy_(x, non_blocking=True)
        self._pending = True
        return h

    def sync(self):
        if getattr(self, "_pending", False):
            torch().cuda.current_stream().synchronize()
            self._pending = False


def caps_key(caps):
    return tuple(getattr(caps, f) for f, _ in C.fi_caps._fields_)


_cache = {}
_cache_lock = threading.Lock()
_supported = {}


def clear_plan_cache():
    """Destroy every cached plan and drop the workspace references the cache holds."""
    with _cache_lock:
        for e in _cache.values():
            e.destroy()
        _cache.clear()


def release_workspace(workspace_buffer):
    """Destroy the plan cached for `workspace_buffer` (if any) and drop its reference."""
    with _cache_lock:
        e = _cache.pop(_ws_key(workspace_buffer), None)
    if e is not None:
        e.destroy()


def _ws_key(ws):
    return (str(ws.device), ws.data_ptr())


def cached_entry(workspace_buffer):
    """The PlanEntry cached for a workspace buffer, or None (tests, examples)."""
    return _cache.get(_ws_key(workspace_buffer))


def kind_supported_on_gpu(caps):
    """Raise FiattnNotImplementedError when fi_run has no GPU family for the caps' kind."""
    k = (caps.kind, caps.variant)
    st = _supported.get(k)
    if st is None:
        st = C.run_supported(caps)
        _supported[k] = st
    if st == C.FI_ERR_UNSUPPORTED_KIND:
        raise FiattnNotImplementedError(
            f"fiattn: {C.KIND_NAMES.get(caps.kind, caps.kind)} has no GPU executor yet "
            f"(fi_run_supported: FI_ERR_UNSUPPORTED_KIND); the CPU reference runs it for CPU "
            f"tensors", status=st, status_name="FI_ERR_UNSUPPORTED_KIND")


def get_entry(workspace, caps, batch_size, q_tokens, host, capturing, fixed_sizes=False):
    """The plan for (workspace, caps): reuse the cached one when its caps equal `caps` in
    every field but max_batch / max_q_tokens and those cover batch_size / q_tokens; else
    create one (rounded-up capacity, falling back to exact capacity if the workspace
    cannot hold the rounded one).  Under CUDA graph capture nothing may be created."""
    key = _ws_key(workspace)
    e = _cache.get(key)
    if e is not None:
        a, b = e.key, caps_key(caps)
        same = all(x == y for i, (x, y) in enumerate(zip(a, b)) if i not in (1, 2))
        if same and e.caps.max_batch >= batch_size and e.caps.max_q_tokens >= q_tokens:
            return e
    if capturing:
        raise FiattnError(
            "fiattn: no plan for these caps on this workspace_buffer while a CUDA graph is "
            "being captured (plans cannot be created or updated during capture): call the "
            "function once outside the capture first, or under fiattn.plan_only()")
    tries = []
    if not fixed_sizes:
        c = C.fi_caps.from_buffer_copy(caps)
        c.max_batch, c.max_q_tokens = _pow2(batch_size), _pow2(q_tokens)
        tries.append(c)
    c = C.fi_caps.from_buffer_copy(caps)
    c.max_batch, c.max_q_tokens = max(batch_size, 1), max(q_tokens, 1)
    tries.append(c)
    if not host:
        have = workspace.numel() * workspace.element_size()
        for c in tries:
            need = C.workspace_size(c)
            if need <= have:
                break
        else:
            raise WorkspaceTooSmallError(
                f"fiattn: workspace_buffer has {have} bytes, these caps need {need} "
                f"(fiattn.workspace_size(...); batch {batch_size}, {q_tokens} query tokens)",
                status=C.FI_ERR_WORKSPACE_TOO_SMALL, status_name="FI_ERR_WORKSPACE_TOO_SMALL")
        if workspace.data_ptr() % 256:
            raise ValueError("fiattn: workspace_buffer must be 256-byte aligned")
    else:
        c = tries[0]
    if e is not None:
        # kernels of the old plan may still run on this workspace: let them finish before
        # the new plan zeroes its semaphores
        if not host:
            torch().cuda.current_stream().synchronize()
        e.destroy()
        with _cache_lock:
            _cache.pop(key, None)
    e = PlanEntry(c, workspace, host)
    with _cache_lock:
        _cache[key] = e
    return e


def stream_handle(device):
    return torch().cuda.current_stream(device).cuda_stream


def plan(entry, batch, device):
    """fi_plan_update on the current stream (host plans: no stream)."""
    entry.sync()
    s = None if entry.host else stream_handle(device)
    st = C.lib().fi_plan_update(entry.plan, ctypes.byref(batch), s)
    C.check(st, "fi_plan_update", entry.plan)
    entry.planned = True


def launch(workspace, caps, batch_size, q_tokens, device, make_batch, args, family,
           dtypes_text, out_rows, fixed_sizes=False):
    """Plan (unless capturing) and run one call.

    make_batch(entry) -> (fi_batch, total_q_tokens, keepalive): the batch from host copies
    of the caller's arrays.  q_tokens bounds the plan's query tokens from the tensor shapes
    (known without reading data, so the same plan is found under capture).  Returns False
    when plan_only() suppressed the launch."""
    host = device.type == "cpu"
    capturing = (not host) and torch().cuda.is_current_stream_capturing()
    if not host:
        kind_supported_on_gpu(caps)
    entry = get_entry(workspace, caps, batch_size, q_tokens, host, capturing, fixed_sizes)
    if capturing:
        if not entry.planned:
            raise FiattnError("fiattn: the workspace's plan was never updated; call once "
                              "outside the capture (or under fiattn.plan_only()) first")
        entry.captured_rows = out_rows if entry.captured_rows is None else min(
            entry.captured_rows, out_rows)
    else:
        batch, total, keep = make_batch(entry)
        if (_plan_only() and entry.captured_rows is not None and total > entry.captured_rows):
            raise ValueError(
                f"fiattn: this plan has {total} query tokens but a CUDA graph captured on "
                f"this workspace_buffer holds {entry.captured_rows} rows; capture with "
                f"tensors as large as the largest step (or fiattn.release_workspace)")
        plan(entry, batch, device)
        del keep
        if _plan_only():
            return False
    execute(entry, args, device, family, dtypes_text)
    return True


def execute(entry, args, device, family, dtypes_text):
    """fi_run (GPU) or fi_ref_run (host plan) of args; statuses raised.  A dtype
    combination the kind's executor lacks is FiattnNotImplementedError naming it."""
    lib = C.lib()
    if entry.host:
        st = lib.fi_ref_run(entry.plan, ctypes.byref(args))
        what = "fi_ref_run"
    else:
        st = lib.fi_run(entry.plan, ctypes.byref(args), stream_handle(device))
        what = "fi_run"
    if st in (C.FI_ERR_UNSUPPORTED_DTYPE, C.FI_ERR_UNSUPPORTED_KIND):
        where = "the CPU reference" if entry.host else "the GPU"
        raise FiattnNotImplementedError(
            f"fiattn: {family} with {dtypes_text} is not implemented on {where} yet "
            f"({what}: {C.status_name(st)})", status=st, status_name=C.status_name(st))
    C.check(st, what, entry.plan)
