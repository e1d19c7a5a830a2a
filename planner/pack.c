/*
 * planner/pack.c - the packing partition (planner/pack.h): best-fit decreasing bin
 * packing of tiles into CTAs, cutting only what does not fit.
 *
 * Per update: tiles sorted by cost once (LSD radix sort, stable: ties keep tile order),
 * then a few packings under caps T from a galloping / bisection search for the smallest
 * T that packs (under a cap that packs, the largest CTA cost is T or just below, so the
 * smallest such T is the best plan of this kind).  One packing (pk_try):
 *   1. tiles costing more than T, largest first: full pieces of one CTA each (the piece
 *      as long as T allows with its piece charge), the remainder queued;
 *   2. the queue (remainders merged with the whole tiles, largest first): an item of more
 *      than half of T opens a new CTA (no open CTA can hold it: each holds an item at least
 *      as large); a smaller one goes to the fullest CTA that still holds it (best fit),
 *      else a new CTA, else it is cut into the CTA with the most room (the rest queued).
 * Cost O(tiles + CTAs) per packing (best fit through load buckets, bk_*).
 */
#include "planner/pack.h"

#include <stdint.h>
#include <string.h>

#include "planner/model.h"

/* The variant row's rules as packing uses them: where a tile may be cut, and what a piece
 * of a cut tile is charged (fi_variant_piece_charge). */
typedef struct pk_rules {
    fi_split_grain grain;
    int64_t piece;
} pk_rules;

/* A piece's cost with its charge, if it is one of a cut tile. */
FI_PD_STATIC inline int64_t pk_cost(const pk_rules *r, const fi_pack_piece *x) {
    return x->cost + (x->split ? r->piece : 0);
}

/* by_cost[0 .. num_tiles): tile indices by decreasing cost, ties in tile order, and
 * suffix[0 .. num_tiles]: the cost of by_cost[w ..] at w (written with by_cost, as the
 * total less what precedes w: no second pass over the tiles).
 * Consecutive tiles of equal cost (the KV heads of a GQA decode request) form a run, and
 * the runs are sorted instead of the tiles (stable, so the order is the same): GQA decode
 * has 8 tiles a run.  LSD radix sort of the keys max - cost (so a stable ascending sort
 * gives that order), in as few passes of as narrow digits as the keys' range needs (trace
 * decode batches: two passes of 6 bits, 64 counters instead of 256 to clear and sum).
 * run_first, tmp: [num_tiles] scratch; suffix: [num_tiles + 1], the runs' keys first. */
FI_PD_STATIC void pk_sort(const fi_tile *tiles, int32_t num_tiles, int32_t *by_cost, int32_t *tmp,
                    int32_t *run_first, int64_t *suffix) {
    int64_t max = 0, min = INT64_MAX, total = 0;
    int32_t nr = 0;
    for (int32_t t = 0; t < num_tiles; t++) {
        const int64_t c = tiles[t].cost;
        total += c;
        if (t == 0 || c != tiles[t - 1].cost) { /* min and max change only at a run's start */
            run_first[nr++] = t;
            max = c > max ? c : max;
            min = c < min ? c : min;
        }
    }
    int bits = 0; /* of the largest key, max - min */
    while (bits < 63 && ((max - min) >> bits) > 0)
        bits++;
    const int passes = (bits + 7) / 8, digit = passes > 0 ? (bits + passes - 1) / passes : 0;
    const int64_t mask = ((int64_t)1 << digit) - 1;
    int64_t *key = suffix; /* [nr], free again once the runs are sorted */
    /* Sort run indices; the result must end in tmp, as by_cost is written from it. */
    int32_t *src = tmp, *dst = by_cost;
    for (int32_t r = 0; r < nr; r++) {
        src[r] = r;
        key[r] = max - tiles[run_first[r]].cost;
    }
    for (int p = 0, shift = 0; p < passes; p++, shift += digit) {
        int32_t count[257];
        fi_zero_bytes(count, sizeof(int32_t) * (size_t)(mask + 2));
        for (int32_t i = 0; i < nr; i++)
            count[(key[src[i]] >> shift & mask) + 1]++;
        for (int64_t d = 0; d < mask; d++)
            count[d + 1] += count[d];
        for (int32_t i = 0; i < nr; i++)
            dst[count[key[src[i]] >> shift & mask]++] = src[i];
        int32_t *x = src;
        src = dst;
        dst = x;
    }
    if (src != tmp)
        fi_copy_bytes(tmp, src, sizeof(int32_t) * (size_t)nr);
    int32_t n = 0;
    int64_t left = total; /* the cost of by_cost[n ..] */
    for (int32_t i = 0; i < nr; i++) {
        const int32_t r = tmp[i], end = r + 1 < nr ? run_first[r + 1] : num_tiles;
        const int64_t c = tiles[run_first[r]].cost;
        for (int32_t t = run_first[r]; t < end; t++) {
            by_cost[n] = t;
            suffix[n++] = left;
            left -= c;
        }
    }
    suffix[num_tiles] = 0;
}

