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
import os
import threading

from . import _capi as C
from ._common import last_i32
from ._torch import torch
from .errors import (FiattnError, FiattnNotImplementedError, WorkspaceTooSmallError,
                     error_for_status)

# Statistics the tests read: plans created since import.
stats = {"plans_created": 0, "plans_destroyed": 0}

class _State(threading.local):
    plan_only = False  # a class default: reading it never raises (getattr's slow path)
    device_planning = False


_state = _State()


def _plan_only():
    return _state.plan_only


# The kinds whose tile table has data-parallel rows (docs/DESIGN.md section 10): the ones
# planned on the device inside device_planning().
_DEVICE_PLANNED_KINDS = (C.FI_KIND_MLA_DECODE, C.FI_KIND_GQA_DECODE)


def _parallel_variant(caps):
    """The tile-table row with the data-parallel partition that plans the caps' row on the
    device (fi_caps_parallel_variant: the planning kernel then runs with a whole CTA)."""
    v = ctypes.c_int32()
    C.check(C.lib().fi_caps_parallel_variant(ctypes.byref(caps), ctypes.byref(v)),
            "fi_caps_parallel_variant")
    return v.value


def _device_plan_caps(caps, batch_size, q_tokens):
    """A copy of the call's caps (max_batch / max_q_tokens still 0: get_entry sizes them)
    with the data-parallel row of this call's batch.  The row depends on the mean MTP depth
    (fi_variant_request_rows), so the copy carries the batch before the library is asked."""
    c = C.fi_caps.from_buffer_copy(caps)
    c.max_batch, c.max_q_tokens = max(batch_size, 1), max(q_tokens, 1)
    c.variant = _parallel_variant(c)
    return c


def _device_planning():
    return _state.device_planning


@contextlib.contextmanager
def device_planning(enabled=True):
    """Inside this context the decode functional APIs (xqa_batch_decode_with_kv_cache,
    trtllm_batch_decode_with_kv_cache_mla) plan on the GPU when their block_tables and
    seq_lens are CUDA tensors: fi_plan_update_device reads the lengths on the device, so a
    call copies nothing to the host and never synchronises, and a call captured by
    torch.cuda.graph captures the planning kernel too: every replay plans for the lengths
    then in seq_lens (no fiattn.plan_only() step before replays).

    The plans use the caps' data-parallel partition row (fi_caps_parallel_variant: MLA 2,
    or 5 from 32 heads on, the wgmma body, or 8 for q and cache fp8 e4m3 at heads x q_len
    <= 16, the transposed fp8 body; GQA 1, or 4 when group x q_len_per_req <= 8).  Its
    steps can run slower than host-planned ones (H200, b2b, docs/DESIGN.md 6a): on trace
    batches of 128 requests MLA heads 128 and GQA 0-2%, MLA heads 16 bf16 3-6% (batches
    of at most two requests a CTA are packed in pairs, not as tightly as on the host),
    q and cache fp8 at heads 16 4% faster to 1% slower; uniform batches of at most one
    request an SM run in the host-planned time.
    A length or page index the device planner refuses is not raised by the call: the step
    runs nothing (out and lse keep what they held) and device_plan_status(workspace_buffer)
    raises the status (a stream synchronisation: call it off the hot path).

    enabled: False turns device planning off inside the context (nested use)."""
    prev = _state.device_planning
    _state.device_planning = bool(enabled)
    try:
        yield
    finally:
        _state.device_planning = prev


def device_plan_status(workspace_buffer):
    """Raise the FiattnError subclass of the status the device planner wrote for the last
    step planned on the GPU with this workspace_buffer (fi_plan_device_error), or return None
    when that step was planned (or no step was planned on the device).  Synchronises the
    current stream (a device-to-host copy of the status word)."""
    e = cached_entry(workspace_buffer)
    if e is None or e.host or not getattr(e, "device_planned", False):
        return None
    d = C.fi_error_detail()
    st = C.lib().fi_plan_device_error(e.plan, ctypes.byref(d),
                                      stream_handle(workspace_buffer.device))
    if st:
        C.check(st, "fi_plan_device_error", e.plan)
    if d.status:
        name = C.status_name(d.status)
        t = C._detail_text(d)
        raise error_for_status(d.status, name,
                               f"fiattn: the device planner refused the step: {name}"
                               + (f" ({t})" if t else ""), d)
    return None


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
        self.device_planned = False  # a step was planned by fi_plan_update_device
        self.bufs = {}
        self.memo = {}  # call signature -> FastCall (functional APIs' repeat calls)
        self.captured_rows = None  # smallest out row count captured in a CUDA graph
        self._pending = False  # host_i32 copies not yet synchronised
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

    def host_page_table(self, x):
        """The host int32 table the planner validates for page table x: x itself (contiguous)
        when it is on the CPU; for a device tensor a cached all-zero host table of its shape,
        so no copy or stream synchronisation is needed.  The kernel reads the device table;
        its page ids are then not range-checked on the host (an out-of-range id is the
        caller's error, as in FlashInfer), while every length rule still is."""
        t = torch()
        if x.device.type == "cpu":
            if x.dtype != t.int32:
                x = x.view(t.int32)
            return x if x.is_contiguous() else x.contiguous()
        z = self.bufs.get("zero_page_table")
        if z is None or z.numel() < x.numel():
            z = t.zeros(max(x.numel(), 64) * 2, dtype=t.int32)
            self.bufs["zero_page_table"] = z
        return z[:x.numel()].view(x.shape)

    def sync(self):
        if self._pending:
            torch().cuda.current_stream().synchronize()
            self._pending = False


