/* planner/tiles.c - tiles of a batch: geometry, order, trimmed KV range, cost (tiles.h). */
#include "planner/tiles.h"

#include "plan/mask.h"
#include "planner/parallel.h"

/* The tile geometry of the caps and row, per batch. */
typedef struct tile_geo {
    int32_t h_kv, group, q_step, h_step, n_hb;
    int32_t ways; /* tiles.h's order: 1 request-major; n_hb head-chunk-major; h_kv KV-head-major */
    int32_t whole_groups; /* group % h_step == 0: every head chunk is h_step heads */
} tile_geo;

FI_PD_STATIC tile_geo tile_geo_of(const fi_variant *v, const fi_caps *caps) {
    tile_geo g;
    g.h_kv = caps->num_kv_heads;
    g.group = caps->num_qo_heads / g.h_kv;
    /* q rows per tile and heads per tile */
    g.q_step = g.group >= v->tile_rows ? 1 : v->tile_rows / g.group;
    g.h_step = g.group >= v->tile_rows ? v->tile_rows : g.group;
    g.n_hb = (g.group + g.h_step - 1) / g.h_step;
    g.ways = g.n_hb > 1 ? g.n_hb : 1; /* KV-head-major: set by kv_head_order, per batch */
    g.whole_groups = g.group % g.h_step == 0;
    return g;
}

/* KV-head-major order for a batch of n tiles (tiles.h): rows with kv_head_major, several KV
 * heads and one head chunk, and more tiles than the row would ever pack (packing sorts the
 * tiles by cost, and its sort runs on the equal-cost runs a request's KV heads form in
 * request-major order: GQA decode at 32 requests planned 15% slower on KV-head-major
 * tiles).  Sets g->ways to H_kv, or leaves it 1. */
FI_PD_STATIC void kv_head_order(tile_geo *g, const fi_variant *v, const fi_caps *caps, int64_t n) {
    const int32_t per_cta = v->pack_thin_tiles_per_cta > v->pack_max_tiles_per_cta
                                ? v->pack_thin_tiles_per_cta
                                : v->pack_max_tiles_per_cta;
    if (v->kv_head_major && g->h_kv > 1 && g->n_hb == 1 && n > (int64_t)caps->num_ctas * per_cta)
        g->ways = g->h_kv;
}

/* Two 32-bit fields of a tile as one little-endian 8-byte word (lo first), as fi_tile lies:
 * request | heads, q_begin | q_end, kv_begin | kv_end, then the 8-byte cost. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "tile_word assumes a little-endian host (as the GPU is)"
#endif
FI_STATIC_ASSERT(offsetof(fi_tile, head_begin) == 4 && offsetof(fi_tile, head_end) == 6 &&
                     offsetof(fi_tile, q_begin) == 8 && offsetof(fi_tile, kv_begin) == 16 &&
                     offsetof(fi_tile, cost) == 24 && sizeof(fi_tile) == 32,
                 "tile_word: fi_tile is four 8-byte words");
FI_PD_STATIC inline uint64_t tile_word(uint32_t lo, uint32_t hi) {
    return (uint64_t)lo | (uint64_t)hi << 32;
}

/* Query-row tiles of a request with q_len query rows (no division for decode). */
FI_PD_STATIC FI_PD_INLINE int64_t request_q_tiles(const tile_geo *g, int32_t q_len) {
    return q_len <= g->q_step ? q_len > 0 : (q_len + g->q_step - 1) / g->q_step;
}

/* Tiles of a request with q_len query rows. */
FI_PD_STATIC int64_t request_tile_count(const tile_geo *g, int32_t q_len) {
    return (int64_t)g->h_kv * request_q_tiles(g, q_len) * g->n_hb;
}

/* Whether request_tiles takes its decode path for a request of q_len rows (one q block,
 * whole head chunks; stride 0 or one head chunk). */
FI_PD_STATIC FI_PD_INLINE int decode_tiles_apply(const tile_geo *g, int32_t q_len, int64_t stride) {
    return (stride == 0 || g->n_hb == 1) && q_len >= 1 && q_len <= g->q_step && g->whole_groups;
}

/* request_tiles for a request decode_tiles_apply accepts (every GQA / MLA decode batch):
 * the KV range and the cost depend on the request only, so they are computed once for its
 * h_kv x head-block tiles (GQA decode at 1024 requests: 8192 tiles); same tiles, same
 * order.  Inlined into the tile loops (the device planner's parallel build writes a tile a
 * thread at MLA heads 16: an outlined call was most of that step). */
