"""GPU tests of fiattn.prefill.trtllm_batch_context_with_kv_cache (skipped without torch +
CUDA), on fresh random data against an fp64 torch reference written here (request by
request: the query block aligned to the end of the KV range, window_left, sinks, GQA
groups): head_dim 64 / 128 / 256, groups 1 / 4 / 8, page sizes 16 / 64, HND and NHD, one
tensor and (K, V) pairs, 3-D block tables, cached prefixes, q_len 1 decodes beside long
chunks (and q_len 0 / kv_len 0 requests), fp8 output, device-resident lengths, the
recorded repeat path, CUDA graph capture + replay with lengths changed by re-planning,
fp8 e4m3 KV caches, NVFP4 KV caches (kv_block_scales) against the reference run on their
fp64 dequantisation, NVFP4 output (decoded against the reference within its quantisation
bound), skip-softmax, and NotImplementedError for e5m2 KV.
Outputs are poisoned (NaN) first: every row up to cum_seq_lens_q[-1] must be written, the
rows past it not."""
import math
import os
import sys

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import fiattn  # noqa: E402
from reference import nvfp4_dequant, rel_err  # noqa: E402
from test_gpu import _capture  # noqa: E402  (call once on a side stream, then capture)

DEV = "cuda"
TOL = 1e-2  # bf16 / fp16 inputs, relative 2-norm error (docs/DESIGN.md)
SEED = int(os.environ.get("FI_TEST_SEED", "0"))


@pytest.fixture
def ws():
    w = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    yield w
    fiattn.release_workspace(w)


def _gens(seed):
    """(CPU generator for page permutations, CUDA generator for the data)."""
    seed = (seed + SEED) & 0x7FFFFFFF
    return (torch.Generator().manual_seed(seed),
            torch.Generator(device=DEV).manual_seed(seed))