_CAPS_SIZE = ctypes.sizeof(C.fi_caps)
_MB_OFF = C.fi_caps.max_batch.offset
_MQ_END = C.fi_caps.max_q_tokens.offset + C.fi_caps.max_q_tokens.size


def caps_key(caps):
    """The caps' bytes without max_batch / max_q_tokens (the fields a cached plan may
    exceed): equal keys, same plan shape.  fi_caps is all 4-byte fields, no padding."""
    b = ctypes.string_at(ctypes.addressof(caps), _CAPS_SIZE)
    return b[:_MB_OFF] + b[_MQ_END:]


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
    return (ws.device, ws.data_ptr())


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
        c = e.caps
        if (e.key == caps_key(caps) and c.max_batch >= batch_size
                and c.max_q_tokens >= q_tokens):
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


class _Cuda:
    """torch's CUDA getters, bound once: the raw C entry points where torch has them (one C
    call each, no torch.cuda.Stream object, no lazy-init check: a caller holds CUDA tensors,
    so CUDA is initialised), else the public functions."""

    def __init__(self):
        t = torch()
        c = t._C
        self.device = getattr(c, "_cuda_getDevice", None) or t.cuda.current_device
        self.capturing = (getattr(c, "_cuda_isCurrentStreamCapturing", None)
                          or t.cuda.is_current_stream_capturing)
        raw = getattr(c, "_cuda_getCurrentRawStream", None)
        self.stream = raw or (lambda index: t.cuda.current_stream(index).cuda_stream)


_cuda = None


def cuda():
    """The bound CUDA getters (_Cuda)."""
    global _cuda
    if _cuda is None:
        _cuda = _Cuda()
    return _cuda


def check_current_device(index):
    """ValueError unless the current CUDA device is `index` (the call's tensors' device):
    fiattn launches on the current device and stream, as torch does."""
    cur = cuda().device()
    if cur != index:
        raise ValueError(f"fiattn: inputs are on cuda:{index} but the current CUDA device is "
                         f"cuda:{cur} (use torch.cuda.device(...))")


def stream_handle(device):
    """cudaStream_t of the current torch stream on `device` (an int)."""
    return cuda().stream(device.index if device.index is not None else cuda().device())


def plan(entry, batch, device, stream=None):
    """fi_plan_update on the current stream (host plans: no stream)."""
    entry.sync()
    if entry.host:
        stream = None
    elif stream is None:
        stream = stream_handle(device)
    st = C.lib().fi_plan_update(entry.plan, ctypes.byref(batch), stream)
    if st:
        C.check(st, "fi_plan_update", entry.plan)
    entry.planned = True


def launch(workspace, caps, batch_size, q_tokens, device, make_batch, args, family,
           dtypes_text, out_rows, fixed_sizes=False, record=None, make_device_batch=None):
    """Plan (unless capturing) and run one call.

    make_batch(entry) -> (fi_batch, total_q_tokens, keepalive): the batch from host copies
    of the caller's arrays.  q_tokens bounds the plan's query tokens from the tensor shapes
    (known without reading data, so the same plan is found under capture).  Returns False
    when plan_only() suppressed the launch.  record(entry), when given, is called once the
    plan succeeded (the caller memoises the call for fast_call)."""
    host = device.type == "cpu"
    capturing = (not host) and cuda().capturing()
    if not host:
        kind_supported_on_gpu(caps)
    if (make_device_batch is not None and not host and _state.device_planning
            and caps.kind in _DEVICE_PLANNED_KINDS and not _plan_only()):
        return launch_device_planned(workspace, caps, batch_size, q_tokens, device,
                                     make_device_batch, args, family, dtypes_text, capturing,
                                     record)
    entry = get_entry(workspace, caps, batch_size, q_tokens, host, capturing, fixed_sizes)
    if capturing:
        if not entry.planned:
            raise FiattnError("fiattn: the workspace's plan was never updated; call once "
                              "outside the capture (or under fiattn.plan_only()) first")
        entry.captured_rows = out_rows if entry.captured_rows is None else min(
            entry.captured_rows, out_rows)
    else:
        batch, total, keep = make_batch(entry)
        if _plan_only() and entry.captured_rows is not None and total > entry.captured_rows:
            raise captured_rows_error(total, entry.captured_rows)
        plan(entry, batch, device)
        del keep
    if record is not None:
        record(entry)
    if not capturing and _plan_only():
        return False
    execute(entry, args, device, family, dtypes_text)
    return True