/* Open CTAs by load, for best fit in O(1) amortised: PK_NB buckets of width T / PK_NB
 * (rounded up), each a singly linked list (bk_remove), with a bitmap of the non-empty ones.
 * The fit is best to within one bucket width (T / 512). */
#define PK_NB 512
typedef struct pk_buckets {
    int64_t width;
    int64_t top;                         /* PK_NB * width: loads from it on, the last bucket */
    uint64_t inv;                        /* ceil(2^40 / width), for bk_index; 0: divide */
    int32_t *head, *next, *where;        /* head [PK_NB]; next / where [num_ctas] */
    uint64_t used[PK_NB / 64];
} pk_buckets;

/* min(x / width, PK_NB - 1) for x >= 0, exactly, by a multiply and a shift instead of a
 * 64-bit division (3-5% of a heads-16 plan update, measured).  For x < PK_NB * width and
 * inv = ceil(2^40 / width), x * inv / 2^40 exceeds x / width by less than
 * x / 2^40 < width / 2^31, below the 1 / width that x / width lies under the next integer
 * while width^2 < 2^31: caps up to PK_NB * PK_EXACT_WIDTH (~23.7M cost units); wider
 * buckets divide. */
#define PK_EXACT_WIDTH 46340
FI_PD_STATIC inline int64_t bk_index(const pk_buckets *bk, int64_t x) {
    if (x >= bk->top)
        return PK_NB - 1;
    if (bk->inv == 0)
        return x / bk->width;
    return (int64_t)(((uint64_t)x * bk->inv) >> 40);
}

FI_PD_STATIC void bk_init(pk_buckets *bk, fi_pack_scratch *s, int64_t T) {
    bk->width = T / PK_NB + 1;
    bk->top = bk->width * PK_NB;
    bk->inv = bk->width <= PK_EXACT_WIDTH
                  ? ((((uint64_t)1 << 40) - 1) / (uint64_t)bk->width + 1)
                  : 0;
    bk->head = s->bk_head;
    bk->next = s->bk_next;
    bk->where = s->bk_where;
    for (int i = 0; i < PK_NB; i++)
        bk->head[i] = -1;
    fi_zero_bytes(bk->used, sizeof bk->used);
}
FI_PD_STATIC inline void bk_insert(pk_buckets *bk, const int64_t *load, int32_t b) {
    const int64_t q = bk_index(bk, load[b]);
    bk->where[b] = (int32_t)q;
    bk->next[b] = bk->head[q];
    bk->head[q] = b;
    bk->used[q >> 6] |= (uint64_t)1 << (q & 63);
}
/* The CTA taken out of its bucket is nearly always the bucket's head (the one best fit
 * found), so the list is singly linked and a removal past the head walks to it. */
FI_PD_STATIC inline void bk_remove(pk_buckets *bk, int32_t b) {
    const int32_t q = bk->where[b];
    if (bk->head[q] == b) {
        bk->head[q] = bk->next[b];
        if (bk->head[q] < 0)
            bk->used[q >> 6] &= ~((uint64_t)1 << (q & 63));
        return;
    }
    int32_t p = bk->head[q];
    while (bk->next[p] != b)
        p = bk->next[p];
    bk->next[p] = bk->next[b];
}
/* An open CTA with the largest load <= room (to within a bucket), or -1.  Deterministic:
 * in a bucket, the most recently inserted that fits. */