FI_PD_STATIC FI_PD_INLINE int64_t decode_tiles(const fi_variant *row, const tile_geo *g, int32_t b,
                                               const fi_request_info *r, int32_t causal,
                                               int32_t window_left, fi_tile *out, int64_t stride) {
    const int32_t q_len = r->q_len, kv_len = r->kv_len;
    int32_t lo, hi, n = 0;
    fi_tile_kv_range(causal, window_left, q_len, kv_len, 0, q_len, &lo, &hi);
    const int64_t cost = fi_variant_item_cost(row, hi - lo, (int64_t)q_len * g->h_step);
    /* Each tile stored as the four 8-byte words of its layout (tile_word), kept in
     * registers: fewer stores than field by field (GQA decode at 1024 requests: 8192
     * tiles), and no 16-byte reload of a tile just built in memory field by field, which
     * stalls on store forwarding (half of tile building at MLA heads 16, one tile a
     * request).  Heads stay below 2^15, so adding step to both halves never carries. */
    const int32_t heads = g->h_kv * g->group, step = g->h_step;
    uint64_t w0 = tile_word((uint32_t)b, (uint32_t)step << 16); /* heads 0 .. step */
    const uint64_t w1 = tile_word(0, (uint32_t)q_len);
    const uint64_t w2 = tile_word((uint32_t)lo, (uint32_t)hi), w3 = (uint64_t)cost;
    const uint64_t next = tile_word(0, (uint32_t)step * 0x10001u); /* both heads + step */
    const int64_t advance = stride ? stride : 1; /* tile n (KV head n) at out[n * advance] */
    fi_tile *at = out;
    for (int32_t hb = 0; hb < heads; hb += step, at += advance) {
#ifdef __CUDA_ARCH__ /* two 16-byte stores (a tile is 32-byte aligned): tiles.h */
        ((ulonglong2 *)at)[0] = make_ulonglong2(w0, w1);
        ((ulonglong2 *)at)[1] = make_ulonglong2(w2, w3);
#else
        unsigned char *o = (unsigned char *)at;
        fi_copy_bytes(o, &w0, 8);
        fi_copy_bytes(o + 8, &w1, 8);
        fi_copy_bytes(o + 16, &w2, 8);
        fi_copy_bytes(o + 24, &w3, 8);
#endif
        w0 += next;
        n++;
    }
    return cost * n;
}

/* Write request b's tiles (request_tile_count of them); returns their cost.  stride 0:
 * request-major, at out[0 ..) in (KV head, q tile, head chunk) order; else, with several
 * head chunks (g.n_hb > 1), head-chunk-major: the tile of (KV head, q tile) i and head
 * chunk c at out[i + c * stride]; with one (g.ways == h_kv), KV-head-major: the tile of
 * KV head kvh and q tile j at out[j + kvh * stride].  The general path (prefill, MTP
 * blocks, split head groups); decode requests go through decode_tiles. */
FI_PD_STATIC FI_PD_OUTLINE int64_t request_tiles_general(const fi_variant *row, const tile_geo *gp,
                                                         int32_t b, const fi_request_info *r,
                                                         int32_t causal, int32_t window_left,
                                                         fi_tile *out, int64_t stride) {
    const tile_geo g = *gp;
    const int32_t q_len = r->q_len, kv_len = r->kv_len;
    int64_t total = 0;
    int64_t i = 0; /* (KV head, q tile) pairs so far */
    const int64_t nq = request_q_tiles(&g, q_len); /* q tiles a KV head */
    for (int32_t kvh = 0; kvh < g.h_kv; kvh++) {
        const int32_t h0 = kvh * g.group, h1 = h0 + g.group;
        for (int32_t q0 = 0; q0 < q_len; q0 += g.q_step, i++) {
            const int32_t q1 = q0 + g.q_step < q_len ? q0 + g.q_step : q_len;
            int32_t lo, hi;
            fi_tile_kv_range(causal, window_left, q_len, kv_len, q0, q1, &lo, &hi);
            for (int32_t hb = h0, c = 0; hb < h1; hb += g.h_step, c++) {
                const int32_t he = hb + g.h_step < h1 ? hb + g.h_step : h1;
                const int64_t cost = fi_variant_item_cost(row, hi - lo, (int64_t)(q1 - q0) * (he - hb));
                const fi_tile t = {b, (int16_t)hb, (int16_t)he, q0, q1, lo, hi, cost};
                out[stride == 0      ? i * g.n_hb + c
                    : g.n_hb > 1     ? i + c * stride
                                     : i - kvh * nq + kvh * stride] = t;
                total += cost;
            }
        }
    }
    return total;
}

/* Request b's tiles, by the path that applies. */
FI_PD_STATIC FI_PD_INLINE int64_t request_tiles(const fi_variant *row, const tile_geo *g, int32_t b,
                                                const fi_request_info *r, int32_t causal,
                                                int32_t window_left, fi_tile *out, int64_t stride) {
    return decode_tiles_apply(g, r->q_len, stride)
               ? decode_tiles(row, g, b, r, causal, window_left, out, stride)
               : request_tiles_general(row, g, b, r, causal, window_left, out, stride);
}