def block_table_batch(b, entry, block_tables, seq_lens, B, qlen, window_left, width):
    """Fill fi_batch `b` for the host planner: block-table form, causal, B requests of qlen
    query rows, block_tables rows `width` entries apart (max_pages_per_seq; the sparse
    form's K).  The planner reads host views: the entry's all-zero table for a device
    block_tables (entry.host_page_table), seq_lens itself or its pinned copy (synchronised
    here).  Returns the views, to be kept alive until planned."""
    bt = entry.host_page_table(block_tables)
    sl = entry.host_i32("seq_lens", seq_lens)
    entry.sync()
    b.form = C.FI_FORM_BLOCK_TABLES
    b.batch_size = B
    b.block_tables = bt.data_ptr()
    b.max_pages_per_seq = width
    b.seq_lens = sl.data_ptr()
    b.q_len_per_request = qlen
    b.causal = 1
    b.window_left = window_left
    return bt, sl


def block_table_device_batch(device, block_tables, seq_lens, B, qlen, window_left, q_rows):
    """make_device_batch for launch(): a block-table batch over the caller's CUDA
    block_tables / seq_lens (read by the planning kernel), or None when either is not a
    CUDA tensor (or seq_lens is not contiguous): then the host plans."""
    if not (device.type == "cuda" and block_tables.is_cuda and seq_lens.is_cuda
            and seq_lens.is_contiguous()):
        return None

    def make():
        db = C.fi_device_batch()
        d = db.batch
        d.form = C.FI_FORM_BLOCK_TABLES
        d.batch_size = B
        d.block_tables = block_tables.data_ptr()
        d.max_pages_per_seq = block_tables.shape[1]
        d.seq_lens = seq_lens.data_ptr()
        d.q_len_per_request = qlen
        d.causal = 1
        d.window_left = window_left
        db.max_q_tokens = q_rows
        return db, (block_tables, seq_lens)
    return make


def launch_device_planned(workspace, caps, batch_size, q_tokens, device, make_device_batch,
                          args, family, dtypes_text, capturing, record=None):
    """fi_plan_update_device then fi_run on the current stream (captured as they are).
    make_device_batch() -> (fi_device_batch, keepalive); record(entry, device_batch), when
    given, memoises the call for fast_call."""
    c = _device_plan_caps(caps, batch_size, q_tokens)
    entry = get_entry(workspace, c, batch_size, q_tokens, False, capturing)
    db, keep = make_device_batch()
    stream = stream_handle(device)
    lib = C.lib()
    st = lib.fi_plan_update_device(entry.plan, ctypes.byref(db), int(args.enable_pdl != 0),
                                   stream)
    if st:
        C.check(st, "fi_plan_update_device", entry.plan)
    entry.planned = True
    entry.device_planned = True
    execute(entry, args, device, family, dtypes_text, stream)
    if record is not None:
        record(entry, db)
    del keep
    return True


def execute(entry, args, device, family, dtypes_text, stream=None):
    """fi_run (GPU) or fi_ref_run (host plan) of args; statuses raised.  A dtype
    combination the kind's executor lacks is FiattnNotImplementedError naming it.
    dtypes_text: the text, or a (q, kv, out) dtype tuple turned into text on error."""
    lib = C.lib()
    if entry.host:
        st = lib.fi_ref_run(entry.plan, ctypes.byref(args))
    else:
        st = lib.fi_run(entry.plan, ctypes.byref(args),
                        stream_handle(device) if stream is None else stream)
    if st:
        run_failed(entry, st, family, dtypes_text)