FI_PD_STATIC int32_t bk_fit(const pk_buckets *bk, const int64_t *load, int64_t room) {
    if (room < 0)
        return -1;
    const int64_t q = bk_index(bk, room);
    for (int32_t b = bk->head[q]; b >= 0; b = bk->next[b]) /* the top bucket: check each */
        if (load[b] <= room)
            return b;
    if (q == 0)
        return -1;
    /* the highest non-empty bucket below q: bits 0 .. (q - 1) & 63 of its word, then lower
     * words */
    int64_t w = (q - 1) >> 6;
    uint64_t bits = bk->used[w] & (~(uint64_t)0 >> (63 - ((q - 1) & 63)));
    while (bits == 0 && w > 0)
        bits = bk->used[--w];
    return bits ? bk->head[w * 64 + 63 - __builtin_clzll(bits)] : -1;
}

/* The open CTA with the least load (the lowest non-empty bucket's least), or -1. */
FI_PD_STATIC int32_t bk_min(const pk_buckets *bk, const int64_t *load) {
    for (int w = 0; w < PK_NB / 64; w++)
        if (bk->used[w]) {
            int32_t best = -1;
            for (int32_t b = bk->head[w * 64 + fi_ctz64(bk->used[w])]; b >= 0;
                 b = bk->next[b])
                if (best < 0 || load[b] < load[best]) /* ties: the first in the list */
                    best = b;
            return best;
        }
    return -1;
}

/* Queue of cut remainders, kept by decreasing charged cost (few: one per cut tile). */
FI_PD_STATIC void pk_queue(const pk_rules *r, const fi_pack_piece *pc, int32_t *q, int32_t *nq,
                     int32_t k) {
    const int64_t ck = pk_cost(r, &pc[k]);
    int32_t i = *nq;
    while (i > 0 && pk_cost(r, &pc[q[i - 1]]) < ck) {
        q[i] = q[i - 1];
        i--;
    }
    q[i] = k;
    (*nq)++;
}

/* One packing under cap T into s->pieces (bins set).  Returns the number of pieces, or -1
 * if it does not fit (CTAs, cuts <= num_ctas - 1, pieces <= max_items, or a piece below
 * the floor). */