def context_ref(q, K, V, bt, q_lens, kv_lens, bmm1, bmm2=1.0, window_left=-1, sinks=None,
                v_bt=None):
    """fp64 context attention, one request at a time.

    q [T, H, D] (requests' rows in order, T = sum(q_lens)); K / V [num_pages, page_size,
    H_kv, D] (NHD); bt [B, P] K page ids (v_bt: V's, default bt).  Row i of request b is
    at position p = kv_len - q_len + i and sees keys max(0, p - window_left) .. p; query
    head h reads KV head h // (H / H_kv); sinks [H] add exp(sink) to the denominator.
    Returns [T, H, D] fp64 on q's device (rows of kv_len 0 requests: zeros)."""
    T, H, D = q.shape
    ps, Hkv = K.shape[1], K.shape[2]
    g = H // Hkv
    v_bt = bt if v_bt is None else v_bt
    out = torch.zeros(T, H, D, dtype=torch.float64, device=q.device)
    off = 0
    for b, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
        if ql == 0 or kl == 0:
            off += ql
            continue
        n = (kl + ps - 1) // ps

        def gather(cache, table):
            rows = cache[table[b, :n].long()].reshape(n * ps, Hkv, D)[:kl]
            return rows.double().repeat_interleave(g, dim=1)  # [kl, H, D]
        k, v = gather(K, bt), gather(V, v_bt)
        j = torch.arange(kl, device=q.device)
        step = max(1, (1 << 24) // (H * kl))  # rows per block: bounded score memory
        for r0 in range(0, ql, step):
            r1 = min(ql, r0 + step)
            s = torch.einsum("qhd,khd->hqk", q[off + r0:off + r1].double(), k) * bmm1
            p = (kl - ql + torch.arange(r0, r1, device=q.device))[:, None]
            seen = j[None, :] <= p
            if window_left >= 0:
                seen &= j[None, :] >= p - window_left
            s = s.masked_fill(~seen, -math.inf)
            if sinks is not None:
                col = sinks.double().to(q.device)[:, None, None].expand(H, r1 - r0, 1)
                w = torch.softmax(torch.cat([s, col], -1), -1)[..., :kl]
            else:
                w = torch.softmax(s, -1)
            out[off + r0:off + r1] = bmm2 * torch.einsum("hqk,khd->qhd", w, v)
        off += ql
    return out


class Case:
    """One batch: canonical NHD K / V, the API's kv_cache form, block tables (one spare
    column, shuffled pages), query with spare rows, lengths (CPU int32) and the arrays."""

    def __init__(self, seed, q_lens, kv_lens, H, Hkv, D, ps, layout="HND", form="tuple",
                 dtype=torch.bfloat16, spare_rows=5, lengths_on=DEV, kv_dtype=None):
        """kv_dtype: None (query's) or torch.float8_e4m3fn: the caches hold fp8 values and
        K / V (the reference's) the same values in dtype (exact); "nvfp4": the caches hold
        random e2m1 bytes (uint8, head_dim / 2) with random e4m3 block scales (self.sf,
        uint8 [.., head_dim / 16] in the same layout and form, passed as kv_block_scales),
        K / V their dequantisation in dtype (exact: every e2m1 x e4m3 product is)."""
        gc, gd = _gens(seed)
        self.q_lens, self.kv_lens = list(q_lens), list(kv_lens)
        self.H, self.D, self.layout, self.dtype = H, D, layout, dtype
        B = len(q_lens)
        P = max((k + ps - 1) // ps for k in kv_lens) + 1
        num_pages = B * P + 3
        self.sf = None
        perm = (lambda x: x.transpose(1, 2).contiguous()) if layout == "HND" else (lambda x: x)

        def api_form(k, v):
            return (perm(k), perm(v)) if form == "tuple" else torch.stack([perm(k), perm(v)], 1)
        if kv_dtype == "nvfp4":
            vals = [torch.randint(0, 256, (num_pages, ps, Hkv, D // 2), dtype=torch.uint8,
                                  generator=gc) for _ in range(2)]
            sfs = [torch.randint(0x18, 0x31, (num_pages, ps, Hkv, D // 16), dtype=torch.uint8,
                                 generator=gc) for _ in range(2)]
            self.K, self.V = (nvfp4_dequant(x, s).to(dtype).to(DEV) for x, s in zip(vals, sfs))
            self.kv = api_form(*(x.to(DEV) for x in vals))
            self.sf = api_form(*(s.to(DEV) for s in sfs))
            kv_dtype = None
        else:
            self.K = torch.randn(num_pages, ps, Hkv, D, generator=gd, device=DEV).to(dtype)
            self.V = torch.randn(num_pages, ps, Hkv, D, generator=gd, device=DEV).to(dtype)
            if kv_dtype is not None:
                self.K, self.V = (x.to(kv_dtype).to(dtype) for x in (self.K, self.V))
            self.kv = api_form(self.K, self.V)
        if kv_dtype is not None:
            self.kv = (tuple(x.to(kv_dtype) for x in self.kv) if form == "tuple"
                       else self.kv.to(kv_dtype))
        self.bt = torch.randperm(num_pages, generator=gc)[:B * P].to(torch.int32).reshape(
            B, P).to(DEV)
        self.T = sum(q_lens)
        self.q = torch.randn(self.T + spare_rows, H, D, generator=gd, device=DEV).to(dtype)
        self.cq = torch.tensor([0] + self.q_lens, dtype=torch.int32).cumsum(0).to(
            torch.int32).to(lengths_on)
        self.ck = torch.tensor([0] + self.kv_lens, dtype=torch.int32).cumsum(0).to(
            torch.int32).to(lengths_on)
        self.sl = torch.tensor(self.kv_lens, dtype=torch.int32).to(lengths_on)

    def poisoned_out(self, dtype=None):
        dt = dtype or self.dtype
        return torch.full(self.q.shape, float("nan"), device=DEV).to(dt)

    def run(self, ws, bmm1, bmm2=1.0, out=None, bt=None, **kw):
        if self.sf is not None:
            kw.setdefault("kv_block_scales", self.sf)
        return fiattn.prefill.trtllm_batch_context_with_kv_cache(
            self.q, self.kv, ws, self.bt if bt is None else bt, self.sl, max(self.q_lens),
            max(self.kv_lens), bmm1, bmm2, len(self.q_lens), self.cq, self.ck, out=out,
            kv_layout=self.layout, **kw)

    def ref(self, bmm1, bmm2=1.0, **kw):
        return context_ref(self.q[:self.T], self.K, self.V, self.bt, self.q_lens, self.kv_lens,
                           bmm1, bmm2, **kw)

    def check(self, out, ref, tol=TOL):
        torch.cuda.synchronize()
        T = self.T
        assert not torch.isnan(out[:T].float()).any(), "rows left unwritten"
        assert torch.isnan(out[T:].float()).all(), "rows past cum_seq_lens_q[-1] written"
        err = rel_err(out[:T].double(), ref)
        assert err < tol, err


# A prefill batch with cached prefixes and decodes: (q_len, cached prefix) per request.
MIXED = [(300, 0), (1, 900), (77, 33), (1, 5), (1, 1500), (640, 128), (0, 40), (2, 0)]
# (page_size, layout, form): all eight, spread over the nine (head_dim, group) cases
COMBOS = [(ps, lay, form) for ps in (16, 64) for lay in ("HND", "NHD")
          for form in ("tuple", "single")]


@pytest.mark.parametrize("D", [64, 128, 256])
@pytest.mark.parametrize("group", [1, 4, 8])
def test_shapes_match_reference(ws, D, group):
    i = [64, 128, 256].index(D) * 3 + [1, 4, 8].index(group)
    ps, layout, form = COMBOS[i % len(COMBOS)]
    Hkv = 4
    c = Case(1000 + i, [q for q, _ in MIXED], [q + p for q, p in MIXED], Hkv * group, Hkv, D,
             ps, layout, form)
    out = c.poisoned_out()
    scale = 1.0 / math.sqrt(D)
    r = c.run(ws, scale, 0.8, out=out)
    assert r is out
    c.check(out, c.ref(scale, 0.8))


@pytest.mark.parametrize("window,sinks,D,ps", [(128, True, 128, 64), (0, False, 64, 16),
                                               (700, True, 256, 16), (-1, True, 128, 16),
                                               (31, False, 128, 64)])
def test_window_and_sinks(ws, window, sinks, D, ps):
    c = Case(2000 + D + window, [1, 513, 1, 129, 70], [1200, 513, 2, 1000, 70], 32, 8, D, ps,
             "NHD", "single")
    sk = (torch.randn(32, generator=_gens(7)[0]) * 2).to(DEV) if sinks else None
    out = c.poisoned_out()
    c.run(ws, 0.09, out=out, window_left=window, sinks=sk)
    c.check(out, c.ref(0.09, window_left=window, sinks=sk))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_long_chunk_beside_decodes_and_empty_requests(ws, dtype):
    """One launch: a 2048-token chunk over a 1024-token prefix, 61 decodes of trace-like
    lengths, a q_len 0 request and a kv_len 0 one (its rows zeros)."""
    gc, _ = _gens(3000)
    dec = torch.randint(1, 4000, (61,), generator=gc).tolist()
    q_lens = [2048] + [1] * 30 + [0] + [1] * 31 + [3]
    kv_lens = [3072] + dec[:30] + [17] + dec[30:] + [0]
    c = Case(3001, q_lens, kv_lens, 32, 8, 128, 64, "HND", "tuple", dtype)
    out = c.poisoned_out()
    c.run(ws, 128 ** -0.5, out=out)
    ref = c.ref(128 ** -0.5)
    c.check(out, ref)
    assert (out[c.T - 3:c.T] == 0).all()


@pytest.mark.parametrize("D,group,ps,layout,form,dtype", [
    (128, 4, 64, "HND", "tuple", torch.bfloat16), (64, 1, 16, "NHD", "single", torch.float16),
    (256, 8, 16, "HND", "single", torch.bfloat16), (128, 8, 32, "NHD", "tuple", torch.float16)])
def test_fp8_kv_cache_matches_reference(ws, D, group, ps, layout, form, dtype):
    """fp8 e4m3 caches (the reference reads the same values): the MIXED batch of prefills,
    cached prefixes and decodes, sinks on two cases; the dequantisation scales folded into
    bmm1_scale (k_scale) and bmm2_scale (v_scale) as the reference API asks."""
    Hkv = 2
    c = Case(5000 + D + group, [q for q, _ in MIXED], [q + p for q, p in MIXED], Hkv * group,
             Hkv, D, ps, layout, form, dtype, kv_dtype=torch.float8_e4m3fn)
    sk = (torch.randn(Hkv * group, generator=_gens(8)[0]) * 2).to(DEV) if group > 1 else None
    k_scale, v_scale = 0.5, 1.5
    bmm1 = k_scale / math.sqrt(D)
    out = c.poisoned_out()
    c.run(ws, bmm1, v_scale, out=out, sinks=sk)
    c.check(out, c.ref(bmm1, v_scale, sinks=sk))


@pytest.mark.parametrize("how", ["out", "out_dtype"])
def test_fp8_output(ws, how):
    """fp8 e4m3 out, its scale folded into bmm2_scale as the reference does (stored =
    fp8(bmm2_scale * attention)); every element within fp8 rounding of the fp64 value."""
    fp8 = torch.float8_e4m3fn
    c = Case(4000, [300, 1, 1, 90], [300, 700, 33, 400], 16, 4, 128, 16, "HND", "single")
    o_scale = 0.25
    if how == "out":
        out = torch.full(c.q.shape, float("nan"), device=DEV).to(fp8)
        r = c.run(ws, 0.1, 1.0 / o_scale, out=out)
        assert r is out
    else:
        r = c.run(ws, 0.1, 1.0 / o_scale, out_dtype="float8_e4m3fn")
        assert r.dtype == fp8 and r.shape == c.q.shape
    ref = c.ref(0.1, 1.0 / o_scale)
    torch.cuda.synchronize()
    got = r[:c.T].double()
    assert torch.isfinite(got).all()
    # per (token, head) row, as the C suites: e4m3 keeps 3 mantissa bits (up to 6.25% an
    # element, 2-3% RMS over a row); a wrong scale, key block or row is off by far more
    err = (got - ref).norm(dim=-1) / ref.norm(dim=-1).clamp_min(1e-30)
    assert bool((err <= 7e-2).all()), float(err.max())
    assert rel_err(got, ref) < 5e-2


def test_three_d_block_tables_and_device_scales(ws):
    """uses_shared_paged_kv_idx=False: V pages from row 1 of a [B, 2, P] table (other pages
    than K's); bmm1 / bmm2 as one-element float32 device tensors read at run time."""
    c = Case(5000, [200, 1, 57], [260, 901, 57], 16, 2, 64, 64, "NHD", "tuple")
    gc, _ = _gens(5001)
    vt = c.bt.cpu()[torch.randperm(3, generator=gc)].roll(1, dims=1).to(DEV)
    bt3 = torch.stack([c.bt, vt], 1).contiguous()
    s1 = torch.tensor([0.11], device=DEV)
    s2 = torch.tensor([1.3], device=DEV)
    out = c.poisoned_out()
    c.run(ws, s1, s2, out=out, bt=bt3, uses_shared_paged_kv_idx=False)
    ref = context_ref(c.q[:c.T], c.K, c.V, c.bt, c.q_lens, c.kv_lens, 0.11, 1.3, v_bt=vt)
    c.check(out, ref)


def test_repeat_calls_device_lengths_and_determinism(ws):
    """cum_seq_lens / seq_lens on the device (copied to the host per call): a repeat with new
    lengths written into the same tensors takes the recorded path and equals, bitwise, the
    checked path on a fresh workspace (same plan bytes, merged in split order)."""
    c = Case(6000, [400, 1, 1, 250], [400, 1800, 64, 300], 32, 8, 128, 16)
    out = c.poisoned_out()
    c.run(ws, 0.08, out=out)
    c.check(out, c.ref(0.08))
    memo = fiattn._engine.cached_entry(ws).memo
    assert len(memo) == 1
    fast = next(iter(memo.values()))
    c.q_lens, c.kv_lens = [1, 333, 0, 1], [401, 1000, 64, 301]
    c.T = sum(c.q_lens)
    c.cq.copy_(torch.tensor([0] + c.q_lens).cumsum(0))
    c.ck.copy_(torch.tensor([0] + c.kv_lens).cumsum(0))
    c.sl.copy_(torch.tensor(c.kv_lens))
    out.fill_(float("nan"))
    c.run(ws, 0.08, out=out)
    assert len(memo) == 1 and next(iter(memo.values())) is fast
    c.check(out, c.ref(0.08))
    ws2 = torch.empty(128 << 20, dtype=torch.uint8, device=DEV)
    out2 = c.poisoned_out()
    c.run(ws2, 0.08, out=out2)
    torch.cuda.synchronize()
    fiattn.release_workspace(ws2)
    assert torch.equal(out[:c.T], out2[:c.T])


def test_device_block_tables_with_host_lengths_need_no_sync(ws, monkeypatch):
    c = Case(7000, [100, 1, 1], [100, 500, 900], 16, 4, 128, 64, lengths_on="cpu")
    c.run(ws, 0.1, out=c.poisoned_out())  # creates the plan (one synchronous zeroing)
    torch.cuda.synchronize()

    def refuse(*a, **k):
        raise AssertionError("fiattn synchronised")
    monkeypatch.setattr(torch.cuda.Stream, "synchronize", refuse)
    monkeypatch.setattr(torch.cuda, "synchronize", refuse)
    out = c.poisoned_out()
    c.run(ws, 0.1, out=out)  # the recorded path
    new = c.run(ws, 0.1)  # out=None: another signature, the checked path
    monkeypatch.undo()
    ref = c.ref(0.1)
    c.check(out, ref)
    assert rel_err(new[:c.T].double(), ref) < TOL


@pytest.mark.parametrize("lengths_on", [DEV, "cpu"])
def test_graph_capture_replay_with_changing_lengths(ws, lengths_on):
    """Plan outside, capture the run, then per step: new lengths written into the captured
    cum_seq_lens / seq_lens tensors, re-planned under fiattn.plan_only(), out poisoned,
    replayed; each step (prefill chunks, decodes, an empty request) against the reference."""
    B, rows, ps = 6, 1536, 16
    c = Case(8000, [256] * B, [1024] * B, 32, 8, 128, ps, "HND", "single",
             spare_rows=rows - 256 * B, lengths_on=lengths_on)
    out = torch.empty(c.q.shape, dtype=c.dtype, device=DEV)
    cap = (c.bt.shape[1] - 1) * ps  # tokens a request's table row holds

    def call():
        c.run(ws, 0.09, out=out)
    graph = _capture(call)
    gc, _ = _gens(8001)
    for step in range(4):
        q_lens = torch.randint(0, 256, (B,), generator=gc)  # <= the captured 1536 rows
        q_lens[step % B] = 1
        q_lens[(step + 1) % B] = 0
        kv_lens = (q_lens + torch.randint(0, cap - 256, (B,), generator=gc)).tolist()
        c.q_lens, c.kv_lens, c.T = q_lens.tolist(), kv_lens, int(q_lens.sum())
        c.cq.copy_(torch.tensor([0] + c.q_lens).cumsum(0))
        c.ck.copy_(torch.tensor([0] + kv_lens).cumsum(0))
        c.sl.copy_(torch.tensor(kv_lens))
        with fiattn.plan_only():
            call()
        out.fill_(float("nan"))
        graph.replay()
        c.check(out, c.ref(0.09))


@pytest.mark.parametrize("D,group,ps,layout,form,dtype,window", [
    (128, 4, 64, "HND", "tuple", torch.bfloat16, -1),
    (64, 1, 16, "NHD", "single", torch.float16, -1),
    (256, 8, 16, "HND", "single", torch.bfloat16, 100),
    (128, 8, 32, "NHD", "tuple", torch.float16, 37)])
def test_nvfp4_kv_cache_matches_dequantised_reference(ws, D, group, ps, layout, form, dtype,
                                                      window):
    """NVFP4 caches with kv_block_scales (as a (k_scales, v_scales) tuple and as one [pages,
    2, ...] tensor, HND and NHD): the MIXED batch of prefills, cached prefixes and decodes,
    sinks on three cases, windows on two, against the fp64 reference on the dequantised
    cache; the tensor-wide (global) scales folded into bmm1_scale / bmm2_scale as the
    reference API asks.  Then the recorded repeat path on new scale values."""
    Hkv = 2
    c = Case(6000 + D + group, [q for q, _ in MIXED], [q + p for q, p in MIXED], Hkv * group,
             Hkv, D, ps, layout, form, dtype, kv_dtype="nvfp4")
    sk = (torch.randn(Hkv * group, generator=_gens(9)[0]) * 2).to(DEV) if group > 1 else None
    k_global, v_global = 0.25, 0.75
    bmm1 = k_global / math.sqrt(D)
    out = c.poisoned_out()
    c.run(ws, bmm1, v_global, out=out, sinks=sk, window_left=window)
    c.check(out, c.ref(bmm1, v_global, sinks=sk, window_left=window))
    # the same call again with other scale bytes in place (the recorded path): V's scales
    # halved where even, so the reference changes
    sfs = c.sf if form == "tuple" else c.sf.unbind(1)
    sfs[1].sub_(((sfs[1] & 1) == 0).to(torch.uint8) * 8)  # e4m3 exponent - 1: x 0.5
    canon = sfs[1] if layout == "NHD" else sfs[1].transpose(1, 2)
    vbytes = c.kv[1] if form == "tuple" else c.kv.unbind(1)[1]
    vbytes = vbytes if layout == "NHD" else vbytes.transpose(1, 2)
    c.V = nvfp4_dequant(vbytes.cpu(), canon.cpu()).to(dtype).to(DEV)
    out2 = c.poisoned_out()
    c.run(ws, bmm1, v_global, out=out2, sinks=sk, window_left=window)
    c.check(out2, c.ref(bmm1, v_global, sinks=sk, window_left=window))


def test_nvfp4_misaligned_scales_and_missing_scales_raise_before_launch(ws):
    c = Case(9100, [20, 1], [20, 40], 8, 2, 128, 16, "HND", "tuple", kv_dtype="nvfp4")
    out = torch.full(c.q.shape, 3.0, dtype=c.dtype, device=DEV)
    row = 128 // 16
    k_sf = c.sf[0]
    buf = torch.zeros(k_sf.numel() + row, dtype=torch.uint8, device=DEV)
    shifted = buf[1:1 + k_sf.numel()].view(k_sf.shape)
    with pytest.raises(fiattn.FiattnValueError, match="FI_ERR_MISALIGNED_POINTER"):
        c.run(ws, 0.1, out=out, kv_block_scales=(shifted, c.sf[1]))
    with pytest.raises(ValueError, match="needs its block scales"):
        c.run(ws, 0.1, out=out, kv_block_scales=None)
    with pytest.raises(ValueError, match="k_scales must be"):
        c.run(ws, 0.1, out=out, kv_block_scales=(k_sf[..., :4], c.sf[1]))
    torch.cuda.synchronize()
    assert (out == 3.0).all()


def test_skip_softmax(ws):
    """skip_softmax_threshold_scale_factor: None and a factor too small to skip a block
    with a key give the same bytes; on keys every query row attends to (dims 0-31 of the
    queries and of each request's first 64 keys set to 2: ~11 nats above the rest), factor
    1 skips blocks and stays within the tolerance of the exact reference; a negative
    factor raises before the call."""
    c = Case(4100, [700, 1, 300], [1500, 900, 300], 32, 8, 128, 64, "HND", "tuple")
    c.q[:, :, :32] = 2.0
    for b, kv in enumerate(c.kv_lens):
        for t in range(min(kv, 64)):
            c.K[c.bt[b, t // 64], t % 64, :, :32] = 2.0
    c.kv = (c.K.transpose(1, 2).contiguous(), c.V.transpose(1, 2).contiguous())
    scale = 1.0 / math.sqrt(128)
    ref = c.ref(scale)
    dense = c.run(ws, scale, out=c.poisoned_out())
    c.check(dense, ref)
    tiny = c.run(ws, scale, out=c.poisoned_out(), skip_softmax_threshold_scale_factor=1e-30)
    torch.cuda.synchronize()
    assert torch.equal(dense.view(torch.int16), tiny.view(torch.int16))
    out = c.poisoned_out()
    c.run(ws, scale, out=out, skip_softmax_threshold_scale_factor=1.0)
    c.check(out, ref)
    assert not torch.equal(dense.view(torch.int16), out.view(torch.int16)), "nothing skipped"
    with pytest.raises(ValueError):
        c.run(ws, scale, out=out, skip_softmax_threshold_scale_factor=-1.0)


_E2M1 = [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0]


def _nvfp4_decode(x, g, T):
    """FP4Tensor -> fp64 [T, H, D]: e2m1(code) x scale / g (linear scale layout)."""
    lut = torch.tensor(_E2M1, dtype=torch.float64, device=DEV)
    d = x.data[:T]
    codes = torch.stack([d & 0xF, d >> 4], -1).reshape(T, d.shape[1], -1).long()
    s = x.scale[x.scale_start_index:x.scale_start_index + T].double()
    s = s.reshape(T, d.shape[1], -1).repeat_interleave(16, dim=-1)
    return lut[codes] * s / g


@pytest.mark.parametrize("mode", ["alloc", "fp4_out", "merged"])
def test_nvfp4_out_matches_reference(ws, mode):
    """NVFP4 output: every element of the rows up to cum_seq_lens_q[-1] within half an e2m1
    step of the fp64 reference (max(scale / g, |ref|) / 4, plus the bf16 accumulation
    error), each block's scale within e4m3's half step of amax / 6 x g; a preallocated
    FP4Tensor (scale_start_index 5, poisoned) returned as given, rows past the batch and
    scale rows outside it untouched; "merged": a short block over long KV, which the planner
    usually cuts and merges (test_context_gpu.c's NVFP4 tests require the merge)."""
    if mode == "merged":
        c = Case(9100, [24, 1], [7000, 300], 16, 2, 128, 64, "NHD", "tuple")
    else:
        c = Case(9101 + (mode == "fp4_out"), [1, 200, 37], [1, 700, 37], 32, 8,
                 64 if mode == "alloc" else 256, 16, "HND", "single")
    g = 300.0
    kw = {"out_dtype": "nvfp4", "o_sf_scale": g, "o_sf_vec_size": 16}
    T, H, D = c.T, c.H, c.D
    rows = c.q.shape[0]
    if mode == "fp4_out":
        data = torch.full((rows, H, D // 2), 0xFF, dtype=torch.uint8, device=DEV)
        scale = torch.full((rows + 9, H * D // 16), float("nan"), device=DEV).to(
            torch.float8_e4m3fn)
        x = c.run(ws, 0.1, out=fiattn.FP4Tensor(data, scale, 5), **kw)
        assert x.data is data and x.scale is scale and x.scale_start_index == 5
    else:
        x = c.run(ws, 0.1, **kw)
        assert isinstance(x, fiattn.FP4Tensor)
        assert x.data.shape == (rows, H, D // 2) and x.data.dtype == torch.uint8
        assert x.scale.shape == (rows, H * D // 16) and x.scale.dtype == torch.float8_e4m3fn
    torch.cuda.synchronize()
    ref = c.ref(0.1)[:T]
    got = _nvfp4_decode(x, g, T)
    s = x.scale[x.scale_start_index:x.scale_start_index + T].double().reshape(T, H, D // 16)
    assert torch.isfinite(s).all(), "a scale byte left NaN (poison) or written NaN"
    amax = ref.abs().reshape(T, H, D // 16, 16).amax(-1)
    want = amax / 6 * g
    normal = want >= 2.0 ** -6
    assert ((s - want).abs() <= (0.0625 + 2e-2) * want)[normal].all()
    bound = (torch.maximum((s / g).repeat_interleave(16, -1), ref.abs()) / 4
             + 1.25 * 2e-2 * amax.repeat_interleave(16, -1) + 1e-30
             + torch.where(want < 2.0 ** -9, amax, 0.0).repeat_interleave(16, -1))
    err = (got - ref).abs()
    assert (err <= bound).all(), f"worst error / bound {(err / bound).max().item():.3f}"
    if mode == "fp4_out":
        assert (x.data[T:] == 0xFF).all()  # rows past the batch
        assert x.scale[:5].float().isnan().all() and x.scale[5 + T:].float().isnan().all()


def test_nvfp4_out_bad_vec_size_raises_before_any_call(ws):
    c = Case(9103, [20, 1], [20, 40], 8, 2, 128, 16, "HND", "tuple")
    with pytest.raises(ValueError, match="o_sf_vec_size"):
        c.run(ws, 0.1, out_dtype="nvfp4", o_sf_scale=1.0, o_sf_vec_size=32)


@pytest.mark.parametrize("what", ["e5m2_kv"])
def test_not_implemented_on_gpu_writes_nothing(ws, what):
    c = Case(9000, [20, 1], [20, 40], 8, 2, 128, 16, "HND", "tuple")
    out = torch.full(c.q.shape, 3.0, dtype=c.dtype, device=DEV)
    kw = {}
    name = "NVFP4"
    if what == "e5m2_kv":
        c.kv = tuple(x.to(torch.float8_e5m2) for x in c.kv)
        name = "e5m2"
    with pytest.raises(NotImplementedError, match=name):
        c.run(ws, 0.1, out=out, **kw)
    torch.cuda.synchronize()
    if out is not None:
        assert (out == 3.0).all()