def run_failed(entry, st, family, dtypes_text):
    """Raise the exception of fi_run / fi_ref_run status `st` (not FI_OK)."""
    what = "fi_ref_run" if entry.host else "fi_run"
    if isinstance(dtypes_text, tuple):
        from ._common import dtypes_text as _text
        dtypes_text = _text(*dtypes_text)
    if st in (C.FI_ERR_UNSUPPORTED_DTYPE, C.FI_ERR_UNSUPPORTED_KIND):
        where = "the CPU reference" if entry.host else "the GPU"
        raise FiattnNotImplementedError(
            f"fiattn: {family} with {dtypes_text} is not implemented on {where} yet "
            f"({what}: {C.status_name(st)})", status=st, status_name=C.status_name(st))
    C.check(st, what, entry.plan)


def captured_rows_error(total, rows):
    return ValueError(
        f"fiattn: this plan has {total} query tokens but a CUDA graph captured on this "
        f"workspace_buffer holds {rows} rows; capture with tensors as large as the largest "
        f"step (or fiattn.release_workspace)")


# ---- repeat calls of the functional APIs ------------------------------------------------
# A functional call whose arguments have the same signature as an earlier successful call
# on the same workspace plan (every tensor's dtype, device, shape and strides; every other
# argument's value) passes the same checks and builds the same descriptors but for the
# data addresses.  The first such call records a FastCall on the plan entry; repeats only
# refresh the addresses, re-plan (fi_plan_update: the lengths are data) and run.  Anything
# that depends on data or on state outside the arguments (the current device, CUDA graph
# capture, plan_only(), device-resident lengths) is still checked on every call; what
# depends only on the signature (contiguity, which tensors live on the host, the host
# page table standing in for a device one, ctypes references) is settled when recording.
_MEMO_MAX = 64


def tensor_sig(x):
    """What the argument checks of a tensor depend on.  AttributeError / TypeError for a
    non-tensor (the caller then takes the checked path)."""
    return (x.dtype, x.device, x.shape, x.stride())


# FastCall.sl_mode (and the modes of FastCall.lens): how the planner gets a host length array
SL_HOST, SL_HOST_COPY, SL_DEVICE = "host", "host copy", "device"


def _sl_mode(x):
    return SL_DEVICE if x.is_cuda else SL_HOST if x.is_contiguous() else SL_HOST_COPY


def _host_lengths(entry, mode, slot, x):
    """The host int32 view the planner reads of length array x (see SL_*): a device array is
    copied into the entry's pinned buffer `slot` (asynchronous: entry.sync() before use)."""
    if mode is SL_DEVICE:
        return entry.host_i32(slot, x)
    if mode is SL_HOST_COPY:
        return x.contiguous()
    return x


def q_rows_error(total, rows):
    """The error of a batch whose query tokens (cum_seq_lens_q[-1]) exceed query's rows."""
    return ValueError(f"fiattn: cum_seq_lens_q[-1] = {total} exceeds query's {rows} rows")


class FastCall:
    """A recorded functional call over block tables (fi_attn_args and fi_batch reused):
    the block-table form (decode) and the cumulative-lengths form (context)."""

    __slots__ = ("args", "batch", "args_ref", "batch_ref", "ptrs", "fields", "bt", "sl",
                 "bt_host", "sl_mode", "host_table", "total", "out_rows", "out_alloc",
                 "family", "dtypes", "device", "cuda", "index", "env", "dev", "dev_ref",
                 "lens", "total_from", "hold")

    def __init__(self, entry, args, batch, ptrs, ts, bt, sl, total, out_rows, out_alloc,
                 family, dtypes, device, fields=(), dev=None, lens=(), total_from=None):
        """ts: the call's tensors in the order repeats pass them (out last); bt / sl: the
        indices of block_tables / seq_lens in ts.  ptrs: (fi_tensor, tensor index, byte
        offset) refreshed from the call's tensors; fields: (fi_attn_args pointer field name,
        tensor index) likewise (sinks, scale tensors).
        lens: further host-read int32 arrays, (fi_batch field name, tensor index, pinned
        buffer slot) each (the context form's cum_seq_lens_q / cum_seq_lens_kv).
        total: the batch's query tokens when fixed by the shapes (decode); with total_from
        (an index into lens) it is read from that array's last element at every call and
        must not exceed `total`, then the query's row count (ValueError)."""
        self.args, self.batch, self.ptrs, self.fields = args, batch, ptrs, fields
        self.args_ref, self.batch_ref = ctypes.byref(args), ctypes.byref(batch)
        # dev: the fi_device_batch of a call planned on the GPU (device_planning()); its
        # block_tables / seq_lens pointers are refreshed per call
        self.dev = dev
        self.dev_ref = None if dev is None else ctypes.byref(dev)
        self.bt, self.sl = bt, sl
        self.total, self.out_rows, self.out_alloc = total, out_rows, out_alloc
        self.family, self.dtypes, self.device = family, dtypes, device
        self.cuda = device.type == "cuda"
        self.index = device.index if self.cuda else None
        self.env = None if self.cuda else os.environ.get("FIATTN_CPU_CTAS")  # CPU plans' CTAs
        # a device block table is never read on the host: the planner validates the
        # lengths against the entry's all-zero host table of its shape, kept alive here
        # (the entry may grow its buffer for another call)
        self.bt_host = not ts[bt].is_cuda
        self.host_table = None
        if not self.bt_host:
            self.host_table = entry.host_page_table(ts[bt])
            batch.block_tables = self.host_table.data_ptr()
        self.sl_mode = _sl_mode(ts[sl])
        self.lens = tuple((name, i, _sl_mode(ts[i]), slot) for name, i, slot in lens)
        self.total_from = total_from
        self.hold = [None] * len(self.lens)