FI_PD_STATIC int32_t pk_try(const pk_rules *r, const fi_tile *tiles, int32_t num_tiles,
                      const fi_layout *l, int64_t T, fi_pack_scratch *s) {
    const int32_t n = l->num_ctas, max_pieces = l->max_items;
    const fi_split_grain g = r->grain;
    const int64_t piece = r->piece;
    fi_pack_piece *pc = s->pieces;
    int64_t *load = s->load;
    int32_t *rq = s->order; /* remainder queue */
    int32_t np = 0, nb = 0, cuts = 0, nq = 0, qh = 0, w = 0;
    /* 1. Tiles above T (a prefix of by_cost): full pieces, remainders queued. */
    for (; w < num_tiles; w++) {
        const fi_tile *tl = &tiles[s->by_cost[w]];
        if (tl->cost <= T)
            break;
        const int64_t oh = tl->cost - (tl->kv_end - tl->kv_begin);
        int64_t pos = tl->kv_begin;
        /* Every piece is charged the piece charge: which one of a group ends last (and
         * merges) depends on the rest of the packing.  (Charging full pieces cost_merge and
         * remainders cost_arrive modelled worse on the trace snapshot: remainders that
         * run second in their CTA end last.) */
        while (tl->kv_end - pos + oh + piece > T) {
            int64_t end = fi_grain_round_down(g, pos + T - oh - piece);
            if (tl->kv_end - end < g.floor)
                end = fi_grain_round_down(g, tl->kv_end - g.floor);
            if (end - pos < g.floor || nb == n || np == max_pieces ||
                cuts == n - 1)
                return -1;
            pc[np] = (fi_pack_piece){s->by_cost[w], (int32_t)pos, (int32_t)end, nb, 1, 0,
                                     end - pos + oh};
            load[nb++] = pk_cost(r, &pc[np]);
            np++;
            cuts++;
            pos = end;
        }
        if (np == max_pieces)
            return -1;
        pc[np] = (fi_pack_piece){s->by_cost[w], (int32_t)pos, tl->kv_end, -1, 1, 0,
                                 tl->kv_end - pos + oh};
        pk_queue(r, pc, rq, &nq, np++);
    }
    /* 2. The rest, largest first: the remainder queue merged with whole tiles w.. . */
    pk_buckets bk;
    bk_init(&bk, s, T);
    int64_t room = (int64_t)n * T, qcost = 0;
    for (int32_t b = 0; b < nb; b++)
        room -= load[b];
    for (int32_t i = 0; i < nq; i++)
        qcost += pk_cost(r, &pc[rq[i]]);
    for (int32_t b = 0; b < nb; b++)
        bk_insert(&bk, load, b);
    /* The queue head's charged cost (a remainder: a split piece), -1 if the queue is empty;
     * whole tile w costs suffix[w] - suffix[w + 1] (no lookup through by_cost). */
    const int64_t *suffix = s->suffix;
    int64_t qtop = nq > 0 ? pc[rq[0]].cost + piece : -1;
    for (;;) {
        int32_t k;
        int64_t c;
        const int take_whole = w < num_tiles && suffix[w] - suffix[w + 1] > qtop;
        if (take_whole) {
            if (np == max_pieces)
                return -1;
            const int32_t t = s->by_cost[w];
            const fi_tile *tl = &tiles[t];
            pc[np] = (fi_pack_piece){t, tl->kv_begin, tl->kv_end, -1, 0, 0, tl->cost};
            c = tl->cost;
            k = np++;
            w++;
        } else if (qh < nq) {
            c = qtop;
            k = rq[qh++];
            qtop = qh < nq ? pc[rq[qh]].cost + piece : -1;
        } else {
            break;
        }
        fi_pack_piece *x = &pc[k];
        /* Fail fast: what is left (this item, the whole tiles after it, the queue) cannot
         * fit in the room of all CTAs (cuts only add charges). */
        if ((take_whole ? c + qcost : qcost) + suffix[w] > room)
            return -1;
        if (!take_whole)
            qcost -= c;
        room -= c;
        int32_t best = -1;
        if (2 * c <= T) /* best fit; larger items cannot share any open CTA */
            best = bk_fit(&bk, load, T - c);
        if (best < 0 && nb < n) {
            best = nb++;
            load[best] = 0;
        } else if (best >= 0) {
            bk_remove(&bk, best);
        }
        if (best >= 0) {
            x->bin = best;
            load[best] += c;
            /* Whole tiles of the same cost next in line (a GQA decode request's KV heads)
             * go to this CTA while it holds them, as best fit would place them one by one:
             * it was the fullest CTA that held one (to within its bucket) and has only grown,
             * so bk_fit would find it again; the fail-fast test above cannot change along
             * the run (room and suffix[w] both drop by c a tile); and the buckets end as
             * after one move a tile.  GQA decode at 32 requests: 42 of the 256 tiles skip
             * the search and the bucket moves (docs/perf-log.md). */
            if (take_whole)
                while (load[best] + c <= T && w < num_tiles &&
                       suffix[w] - suffix[w + 1] == c && np < max_pieces) {
                    const int32_t t = s->by_cost[w++];
                    const fi_tile *tl = &tiles[t];
                    pc[np++] = (fi_pack_piece){t, tl->kv_begin, tl->kv_end, best, 0, 0, c};
                    load[best] += c;
                    room -= c;
                }
            bk_insert(&bk, load, best);
            continue;
        }
        /* Cut: the CTA with the most room takes the longest legal first piece. */
        const int32_t most = bk_min(&bk, load);
        if (most < 0)
            return -1;
        const fi_tile *tl = &tiles[x->tile];
        const int64_t oh = tl->cost - (tl->kv_end - tl->kv_begin);
        const int64_t end = fi_grain_round_down(g, x->kv0 + (T - load[most]) - oh - piece);
        if (end - x->kv0 < g.floor || x->kv1 - end < g.floor ||
            np == max_pieces || cuts == n - 1)
            return -1;
        pc[np] = (fi_pack_piece){x->tile, (int32_t)end, x->kv1, -1, 1, 0, x->kv1 - end + oh};
        x->kv1 = (int32_t)end;
        x->split = 1;
        x->cost = end - x->kv0 + oh;
        x->bin = most;
        bk_remove(&bk, most);
        load[most] += pk_cost(r, x);
        bk_insert(&bk, load, most);
        room += c - pk_cost(r, x); /* c was taken above; the first piece costs pk_cost(r, x) */
        qcost += pk_cost(r, &pc[np]);
        cuts++;
        /* the rest joins the remainder queue (drop the consumed head first) */
        fi_move_down_i32(rq, rq + qh, nq - qh);
        nq -= qh;
        qh = 0;
        pk_queue(r, pc, rq, &nq, np++);
        qtop = pc[rq[0]].cost + piece;
    }
    return np;
}