FI_PD_STATIC fi_status over_tiles(fi_error_detail *err, int32_t b, int32_t max_tiles) {
    err->status = FI_ERR_PLAN_OVER_CAPS;
    err->request = b;
    err->needed = (int64_t)max_tiles + 1;
    err->limit = max_tiles;
    err->cuda_error = 0;
    return FI_ERR_PLAN_OVER_CAPS;
}

FI_PD fi_status fi_tiles_build(const fi_variant *v, const fi_caps *caps,
                               const fi_request_info *requests, int32_t batch_size,
                               int32_t causal, int32_t window_left, fi_tile *tiles,
                               int32_t max_tiles, int32_t *num_tiles, int64_t *total_cost,
                               fi_error_detail *err) {
    /* A local copy: the tile stores below could alias *v, which would reload it per tile. */
    const fi_variant row = *v;
    tile_geo g = tile_geo_of(&row, caps);
    int64_t n = 0, total = 0;
    if (g.ways > 1 || (row.kv_head_major && g.h_kv > 1)) { /* count first */
        for (int32_t b = 0; b < batch_size; b++) {
            n += request_tile_count(&g, requests[b].q_len);
            if (n > max_tiles)
                return over_tiles(err, b, max_tiles);
        }
        kv_head_order(&g, &row, caps, n);
    }
    if (g.ways > 1) { /* head-chunk- or KV-head-major (tiles.h): place by the count */
        const int64_t stride = n / g.ways, per = (int64_t)g.h_kv * g.n_hb / g.ways;
        int64_t at = 0;
        for (int32_t b = 0; b < batch_size; b++) {
            total += request_tiles(&row, &g, b, &requests[b], causal, window_left, tiles + at, stride);
            at += request_q_tiles(&g, requests[b].q_len) * per; /* its tiles / ways */
        }
        *num_tiles = (int32_t)n;
        *total_cost = total;
        return FI_OK;
    }
    n = 0;
    for (int32_t b = 0; b < batch_size; b++) {
        const int64_t k = request_tile_count(&g, requests[b].q_len);
        if (n + k > max_tiles)
            return over_tiles(err, b, max_tiles);
        total += request_tiles(&row, &g, b, &requests[b], causal, window_left, tiles + n, 0);
        n += k;
    }
    *num_tiles = (int32_t)n;
    *total_cost = total;
    return FI_OK;
}

FI_PD fi_status fi_tiles_build_parallel(const fi_variant *v, const fi_caps *caps,
                                        const fi_request_info *requests, int32_t batch_size,
                                        int32_t causal, int32_t window_left, int64_t *offset,
                                        fi_tile *tiles, int32_t max_tiles, fi_tile_set *ts,
                                        fi_error_detail *err) {
    tile_geo g = tile_geo_of(v, caps);
    FI_PP_FOR_CHUNK(b, batch_size)
    offset[b] = request_tile_count(&g, requests[b].q_len);
    const int64_t n = fi_pp_scan(offset, batch_size);
    if (n > max_tiles) { /* the first request that does not fit, as the sequential build */
        int64_t first = batch_size;
        FI_PP_FOR(b, batch_size)
        if (b < first && offset[b] + request_tile_count(&g, requests[b].q_len) > max_tiles)
            first = b;
        return over_tiles(err, (int32_t)fi_pp_min(first), max_tiles);
    }
    kv_head_order(&g, v, caps, n);
    ts->first = tiles;
    ts->T = (int32_t)n;
    ts->period = (int32_t)n;
    ts->blocks = 1;
    ts->block_heads = 0;
    if (g.ways > 1 && g.n_hb == 1 && v->cost_beta > 0) {
        /* KV-head-major: the first KV head's tiles only (scratch.h fi_tile_set); one KV
         * head's geometry writes a request's tiles of KV head 0 in the same order.  Never a
         * batch that pair packing takes (it reads tiles[0 .. T)): kv_head_order wants more
         * than num_ctas x pack_thin_tiles_per_cta tiles, pairs at most 2 num_ctas of a row
         * whose pack_thin_tiles_per_cta is >= 2 (planner/partition.h). */
        tile_geo g1 = g;
        g1.h_kv = 1;
        FI_PP_FOR(b, batch_size)
        request_tiles(v, &g1, b, &requests[b], causal, window_left, tiles + offset[b] / g.ways, 0);
        ts->period = (int32_t)(n / g.ways);
        ts->blocks = g.ways;
        ts->block_heads = g.group;
    } else if (g.ways > 1) { /* head-chunk- or KV-head-major: a request's first tiles at offset / ways */
        FI_PP_FOR(b, batch_size)
        request_tiles(v, &g, b, &requests[b], causal, window_left, tiles + offset[b] / g.ways,
                      n / g.ways);
    } else {
        FI_PP_FOR(b, batch_size)
        request_tiles(v, &g, b, &requests[b], causal, window_left, tiles + offset[b], 0);
    }
    FI_PP_SYNC(); /* the tiles are read by other threads next */
    return FI_OK;
}