def remember(entry, key, fast):
    m = entry.memo
    if len(m) >= _MEMO_MAX:
        m.clear()
    m[key] = fast


def lookup(workspace, key):
    """The FastCall recorded for `key` on the workspace's cached plan, or None."""
    try:
        e = _cache.get((workspace.device, workspace.data_ptr()))
    except (AttributeError, TypeError):
        return None, None
    if e is None:
        return None, None
    return e, e.memo.get(key)


def fast_call(entry, f, ts):
    """Repeat of a recorded call: ts = (tensors in the recorded order, out or None).
    Returns out (allocated when the recorded call allocated it)."""
    if f.cuda:
        cu = _cuda or cuda()
        if cu.device() != f.index:
            check_current_device(f.index)
    out = ts[-1]
    if f.out_alloc is not None:
        out = torch().empty(f.out_alloc[0], dtype=f.out_alloc[1], device=f.device)
        ts = ts[:-1] + (out,)
    for ft, i, off in f.ptrs:
        ft.data = ts[i].data_ptr() + off
    for name, i in f.fields:
        setattr(f.args, name, ts[i].data_ptr())
    lib = C.lib()
    stream = None
    if f.dev is not None and _state.plan_only:
        return out  # a graph planned on the GPU re-plans itself: nothing to prepare
    if f.dev is not None:  # planned on the GPU, captured or not (device_planning())
        d = f.dev.batch
        d.block_tables = ts[f.bt].data_ptr()
        d.seq_lens = ts[f.sl].data_ptr()
        stream = cu.stream(f.index)
        st = lib.fi_plan_update_device(entry.plan, f.dev_ref, int(f.args.enable_pdl != 0),
                                       stream)
        if st:
            C.check(st, "fi_plan_update_device", entry.plan)
        entry.device_planned = True
    elif f.cuda and cu.capturing():
        if not entry.planned:
            raise FiattnError("fiattn: the workspace's plan was never updated; call once "
                              "outside the capture (or under fiattn.plan_only()) first")
        r = f.out_rows
        entry.captured_rows = r if entry.captured_rows is None else min(entry.captured_rows, r)
        stream = cu.stream(f.index)
    else:
        b = f.batch
        if f.bt_host:  # int32 / uint32 (same bits), contiguous: checked when recorded
            b.block_tables = ts[f.bt].data_ptr()
        sl = _host_lengths(entry, f.sl_mode, "seq_lens", ts[f.sl])
        b.seq_lens = sl.data_ptr()
        total = f.total
        hold = f.hold  # the lens' host views, alive until planned (no list made per call)
        k = 0
        for name, i, mode, slot in f.lens:
            h = _host_lengths(entry, mode, slot, ts[i])
            setattr(b, name, h.data_ptr())
            hold[k] = h
            k += 1
        entry.sync()
        if f.total_from is not None:
            total = last_i32(hold[f.total_from])
            if total > f.total:
                raise q_rows_error(total, f.total)
        po = _state.plan_only
        if po and entry.captured_rows is not None and total > entry.captured_rows:
            raise captured_rows_error(total, entry.captured_rows)
        if f.cuda:
            stream = cu.stream(f.index)
        st = lib.fi_plan_update(entry.plan, f.batch_ref, stream)
        for k in range(len(hold)):
            hold[k] = None
        if st:
            C.check(st, "fi_plan_update", entry.plan)
        entry.planned = True
        if po:
            return out
    if f.cuda:
        st = lib.fi_run(entry.plan, f.args_ref, stream)
    else:
        st = lib.fi_ref_run(entry.plan, f.args_ref)
    if st:
        run_failed(entry, st, f.family, f.dtypes)
    return out