/* The last probe of a bisection of (bad, good] down to tol in which every probe packs. */
FI_PD_STATIC int64_t all_fit_probe(int64_t bad, int64_t good, int64_t tol) {
    int64_t mid = good;
    while (good - bad > tol) {
        mid = bad + (good - bad) / 2;
        good = mid;
    }
    return mid;
}

/* Bisect (bad, good] down to tol: bad does not pack, good does (its *np pieces in
 * s->pieces).  Returns the smallest cap found that packs, its packing in s->pieces and its
 * piece count in *np.  Before bisecting (and after each failure) the last probe of the
 * all-fit path is tried: if it packs, the bisection would end there were packing monotone
 * in the cap, so it ends there (MLA heads 16 at 128 requests: one packing fewer).  Best
 * fit is not always monotone (a scan of every cap of the 442 plan_compare.sh batches found
 * 15 caps that fail above one that packs, on small and random-length batches), but the
 * plans of those batches are the same.  A failed all-fit probe is remembered and the
 * bisection goes on.  The best packing so far is kept in s->sorted while another is
 * tried, so no packing is redone.  Outlined on the device (its registers: no spills). */
FI_PD_STATIC FI_PD_OUTLINE int64_t pk_bisect(const pk_rules *r, const fi_tile *tiles, int32_t num_tiles,
                               const fi_layout *l, fi_pack_scratch *s, int64_t bad,
                               int64_t good, int64_t tol, int32_t *np) {
    int in_pieces = 1;   /* s->pieces (else s->sorted) holds good's packing */
    int64_t failed = -1; /* an all-fit probe that did not pack */
    for (int check = 1; good - bad > tol;) {
        const int64_t mid = check ? all_fit_probe(bad, good, tol) : bad + (good - bad) / 2;
        int32_t k = -1;
        if (mid != failed) {
            if (in_pieces)
                fi_copy_bytes(s->sorted, s->pieces, sizeof(fi_pack_piece) * (size_t)*np);
            k = pk_try(r, tiles, num_tiles, l, mid, s);
            in_pieces = k >= 0;
        }
        if (k >= 0) {
            good = mid;
            *np = k;
            if (check)
                break; /* every probe of the bisection would pack: mid is where it ends */
        } else if (check) {
            failed = mid;
            check = 0;
        } else {
            bad = mid;
            check = 1;
        }
    }
    if (!in_pieces)
        fi_copy_bytes(s->pieces, s->sorted, sizeof(fi_pack_piece) * (size_t)*np);
    return good;
}

/* Order of pieces: by CTA; inside a CTA split pieces first (their merges then happen before
 * the CTA's end), longer first, then by tile and KV position (deterministic). */
FI_PD_STATIC int pk_before(const fi_pack_piece *a, const fi_pack_piece *b) {
    if (a->bin != b->bin)
        return a->bin < b->bin;
    if (a->split != b->split)
        return a->split > b->split;
    const int32_t la = a->kv1 - a->kv0, lb = b->kv1 - b->kv0;
    if (la != lb)
        return la > lb;
    if (a->tile != b->tile)
        return a->tile < b->tile;
    return a->kv0 < b->kv0;
}

/* The merge groups of a laid-out packing with split pieces (pk_layout: s->sorted in item
 * order): one per cut tile, in tile order (s->groups, s->tile_group: tile -> group), its
 * slots its pieces in KV order (s->order from first_slot on: item indices; insertion sort,
 * as a group has a few pieces, or one long request's up to num_ctas).  Returns the number
 * of groups. */
