// scripts/mla_check.cu - executor self-check + quick bench with a hand-built plan
// (independent of the planner).  Not part of the library.
//   mla_check            correctness sweep (fp64 CPU reference)
//   mla_check small      one small split case (for compute-sanitizer)
//   mla_check bench [trace_lens_file]
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <ctime>
#include <vector>
#include <string>

#include "executor/launch.h"
#include "fiattn_work.h"

#define CK(x)                                                                               \
    do {                                                                                    \
        cudaError_t e_ = (x);                                                               \
        if (e_ != cudaSuccess) {                                                            \
            printf("CUDA %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__);        \
            exit(2);                                                                        \
        }                                                                                   \
    } while (0)

static uint16_t f2h(float f, int dt) {
    if (dt == FI_DTYPE_BF16) {
        __nv_bfloat16 b = __float2bfloat16(f);
        uint16_t u;
        memcpy(&u, &b, 2);
        return u;
    }
    __half h = __float2half(f);
    uint16_t u;
    memcpy(&u, &h, 2);
    return u;
}
static float h2f(uint16_t u, int dt) {
    if (dt == FI_DTYPE_BF16) {
        uint32_t x = (uint32_t)u << 16;
        float f;
        memcpy(&f, &x, 4);
        return f;
    }
    __half h;
    memcpy(&h, &u, 2);
    return __half2float(h);
}

struct Case {
    const char *name;
    int dt, H, ps, qlen, B, kvmin, kvmax, causal, window, sinks, scale_ptr, lse, num_ctas,
        min_chunk;
};

struct Plan {
    fi_plan_header hdr;
    std::vector<int32_t> indptr;
    std::vector<fi_request_info> req;
    std::vector<fi_merge_group> groups;
    std::vector<fi_work_item> items;
    int num_slots;
};

static void build_plan(const Case &c, const std::vector<int> &kvl, int max_pages, Plan &P) {
    P = Plan();
    memset(&P.hdr, 0, sizeof P.hdr);
    int qoff = 0;
    for (int b = 0; b < c.B; ++b) {
        fi_request_info r = {qoff, c.qlen, kvl[b], b * max_pages};
        P.req.push_back(r);
        qoff += c.qlen;
    }
    struct T { int b, hb, he, qb, qe, kb, ke; };
    std::vector<T> tiles;
    for (int b = 0; b < c.B; ++b) {
        int rows_q = c.H >= 64 ? 1 : 64 / c.H;
        for (int qb = 0; qb < c.qlen; qb += rows_q) {
            int qe = std::min(c.qlen, qb + rows_q);
            for (int hb = 0; hb < c.H; hb += std::min(c.H, 64)) {
                int he = hb + std::min(c.H, 64);
                int kv = kvl[b];
                int pos_lo = kv - c.qlen + qb, pos_hi = kv - c.qlen + qe - 1;
                int hi = c.causal ? pos_hi : kv - 1;
                int lo = c.window >= 0 ? std::max(0, pos_lo - c.window) : 0;
                int kb = lo, ke = hi + 1;
                if (ke <= kb) kb = ke = 0;
                tiles.push_back({b, hb, he, qb, qe, kb, ke});
            }
        }
    }
    long long total = 0;
    for (auto &t : tiles) total += t.ke - t.kb;
    int chunk = std::max<long long>(c.min_chunk, (total + c.num_ctas - 1) / c.num_ctas);
    int slot = 0;
    for (auto &t : tiles) {
        int len = t.ke - t.kb;
        int ns = std::max(1, (len + chunk - 1) / chunk);
        int g = -1;
        if (ns > 1) {
            g = (int)P.groups.size();
            fi_merge_group mg = {t.b, (int16_t)t.hb, (int16_t)t.he, t.qb, t.qe, slot, ns,
                                 (int)P.items.size(), 0};
            P.groups.push_back(mg);
        }
        for (int s = 0; s < ns; ++s) {
            int kb = t.kb + (int)((long long)len * s / ns);
            int ke = t.kb + (int)((long long)len * (s + 1) / ns);
            fi_work_item it = {t.b, (int16_t)t.hb, (int16_t)t.he, t.qb, t.qe, kb, ke,
                               ns > 1 ? slot++ : -1, g};
            P.items.push_back(it);
        }
    }
    P.num_slots = slot;
    // contiguous assignment by cost
    std::vector<long long> cost;
    long long tot = 0;
    for (auto &it : P.items) { cost.push_back(it.kv_end - it.kv_begin + 64); tot += cost.back(); }
    P.indptr.assign(c.num_ctas + 1, 0);
    long long cum = 0;
    std::vector<int> cta(P.items.size());
    for (size_t i = 0; i < P.items.size(); ++i) {
        long long mid = cum + cost[i] / 2;
        cta[i] = std::min<long long>(c.num_ctas - 1, mid * c.num_ctas / tot);
        cum += cost[i];
    }
    for (size_t i = 0; i < P.items.size(); ++i) P.indptr[cta[i] + 1]++;
    for (int i = 0; i < c.num_ctas; ++i) P.indptr[i + 1] += P.indptr[i];
    P.hdr.num_items = (int)P.items.size();
    P.hdr.num_groups = (int)P.groups.size();
    P.hdr.num_slots = slot;
    P.hdr.batch_size = c.B;
    P.hdr.total_q_tokens = qoff;
    P.hdr.tile_rows = 64;
    P.hdr.causal = c.causal;
    P.hdr.window_left = c.window;
}

template <typename V> static V *dev_copy(const std::vector<V> &v) {
    V *d;
    CK(cudaMalloc(&d, std::max<size_t>(1, v.size()) * sizeof(V)));
    if (!v.empty()) CK(cudaMemcpy(d, v.data(), v.size() * sizeof(V), cudaMemcpyHostToDevice));
    return d;
}

struct Inputs {
    int dt, H, ps, qlen, B, max_pages, num_pages, tokens;
    std::vector<int> kvl;
    std::vector<uint16_t> q, qpe, ckv, kpe;
    std::vector<int32_t> table;
    std::vector<float> sinks;
    float s1, s2;
};

static void make_inputs(const Case &c, std::mt19937_64 &rng, const std::vector<int> &kvl, Inputs &in,
                        bool fill_kv) {
    std::uniform_real_distribution<float> U(-1.f, 1.f);
    in.dt = c.dt; in.H = c.H; in.ps = c.ps; in.qlen = c.qlen; in.B = c.B; in.kvl = kvl;
    int kvm = 1;
    for (int k : kvl) kvm = std::max(kvm, k);
    in.max_pages = (kvm + c.ps - 1) / c.ps;
    in.num_pages = c.B * in.max_pages + 3;
    in.tokens = c.B * c.qlen;
    in.q.resize((size_t)in.tokens * c.H * 512);
    in.qpe.resize((size_t)in.tokens * c.H * 64);
    for (auto &x : in.q) x = f2h(U(rng), c.dt);
    for (auto &x : in.qpe) x = f2h(U(rng), c.dt);
    in.ckv.resize((size_t)in.num_pages * c.ps * 512);
    in.kpe.resize((size_t)in.num_pages * c.ps * 64);
    if (fill_kv) {
        for (auto &x : in.ckv) x = f2h(U(rng), c.dt);
        for (auto &x : in.kpe) x = f2h(U(rng), c.dt);
    } else {  // random-ish but cheap
        uint32_t s = (uint32_t)rng();
        for (auto &x : in.ckv) { s = s * 1664525u + 1013904223u; x = f2h(((s >> 9) * (1.f / 8388608.f)) - 1.f, c.dt); }
        for (auto &x : in.kpe) { s = s * 1664525u + 1013904223u; x = f2h(((s >> 9) * (1.f / 8388608.f)) - 1.f, c.dt); }
    }
    std::vector<int32_t> perm(in.num_pages);
    for (int i = 0; i < in.num_pages; ++i) perm[i] = i;
    if (!getenv("FIMLA_CONTIG_PAGES")) std::shuffle(perm.begin(), perm.end(), rng);
    in.table.resize((size_t)c.B * in.max_pages);
    for (size_t i = 0; i < in.table.size(); ++i) in.table[i] = perm[i];
    in.sinks.resize(c.H);
    for (auto &x : in.sinks) x = U(rng) * 3.f;
    in.s1 = 0.12f + 0.05f * U(rng);
    in.s2 = 1.0f + 0.5f * U(rng);
}

// fp64 reference for one row; returns lse; fills out[512]
static double ref_row(const Case &c, const Inputs &in, int b, int qi, int h, double *out) {
    int kv = in.kvl[b];
    int pos = kv - c.qlen + qi;
    int hi = c.causal ? pos : kv - 1;
    int lo = c.window >= 0 ? std::max(0, pos - c.window) : 0;
    size_t tok = (size_t)b * c.qlen + qi;
    const uint16_t *q = &in.q[(tok * c.H + h) * 512];
    const uint16_t *qp = &in.qpe[(tok * c.H + h) * 64];
    double qf[576];
    for (int d = 0; d < 512; ++d) qf[d] = h2f(q[d], c.dt);
    for (int d = 0; d < 64; ++d) qf[512 + d] = h2f(qp[d], c.dt);
    std::vector<double> s;
    double mx = -INFINITY;
    for (int t = lo; t <= hi; ++t) {
        int page = in.table[(size_t)b * in.max_pages + t / c.ps];
        size_t slot = (size_t)page * c.ps + t % c.ps;
        double acc = 0;
        for (int d = 0; d < 512; ++d) acc += qf[d] * h2f(in.ckv[slot * 512 + d], c.dt);
        for (int d = 0; d < 64; ++d) acc += qf[512 + d] * h2f(in.kpe[slot * 64 + d], c.dt);
        acc *= in.s1;
        s.push_back(acc);
        mx = std::max(mx, acc);
    }
    if (c.sinks) mx = std::max(mx, (double)in.sinks[h]);
    for (int d = 0; d < 512; ++d) out[d] = 0;
    if (mx == -INFINITY) return -INFINITY;
    double den = c.sinks ? exp(in.sinks[h] - mx) : 0;
    for (int t = lo; t <= hi; ++t) {
        double w = exp(s[t - lo] - mx);
        den += w;
        int page = in.table[(size_t)b * in.max_pages + t / c.ps];
        size_t slot = (size_t)page * c.ps + t % c.ps;
        for (int d = 0; d < 512; ++d) out[d] += w * h2f(in.ckv[slot * 512 + d], c.dt);
    }
    for (int d = 0; d < 512; ++d) out[d] = out[d] / den * in.s2;
    return mx + log(den);
}

struct DevRun {
    fi_mla_params p;
    std::vector<void *> allocs;
    float *d_s1 = nullptr, *d_s2 = nullptr;
    template <typename V> V *put(const std::vector<V> &v) { V *d = dev_copy(v); allocs.push_back(d); return d; }
    ~DevRun() { for (void *a : allocs) cudaFree(a); }
};

static void setup_dev(const Case &c, const Inputs &in, const Plan &P, DevRun &D) {
    fi_mla_params &p = D.p;
    memset(&p, 0, sizeof p);
    p.q_nope = D.put(in.q); p.q_nope_stride_tok = (int64_t)c.H * 512; p.q_nope_stride_head = 512;
    p.q_pe = D.put(in.qpe); p.q_pe_stride_tok = (int64_t)c.H * 64; p.q_pe_stride_head = 64;
    if (getenv("FIMLA_CONCAT")) {  // one [pages, ps, 576] cache, two views
        std::vector<uint16_t> cat((size_t)in.num_pages * c.ps * 576);
        for (size_t t = 0; t < (size_t)in.num_pages * c.ps; ++t) {
            memcpy(&cat[t * 576], &in.ckv[t * 512], 1024);
            memcpy(&cat[t * 576 + 512], &in.kpe[t * 64], 128);
        }
        uint16_t *d = D.put(cat);
        p.ckv = d; p.ckv_stride_page = (int64_t)c.ps * 576; p.ckv_stride_tok = 576;
        p.kpe = d + 512; p.kpe_stride_page = (int64_t)c.ps * 576; p.kpe_stride_tok = 576;
    } else {
    p.ckv = D.put(in.ckv); p.ckv_stride_page = (int64_t)c.ps * 512; p.ckv_stride_tok = 512;
    p.kpe = D.put(in.kpe); p.kpe_stride_page = (int64_t)c.ps * 64; p.kpe_stride_tok = 64;
    }
    p.page_table = D.put(in.table);
    void *out; CK(cudaMalloc(&out, (size_t)in.tokens * c.H * 512 * 2)); D.allocs.push_back(out);
    p.out = out; p.out_stride_tok = (int64_t)c.H * 512; p.out_stride_head = 512;
    if (c.lse) {
        float *l; CK(cudaMalloc(&l, (size_t)in.tokens * c.H * 4)); D.allocs.push_back(l);
        p.lse = l; p.lse_stride_tok = c.H; p.lse_stride_head = 1;
    }
    p.bmm1_scale = c.scale_ptr ? -99.f : in.s1;
    p.bmm2_scale = c.scale_ptr ? -99.f : in.s2;
    if (c.scale_ptr) {
        p.bmm1_scale_ptr = D.put(std::vector<float>{in.s1});
        p.bmm2_scale_ptr = D.put(std::vector<float>{in.s2});
    }
    if (c.sinks) p.sinks = D.put(in.sinks);
    p.header = D.put(std::vector<fi_plan_header>{P.hdr});
    {   /* per-CTA start records (the kernel's only view of the CSR ranges) */
        std::vector<fi_cta_start> st(c.num_ctas);
        for (int k = 0; k < c.num_ctas; ++k)
            st[k] = fi_cta_start_make(P.indptr.data(), P.items.data(), P.req.data(), k);
        p.cta_starts = D.put(st);
    }
    p.requests = D.put(P.req);
    p.groups = D.put(P.groups);
    p.items = D.put(P.items);
    float *po; CK(cudaMalloc(&po, (size_t)std::max(1, P.num_slots) * 64 * 512 * 4)); D.allocs.push_back(po);
    float *pl; CK(cudaMalloc(&pl, (size_t)std::max(1, P.num_slots) * 64 * 4)); D.allocs.push_back(pl);
    uint32_t *sem; CK(cudaMalloc(&sem, (size_t)std::max<size_t>(1, P.groups.size()) * 4)); D.allocs.push_back(sem);
    CK(cudaMemset(sem, 0, std::max<size_t>(1, P.groups.size()) * 4));
    p.partial_o = po; p.partial_lse = pl; p.semaphores = sem;
    p.num_ctas = c.num_ctas; p.page_size = c.ps;
    int sh = 0; while ((1 << sh) < c.ps) ++sh;
    p.page_shift = sh; p.num_heads = c.H; p.tile_rows = 64;
}

static int check_case(const Case &c, uint64_t seed, bool quiet) {
    std::mt19937_64 rng(seed);
    std::vector<int> kvl(c.B);
    for (int b = 0; b < c.B; ++b) {
        int lo = std::max(c.kvmin, c.causal ? c.qlen : 0);
        kvl[b] = lo + (int)(rng() % (uint64_t)(c.kvmax - lo + 1));
    }
    Inputs in;
    make_inputs(c, rng, kvl, in, true);
    Plan P;
    build_plan(c, kvl, in.max_pages, P);
    DevRun D;
    setup_dev(c, in, P, D);
    size_t n_out = (size_t)in.tokens * c.H * 512;
    std::vector<uint16_t> o1(n_out), o2(n_out);
    std::vector<float> l1((size_t)in.tokens * c.H), l2(l1.size());
    int fails = 0;
    for (int rep = 0; rep < 2; ++rep) {
        CK(cudaMemset(D.p.out, 0xFF, n_out * 2));  // NaN poison
        if (c.lse) CK(cudaMemset(D.p.lse, 0xFF, l1.size() * 4));
        int e = fi_launch_mla_decode(&D.p, (fi_dtype)c.dt, rep, 0);
        if (e) { printf("launch error %d\n", e); return 1; }
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(rep ? o2.data() : o1.data(), D.p.out, n_out * 2, cudaMemcpyDeviceToHost));
        if (c.lse) CK(cudaMemcpy(rep ? l2.data() : l1.data(), D.p.lse, l1.size() * 4, cudaMemcpyDeviceToHost));
    }
    bool same = memcmp(o1.data(), o2.data(), n_out * 2) == 0 &&
                (!c.lse || memcmp(l1.data(), l2.data(), l1.size() * 4) == 0);
    double num = 0, den = 0, lse_err = 0;
    long nan = 0, lse_bad = 0;
    std::vector<double> ref(512);
    for (int b = 0; b < c.B; ++b)
        for (int qi = 0; qi < c.qlen; ++qi)
            for (int h = 0; h < c.H; ++h) {
                double lse = ref_row(c, in, b, qi, h, ref.data());
                size_t row = ((size_t)b * c.qlen + qi) * c.H + h;
                for (int d = 0; d < 512; ++d) {
                    float g = h2f(o1[row * 512 + d], c.dt);
                    if (std::isnan(g)) { ++nan; continue; }
                    num += (g - ref[d]) * (g - ref[d]);
                    den += ref[d] * ref[d];
                }
                if (c.lse) {
                    float g = l1[row];
                    if (std::isinf(lse)) { if (!(std::isinf(g) && g < 0)) ++lse_bad; }
                    else if (std::isnan(g)) ++lse_bad;
                    else lse_err = std::max(lse_err, fabs(g - lse));
                }
            }
    double rel = den > 0 ? sqrt(num / den) : sqrt(num);
    bool ok = nan == 0 && lse_bad == 0 && rel <= 1e-2 && lse_err < 2e-2 && same;
    if (!ok || !quiet)
        printf("%-34s seed=%llu items=%d groups=%d rel=%.2e lse_err=%.2e nan=%ld lse_bad=%ld det=%d %s\n",
               c.name, (unsigned long long)seed, P.hdr.num_items, P.hdr.num_groups, rel, lse_err, nan,
               lse_bad, (int)same, ok ? "OK" : "FAIL");
    fails += !ok;
    return fails;
}

// ---------------- bench ----------------
__global__ void read_bw_kernel(const uint4 *__restrict__ p, size_t n, unsigned *sink) {
    unsigned acc = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x;
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c2 = __ldcs(p + i + 2 * stride),
              d = __ldcs(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c2.x ^ c2.y ^ c2.z ^ c2.w ^ d.x ^ d.y ^
               d.z ^ d.w;
    }
    for (; i < n; i += stride) { uint4 a = __ldcs(p + i); acc ^= a.x ^ a.y ^ a.z ^ a.w; }
    if (acc == 0x12345678u) *sink = acc;
}

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

static double read_ceiling(int sms) {
    size_t bytes = (size_t)2 << 30;
    uint4 *buf; unsigned *sink;
    CK(cudaMalloc(&buf, bytes)); CK(cudaMalloc(&sink, 4));
    CK(cudaMemset(buf, 1, bytes));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    std::vector<float> t;
    for (int i = 0; i < 20; ++i) {
        cudaEventRecord(a);
        read_bw_kernel<<<sms * 4, 1024>>>(buf, bytes / 16, sink);
        cudaEventRecord(b);
        CK(cudaEventSynchronize(b));
        float ms; cudaEventElapsedTime(&ms, a, b);
        if (i >= 3) t.push_back(ms);
    }
    CK(cudaFree(buf)); CK(cudaFree(sink));
    return bytes / (median(t) * 1e-3) / 1e9;
}

#ifdef FIMLA_TIMING
extern "C" void fimla_read_stamps(unsigned long long *host, int n);
extern "C" void fimla_phases(unsigned long long *host, int n, int reset);
static void phases_reset() { fimla_phases(nullptr, 0, 1); }
static void phases_print(int n) {
    std::vector<unsigned long long> ph((size_t)n * 8);
    fimla_phases(ph.data(), n, 0);
    double tot[8] = {0};
    for (int i = 0; i < n; ++i) for (int k = 0; k < 8; ++k) tot[k] += ph[i * 8 + k];
    double steps = 0; for (int k = 0; k < 7; ++k) steps += tot[k];
    const char *nm[8] = {"wait", "S", "sync1", "soft", "sync2", "PV", "topsync", "loads"};
    printf("   warp0 clocks/CTA (1 launch):");
    for (int k = 0; k < 8; ++k) printf(" %s %.0f", nm[k], tot[k] / n);
    printf("\n");
    fimla_phases(ph.data(), n, 2);
    double it[8] = {0};
    for (int i = 0; i < n; ++i) for (int k = 0; k < 8; ++k) it[k] += ph[i * 8 + k];
    const char *inm[6] = {"prologue", "Qwait", "loop", "epilogue", "fence+sem", "merge"};
    printf("   item clocks/CTA:");
    for (int k = 0; k < 6; ++k) printf(" %s %.0f", inm[k], it[k] / n);
    printf("\n");
}
static void print_stamps(int n) {
    std::vector<unsigned long long> st((size_t)n * 4);
    fimla_read_stamps(st.data(), n);
    unsigned long long t0 = ~0ull, tend = 0;
    for (int i = 0; i < n; ++i) { t0 = std::min(t0, st[i * 4]); tend = std::max(tend, st[i * 4 + 3]); }
    std::vector<double> start, wait, loop, tot;
    for (int i = 0; i < n; ++i) {
        start.push_back((st[i * 4] - t0) / 1e3);
        wait.push_back((st[i * 4 + 1] - st[i * 4]) / 1e3);
        tot.push_back((st[i * 4 + 3] - st[i * 4 + 1]) / 1e3);
        loop.push_back(st[i * 4 + 2] > st[i * 4 + 1] && st[i*4+2] < st[i*4+3] ? (st[i * 4 + 3] - st[i * 4 + 2]) / 1e3 : 0);
    }
    auto mm = [](std::vector<double> v) { std::sort(v.begin(), v.end()); char b[96]; snprintf(b, 96, "min %.1f med %.1f max %.1f", v[0], v[v.size()/2], v.back()); return std::string(b); };
    printf("   stamps us: span %.1f | cta start %s | wait %s | work %s | after-last-split %s\n", (tend - t0) / 1e3,
           mm(start).c_str(), mm(wait).c_str(), mm(tot).c_str(), mm(loop).c_str());
}
#else
static void print_stamps(int) {}
static void phases_reset() {}
static void phases_print(int) {}
#endif

static void bench_case(const Case &c, const std::vector<int> &kvl, double ceil_gbs, int nsample) {
    std::mt19937_64 rng(1234);
    Inputs in;
    make_inputs(c, rng, kvl, in, false);
    Plan P;
    build_plan(c, kvl, in.max_pages, P);
    DevRun D;
    setup_dev(c, in, P, D);
    // spot-check a few rows against the reference
    CK(cudaDeviceSynchronize());
    phases_reset();
    int e = fi_launch_mla_decode(&D.p, (fi_dtype)c.dt, 1, 0);
    if (e) { printf("launch error %d\n", e); exit(1); }
    CK(cudaDeviceSynchronize());
    phases_print(c.num_ctas);
    size_t n_out = (size_t)in.tokens * c.H * 512;
    std::vector<uint16_t> o(n_out);
    CK(cudaMemcpy(o.data(), D.p.out, n_out * 2, cudaMemcpyDeviceToHost));
    double num = 0, den = 0;
    std::vector<double> ref(512);
    for (int s = 0; s < nsample; ++s) {
        int b = rng() % c.B, qi = rng() % c.qlen, h = rng() % c.H;
        ref_row(c, in, b, qi, h, ref.data());
        size_t row = ((size_t)b * c.qlen + qi) * c.H + h;
        for (int d = 0; d < 512; ++d) {
            double g = h2f(o[row * 512 + d], c.dt);
            num += (g - ref[d]) * (g - ref[d]); den += ref[d] * ref[d];
        }
    }
    double rel = sqrt(num / den);
    // graph of one launch, PDL on
    cudaStream_t st; CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    cudaGraph_t g; cudaGraphExec_t ge;
    CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
    e = fi_launch_mla_decode(&D.p, (fi_dtype)c.dt, 1, st);
    CK(cudaStreamEndCapture(st, &g));
    if (e) { printf("capture launch error %d\n", e); exit(1); }
    CK(cudaGraphInstantiate(&ge, g, 0));
    void *flush; size_t fl = 256 << 20; CK(cudaMalloc(&flush, fl));
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
    double res[2];
    for (int mode = 0; mode < 2; ++mode) {
        std::vector<float> t;
        for (int i = 0; i < 80; ++i) {
            if (mode) CK(cudaMemsetAsync(flush, i, fl, st));
            cudaEventRecord(a, st);
            CK(cudaGraphLaunch(ge, st));
            cudaEventRecord(b, st);
            CK(cudaEventSynchronize(b));
            float ms; cudaEventElapsedTime(&ms, a, b);
            if (i >= 10) t.push_back(ms);
        }
        res[mode] = median(t) * 1e3;
    }
    long long kv_tok = 0;
    for (auto &it : P.items) kv_tok += it.kv_end - it.kv_begin;
    // bytes: KV once per (request, head chunk) actually read by items + q + out
    double bytes = (double)kv_tok * 576 * 2 + (double)in.tokens * c.H * (576 + 512) * 2;
    long long flop_tok = 0;
    for (auto &it : P.items) flop_tok += (long long)(it.kv_end - it.kv_begin) * (it.q_end - it.q_begin) * (it.head_end - it.head_begin);
    double flops = 2.0 * flop_tok * (576 + 512);
    // unique KV bytes (each request's KV once): the number the bar uses
    long long uniq = 0;
    for (int bb = 0; bb < c.B; ++bb) uniq += kvl[bb];
    double ubytes = (double)uniq * 576 * 2 + (double)in.tokens * c.H * (576 + 512) * 2;
    printf("%-28s items=%5d groups=%4d rel=%.1e | b2b %8.1f us %7.0f GB/s %5.1f%% %6.1f TF/s | flushed %8.1f us %7.0f GB/s %5.1f%%  (read-bytes/unique %.2f)\n",
           c.name, P.hdr.num_items, P.hdr.num_groups, rel, res[0], ubytes / res[0] / 1e3,
           100 * ubytes / res[0] / 1e3 / ceil_gbs, flops / res[0] / 1e6, res[1], ubytes / res[1] / 1e3,
           100 * ubytes / res[1] / 1e3 / ceil_gbs, bytes / ubytes);
    CK(cudaDeviceSynchronize());
    print_stamps(c.num_ctas);
    cudaFree(flush);
    cudaGraphExecDestroy(ge); cudaGraphDestroy(g); cudaStreamDestroy(st);
}

int main(int argc, char **argv) {
    int sms = 0;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    uint64_t seed = getenv("FIMLA_SEED") ? strtoull(getenv("FIMLA_SEED"), nullptr, 10) : (uint64_t)time(nullptr);
    if (argc > 1 && !strcmp(argv[1], "small")) {
        Case c = {"small-split", FI_DTYPE_BF16, 16, 16, 2, 3, 40, 300, 1, -1, 1, 1, 1, 8, 32};
        if (getenv("FIMLA_PLAN")) {  // print the plan items
            std::mt19937_64 rng(seed);
            std::vector<int> kvl(c.B);
            for (int b = 0; b < c.B; ++b) { int lo = std::max(c.kvmin, c.qlen); kvl[b] = lo + (int)(rng() % (uint64_t)(c.kvmax - lo + 1)); }
            Plan P; build_plan(c, kvl, 64, P);
            for (int i = 0; i < c.num_ctas; ++i) for (int k = P.indptr[i]; k < P.indptr[i + 1]; ++k) {
                auto &it = P.items[k];
                printf("cta %d item %d req %d h %d-%d q %d-%d kv %d-%d slot %d g %d\n", i, k, it.request, it.head_begin, it.head_end, it.q_begin, it.q_end, it.kv_begin, it.kv_end, it.out_slot, it.merge_group);
            }
        }
        return check_case(c, seed, false) ? 1 : 0;
    }
    if (argc > 1 && !strcmp(argv[1], "one")) {  // for ncu: one launch each of h16 and h128
        std::vector<int> k128(128, 4096);
        Case cs[2] = {{"h16", FI_DTYPE_BF16, 16, 64, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256},
                      {"h128", FI_DTYPE_BF16, 128, 64, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}};
        for (auto &c : cs) {
            std::mt19937_64 rng(1);
            Inputs in; make_inputs(c, rng, k128, in, false);
            Plan P; build_plan(c, k128, in.max_pages, P);
            DevRun D; setup_dev(c, in, P, D);
            fi_launch_mla_decode(&D.p, (fi_dtype)c.dt, 0, 0);
            CK(cudaDeviceSynchronize());
        }
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench1")) {
        std::vector<int> k128(128, 4096);
        bench_case({"h16 q1 b128 kv4096", FI_DTYPE_BF16, 16, 64, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}, k128, 4600, 2);
        bench_case({"h128 q1 b128 kv4096", FI_DTYPE_BF16, 128, 64, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}, k128, 4600, 1);
        return 0;
    }
    if (argc > 1 && !strcmp(argv[1], "bench")) {
        double ceil_gbs = read_ceiling(sms);
        printf("read ceiling: %.0f GB/s (2 GiB, 16-byte loads), SMs %d\n", ceil_gbs, sms);
        std::vector<int> k128(128, 4096);
        bench_case({"h16 q1 b128 kv4096", FI_DTYPE_BF16, 16, 64, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}, k128, ceil_gbs, 8);
        bench_case({"h16 q1 b128 kv4096 ps1", FI_DTYPE_BF16, 16, 1, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}, k128, ceil_gbs, 4);
        bench_case({"h128 q1 b128 kv4096", FI_DTYPE_BF16, 128, 64, 1, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}, k128, ceil_gbs, 4);
        bench_case({"h128 q2 b128 kv4096", FI_DTYPE_BF16, 128, 64, 2, 128, 0, 0, 1, -1, 0, 0, 0, sms, 256}, k128, ceil_gbs, 4);
        std::vector<int> k1(1, 32768);
        bench_case({"h16 q1 b1 kv32768", FI_DTYPE_BF16, 16, 64, 1, 1, 0, 0, 1, -1, 0, 0, 0, sms, 128}, k1, ceil_gbs, 4);
        bench_case({"h16 q1 b1 kv32768 ch512", FI_DTYPE_BF16, 16, 64, 1, 1, 0, 0, 1, -1, 0, 0, 0, sms, 512}, k1, ceil_gbs, 4);
        bench_case({"h16 q1 b1 kv32768 ch1024", FI_DTYPE_BF16, 16, 64, 1, 1, 0, 0, 1, -1, 0, 0, 0, sms, 1024}, k1, ceil_gbs, 4);
        bench_case({"h128 q1 b1 kv32768", FI_DTYPE_BF16, 128, 64, 1, 1, 0, 0, 1, -1, 0, 0, 0, sms, 128}, k1, ceil_gbs, 4);
        if (argc > 2) {
            FILE *f = fopen(argv[2], "r");
            std::vector<int> kt;
            int v;
            while (f && fscanf(f, "%d", &v) == 1) kt.push_back(v);
            if (f) fclose(f);
            if (!kt.empty()) {
                long long s = 0; for (int x : kt) s += x;
                printf("trace snapshot: %zu requests, mean kv %lld\n", kt.size(), s / (long long)kt.size());
                bench_case({"h16 q1 trace snapshot", FI_DTYPE_BF16, 16, 64, 1, (int)kt.size(), 0, 0, 1, -1, 0, 0, 0, sms, 256}, kt, ceil_gbs, 8);
                std::vector<int> ku(kt.size(), (int)(s / (long long)kt.size()));
                bench_case({"h16 q1 uniform same total", FI_DTYPE_BF16, 16, 64, 1, (int)kt.size(), 0, 0, 1, -1, 0, 0, 0, sms, 256}, ku, ceil_gbs, 8);
                bench_case({"h128 q1 trace snapshot", FI_DTYPE_BF16, 128, 64, 1, (int)kt.size(), 0, 0, 1, -1, 0, 0, 0, sms, 256}, kt, ceil_gbs, 4);
            }
        }
        return 0;
    }
    printf("seed %llu\n", (unsigned long long)seed);
    std::vector<Case> cases;
    const int dts[2] = {FI_DTYPE_BF16, FI_DTYPE_F16};
    const int Hs[4] = {16, 32, 64, 128};
    const int pss[4] = {1, 16, 32, 64};
    int k = 0;
    static char names[512][64];
    for (int dt : dts)
        for (int H : Hs)
            for (int ps : pss)
                for (int ql = 1; ql <= 4; ql += (dt == FI_DTYPE_BF16 ? 1 : 3)) {
                    Case c;
                    snprintf(names[k], 64, "%s h%d ps%d q%d", dt == FI_DTYPE_BF16 ? "bf16" : "f16", H, ps, ql);
                    c.name = names[k];
                    c.dt = dt; c.H = H; c.ps = ps; c.qlen = ql;
                    c.B = 3 + (k % 4);
                    c.kvmin = (k % 5 == 0) ? 0 : 1;
                    c.kvmax = 200 + 97 * (k % 7);
                    c.causal = (k % 5 == 0) ? 0 : 1;
                    c.window = (k % 6 == 1) ? 37 : -1;
                    c.sinks = k % 3 == 0;
                    c.scale_ptr = k % 2;
                    c.lse = (k % 4) != 3;
                    c.num_ctas = 7 + (k % 20);
                    c.min_chunk = 32 + 16 * (k % 3);
                    cases.push_back(c);
                    ++k;
                }
    int fails = 0;
    for (size_t i = 0; i < cases.size(); ++i) fails += check_case(cases[i], seed + i, true);
    // kv_len 0 everywhere (non-causal): zeros and -inf
    Case z = {"all kv_len 0", FI_DTYPE_BF16, 16, 16, 1, 4, 0, 0, 0, -1, 0, 0, 1, 5, 32};
    fails += check_case(z, seed, false);
    Case zs = {"all kv_len 0 + sinks", FI_DTYPE_BF16, 64, 16, 2, 4, 0, 0, 0, -1, 1, 0, 1, 5, 32};
    fails += check_case(zs, seed, false);
    Case big = {"bf16 h128 ps64 q2 long split", FI_DTYPE_BF16, 128, 64, 2, 2, 3000, 5000, 1, -1, 1, 1, 1, 132, 64};
    fails += check_case(big, seed, false);
    printf("%zu cases, %d failed\n", cases.size() + 3, fails);
    return fails ? 1 : 0;
}