FI_PD_STATIC int32_t pk_groups(const fi_tile *tiles, int32_t num_tiles, fi_pack_scratch *s,
                               int32_t np) {
    const fi_pack_piece *it = s->sorted;
    fi_merge_group *groups = s->groups;
    int32_t *gid = s->tile_group, *lst = s->order, *fill = s->cta_start;
    for (int32_t t = 0; t < num_tiles; t++)
        gid[t] = -1;
    for (int32_t i = 0; i < np; i++)
        if (it[i].split)
            gid[it[i].tile] = -2;
    int32_t ng = 0;
    for (int32_t t = 0; t < num_tiles; t++) {
        if (gid[t] != -2)
            continue;
        const fi_tile *tl = &tiles[t];
        groups[ng] = (fi_merge_group){tl->request, tl->head_begin, tl->head_end, tl->q_begin,
                                      tl->q_end, 0, 0, -1, 0};
        gid[t] = ng++;
    }
    for (int32_t i = 0; i < np; i++)
        if (it[i].split)
            groups[gid[it[i].tile]].num_splits++;
    for (int32_t g = 0, ns = 0; g < ng; g++) {
        groups[g].first_slot = ns;
        ns += groups[g].num_splits;
        fill[g] = 0;
    }
    for (int32_t i = 0; i < np; i++)
        if (it[i].split) {
            const int32_t g = gid[it[i].tile];
            lst[groups[g].first_slot + fill[g]++] = i;
        }
    for (int32_t g = 0; g < ng; g++) {
        int32_t *L = lst + groups[g].first_slot;
        for (int32_t a = 1; a < groups[g].num_splits; a++) {
            const int32_t v = L[a];
            int32_t j = a;
            while (j > 0 && it[L[j - 1]].kv0 > it[v].kv0) {
                L[j] = L[j - 1];
                j--;
            }
            L[j] = v;
        }
        groups[g].first_item = L[0];
    }
    return ng;
}

/* Lay out the packing in s->pieces[0 .. np) as a plan, all but its items: s->sorted (the
 * pieces in item order), s->work_indptr, s->cta_cost, s->finish (each item's end in the
 * model; only with split pieces), s->groups (split tiles in tile order), s->order (each group's pieces from its
 * first_slot on, as item indices, in KV order) and *res.  The items are written only for
 * the packing that is kept (pk_items).  Returns 0 if it does not fit the layout's group /
 * slot bounds (nothing laid out), 1 on success. */
FI_PD_STATIC int pk_layout(const fi_tile *tiles, int32_t num_tiles, const fi_layout *l,
                           fi_pack_scratch *s, int32_t np, int64_t T, fi_partition_result *res) {
    const int32_t n = l->num_ctas;
    const fi_pack_piece *pc = s->pieces;
    fi_pack_piece *it = s->sorted;
    int32_t *start = s->cta_start; /* [n + 1] */
    int64_t *cost = s->cta_cost;
    int32_t ns = 0;
    fi_zero_bytes(start, sizeof(int32_t) * (size_t)(n + 1));
    fi_zero_bytes(cost, sizeof(int64_t) * (size_t)n);
    for (int32_t i = 0; i < np; i++) {
        start[pc[i].bin + 1]++;
        cost[pc[i].bin] += pc[i].cost;
        ns += pc[i].split;
    }
    /* Split pieces are also held to max_groups, a stricter bound than groups (a group has
     * two or more pieces): the rule the plans have always had (with groups instead, packing
     * wins 12 more of scripts/plan_compare.sh's batches; docs/perf-log.md). */
    if (ns > l->max_groups || ns > l->max_slots || np > l->max_items)
        return 0;
    /* Bucket the pieces by CTA (counting sort), each inserted in order among its CTA's
     * few pieces so far: one pass over the pieces (pk_before orders any two pieces, so
     * the order does not depend on the order they come in). */
    for (int32_t b = 0; b < n; b++)
        start[b + 1] += start[b];
    fi_copy_bytes(s->work_indptr, start, sizeof(int32_t) * (size_t)(n + 1));
    for (int32_t i = 0; i < np; i++) {
        const int32_t b = pc[i].bin, first = s->work_indptr[b];
        int32_t j = start[b]++;
        while (j > first && pk_before(&pc[i], &it[j - 1])) {
            it[j] = it[j - 1];
            j--;
        }
        it[j] = pc[i];
    }
    int64_t total = 0, mx = 0;
    for (int32_t b = 0; b < n; b++) {
        total += cost[b];
        mx = cost[b] > mx ? cost[b] : mx;
    }
    /* Each item's end (a running sum per CTA): only the model of merge groups reads it. */
    if (ns > 0)
        for (int32_t b = 0; b < n; b++) {
            int64_t t = 0;
            for (int32_t i = s->work_indptr[b]; i < s->work_indptr[b + 1]; i++) {
                t += it[i].cost;
                s->finish[i] = t;
            }
        }
    const int32_t ng = ns > 0 ? pk_groups(tiles, num_tiles, s, np) : 0;
    *res = (fi_partition_result){np, ng, ns, T, total, mx};
    return 1;
}

/* The items of the packing pk_layout laid out (s->sorted, s->groups, s->order), into
 * items[0 .. np): the kept packing's straight into the plan. */
FI_PD_STATIC void pk_items(const fi_tile *tiles, const fi_pack_scratch *s, int32_t np,
                           int32_t ng, fi_work_item *items) {
    const fi_pack_piece *it = s->sorted;
    for (int32_t i = 0; i < np; i++) {
        const fi_pack_piece *x = &it[i];
        fi_copy_bytes(&items[i], &tiles[x->tile], FI_TILE_ITEM_HEAD_BYTES); /* scratch.h */
        items[i].kv_begin = x->kv0;
        items[i].kv_end = x->kv1;
        items[i].out_slot = -1;
        items[i].merge_group = x->split ? s->tile_group[x->tile] : -1;
    }
    for (int32_t g = 0; g < ng; g++) {
        const fi_merge_group *gr = &s->groups[g];
        for (int32_t r = 0; r < gr->num_splits; r++)
            items[s->order[gr->first_slot + r]].out_slot = gr->first_slot + r;
    }
}

/* The executor model (planner/model.h: fi_model_max's figure) of the plan pk_layout laid
 * out, from what it left: s->sorted (the pieces in item order), s->finish (each item's end)
 * and s->order (each group's pieces from groups[g].first_slot on, as item indices).  The piece
 * of a group that ends last (ties: the lower item index) pays the merge, the others an
 * arrival.  O(split pieces + CTAs), not a second pass over the items.  extra: s->load,
 * free once the packing is chosen. */
FI_PD_STATIC int64_t pk_model(const fi_variant *v, fi_pack_scratch *s, int32_t n,
                              const fi_merge_group *groups, int32_t ng,
                              const int64_t *cta_cost) {
    const int64_t merge = v->cost_merge, arrive = v->cost_arrive;
    int64_t *extra = s->load;
    for (int32_t b = 0; b < n; b++)
        extra[b] = 0;
    for (int32_t g = 0; g < ng; g++) {
        const int32_t *L = s->order + groups[g].first_slot;
        int32_t last = L[0];
        for (int32_t r = 1; r < groups[g].num_splits; r++)
            if (s->finish[L[r]] > s->finish[last] ||
                (s->finish[L[r]] == s->finish[last] && L[r] < last))
                last = L[r];
        for (int32_t r = 0; r < groups[g].num_splits; r++)
            extra[s->sorted[L[r]].bin] += L[r] == last ? merge : arrive;
    }
    int64_t max = 0;
    for (int32_t b = 0; b < n; b++)
        max = cta_cost[b] + extra[b] > max ? cta_cost[b] + extra[b] : max;
    return max;
}

FI_PD int fi_pack_wanted(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                         int64_t oh_max, const fi_layout *l) {
    const int64_t n = l->num_ctas;
    const int64_t thin_max = v->pack_thin_tiles_per_cta, other_max = v->pack_max_tiles_per_cta;
    if (num_tiles == 0 || num_tiles > n * (thin_max > other_max ? thin_max : other_max))
        return 0;
    /* Thin (every tile <= 16 rows) iff the largest overhead alpha * rows + beta is at most
     * 16 alpha + beta, where that grows with the rows (alpha > 0; beta >= 0, so every
     * overhead is >= 0, oh_max's floor); else the rows are counted tile by tile. */
    if (v->cost_alpha > 0 && v->cost_beta >= 0)
        return num_tiles <=
               n * (oh_max <= fi_variant_item_cost(v, 0, 16) ? thin_max : other_max);
    int thin = 1;
    for (int32_t t = 0; t < num_tiles && thin; t++)
        thin = (int64_t)(tiles[t].q_end - tiles[t].q_begin) *
                   (tiles[t].head_end - tiles[t].head_begin) <= 16;
    return num_tiles <= n * (thin ? thin_max : other_max);
}

FI_PD int64_t fi_partition_pack(const fi_variant *v, const fi_tile *tiles, int32_t num_tiles,
                       int64_t total_cost, const fi_layout *l, fi_pack_scratch *s,
                       int64_t cap_lo, int64_t beat, int32_t *work_indptr, fi_work_item *items,
                       fi_merge_group *groups, int64_t *cta_cost, fi_partition_result *res) {
    const int32_t n = l->num_ctas;
    const pk_rules rules = {fi_split_grain_of(v), fi_variant_piece_charge(v)};
    pk_sort(tiles, num_tiles, s->by_cost, s->order, s->tile_group, s->suffix);
    /* Smallest packing cap, to within cap_lo / 64: gallop up from cap_lo + cap_lo / 32 in
     * steps of cap_lo / 32, doubling, then bisect (pk_bisect; trace decode batches: 2-3
     * packings). */
    const int64_t lo = cap_lo > (total_cost + n - 1) / n ? cap_lo : (total_cost + n - 1) / n;
    const int64_t tol = lo / 64 + 1, step0 = lo / 32 + 1;
    int64_t good = -1, bad = lo - 1;
    int32_t np = -1;
    /* Where the search ends if its first probe and every probe of its bisection pack: tried
     * first when no tile is above it (nothing to cut: GQA decode at 32 requests packs its
     * whole tiles there, one packing instead of two).  Were packing monotone in the cap, the
     * search would end there too; the plans of plan_compare.sh's batches are the same. */
    const int64_t guess = all_fit_probe(bad, lo + step0, tol);
    if (lo + step0 < beat && tiles[s->by_cost[0]].cost <= guess) {
        np = pk_try(&rules, tiles, num_tiles, l, guess, s);
        good = np >= 0 ? guess : -1;
    }
    for (int64_t step = step0, T = lo + step; good < 0 && T < beat + step;
         step *= 2, T = bad + step) {
        const int64_t t = T < beat ? T : beat - 1;
        const int32_t k = pk_try(&rules, tiles, num_tiles, l, t, s);
        if (k >= 0) {
            np = k;
            good = pk_bisect(&rules, tiles, num_tiles, l, s, bad, t, tol, &np);
            break;
        }
        bad = t;
        if (t == beat - 1)
            break;
    }
    if (good < 0)
        return beat;
    /* Laid out in scratch first, scored by the same model as the walk, and its items
     * written into the plan only if it is cheaper (GQA decode at 32 requests: 256 items). */
    fi_partition_result r;
    if (!pk_layout(tiles, num_tiles, l, s, np, good, &r))
        return beat;
    const int64_t m = r.num_groups > 0 ? pk_model(v, s, n, s->groups, r.num_groups, s->cta_cost)
                                       : r.max_cta_cost; /* no merge or arrival charges */
#ifndef FI_PLANNER_DEVICE_TU
    if (fi_partition_test_check_model) { /* s->items and s->last are free */
        pk_items(tiles, s, r.num_items, r.num_groups, s->items);
        fi_partition_test_model_mismatches +=
            m != fi_model_max(v, s->work_indptr, n, s->items, r.num_groups, s->finish, s->last);
    }
#endif
    if (m >= beat)
        return beat;
    pk_items(tiles, s, r.num_items, r.num_groups, items);
    fi_copy_bytes(work_indptr, s->work_indptr, sizeof(int32_t) * ((size_t)n + 1));
    fi_copy_bytes(groups, s->groups, sizeof(fi_merge_group) * (size_t)r.num_groups);
    fi_copy_bytes(cta_cost, s->cta_cost, sizeof(int64_t) * (size_t)n);
    *res = r;
    return m;
}
