/*
 * viz/dot.c - the plan as a graph (cgraph), written as DOT or rendered to SVG (gvc).
 *
 * Picture: one cluster "cluster_cta<c>" per CTA holding its work items top to bottom in
 * execution order (dotted edges); an item's label gives request, query heads, query rows
 * and KV range as half-open intervals; the items of a split tile share a colour and have edges into one diamond
 * merge node per merge group.  Large plans stay readable: idle CTAs are only counted, at
 * most FIPLAN_DOT_MAX_CTAS busy CTAs and FIPLAN_DOT_MAX_ITEMS items are drawn, and one note
 * node gives the counts of what was left out.  Drawn CTAs wrap into rows of
 * FIPLAN_DOT_ROW_CTAS (invisible edges), so a 132-CTA plan fits a screen's width.
 *
 * SVG rendering registers the dot layout and core (svg) plugins in-process through
 * gvContextPlugins with an lt_symlist_t table (what libtool's lt_preloaded_symbols does for
 * the dot binary), so it works without the system plugin config file.  The plugin symbols
 * are weak: if the Makefile did not link the plugin libraries, fiplan falls back to
 * demand loading (gvContext) and still works where graphviz is configured.
 */
#include <stdio.h>
#include <string.h>

#include <graphviz/cgraph.h>
#include <graphviz/gvc.h>
#include <graphviz/gvplugin.h>

#include "plan/variant.h"
#include "viz/fiplan.h"

extern gvplugin_library_t gvplugin_dot_layout_LTX_library __attribute__((weak));
extern gvplugin_library_t gvplugin_core_LTX_library __attribute__((weak));

#if defined(__SANITIZE_ADDRESS__)
/* Sanitizer builds: graphviz 2.43 keeps blocks from its layout and render passes (gmalloc in
 * libgvc) that gvFreeLayout / gvFreeContext do not release.  They are not ours to fix, so
 * LeakSanitizer is told to skip stacks that go through graphviz; our own leaks still show. */
const char *__lsan_default_suppressions(void);
const char *__lsan_default_suppressions(void) {
    return "leak:libgvc.so\nleak:libgvplugin_dot_layout.so\nleak:libgvplugin_core.so\n"
           "leak:libcgraph.so\n";
}
#endif

/* Fill colours for merge groups (cycled); unsplit items are white. */
static const char *const k_palette[] = {
    "#8dd3c7", "#ffffb3", "#bebada", "#fb8072", "#80b1d3", "#fdb462",
    "#b3de69", "#fccde5", "#d9d9d9", "#bc80bd", "#ccebc5", "#ffed6f",
};
#define PALETTE_N ((int)(sizeof k_palette / sizeof k_palette[0]))

static void set(void *obj, const char *name, const char *value) {
    agsafeset(obj, (char *)name, (char *)value, (char *)"");
}

/* Build the graph of the current plan.  NULL on failure. */
static Agraph_t *build_graph(const fi_plan *plan, const fiplan_stats *st) {
    fi_plan_view v;
    if (fi_plan_get_view(plan, &v) != FI_OK) return NULL;
    const fi_caps *caps = fi_plan_caps(plan);
    Agraph_t *g = agopen((char *)"fiplan", Agdirected, NULL);
    if (!g) return NULL;
    char buf[512], name[64];

    const fi_variant *row = fi_variant_of(caps);
    snprintf(buf, sizeof buf,
             "fiattn plan: %s (%s, %s), %d requests, %d work items on %d CTAs, %d merge "
             "groups, balance %.3f (max/mean CTA cost)",
             fiplan_kind_name(caps->kind), row ? row->name : "no row",
             fiplan_dtype_name(caps->kv_dtype), st->batch_size, st->num_items, st->num_ctas,
             st->num_groups, st->balance);
    set(g, "label", buf);
    set(g, "labelloc", "t");
    set(g, "fontname", "Helvetica");
    set(g, "rankdir", "TB");
    set(g, "nodesep", "0.15");
    set(g, "ranksep", "0.3");
    agattr(g, AGNODE, (char *)"shape", (char *)"box");
    agattr(g, AGNODE, (char *)"style", (char *)"filled");
    agattr(g, AGNODE, (char *)"fillcolor", (char *)"white");
    agattr(g, AGNODE, (char *)"fontname", (char *)"Helvetica");
    agattr(g, AGNODE, (char *)"fontsize", (char *)"10");

    /* Merge nodes are created lazily, when a drawn item of their group appears. */
    Agnode_t *merge_cache[256];
    int32_t merge_cached = v.header->num_groups < 256 ? v.header->num_groups : 256;
    for (int32_t i = 0; i < merge_cached; i++) merge_cache[i] = NULL;

    Agnode_t *row_last[FIPLAN_DOT_MAX_CTAS] = {NULL}; /* last item of each drawn CTA */
    int32_t drawn_ctas = 0, drawn_items = 0, idle_ctas = 0, skipped_ctas = 0, skipped_items = 0;
    for (int32_t c = 0; c < v.num_ctas; c++) {
        int32_t b = v.work_indptr[c], e = v.work_indptr[c + 1];
        if (b == e) { /* idle CTAs are counted, not drawn */
            idle_ctas++;
            continue;
        }
        if (drawn_ctas >= FIPLAN_DOT_MAX_CTAS || drawn_items + (e - b) > FIPLAN_DOT_MAX_ITEMS) {
            skipped_ctas++;
            skipped_items += e - b;
            continue;
        }
        drawn_ctas++;
        snprintf(name, sizeof name, "cluster_cta%d", c);
        Agraph_t *sub = agsubg(g, name, 1);
        snprintf(buf, sizeof buf, "CTA %d", c);
        set(sub, "label", buf);
        set(sub, "style", "rounded");
        set(sub, "color", "gray50");
        Agnode_t *prev = NULL;
        const int32_t d = drawn_ctas - 1; /* this CTA's place among the drawn ones */
        for (int32_t i = b; i < e; i++, drawn_items++) {
            const fi_work_item *it = &v.items[i];
            snprintf(name, sizeof name, "item%d", i);
            Agnode_t *n = agnode(sub, name, 1);
            snprintf(buf, sizeof buf, "r%d  h[%d,%d)\\nq[%d,%d)  kv[%d,%d)", it->request,
                     it->head_begin, it->head_end, it->q_begin, it->q_end, it->kv_begin,
                     it->kv_end);
            set(n, "label", buf);
            if (it->merge_group >= 0) {
                set(n, "fillcolor", k_palette[it->merge_group % PALETTE_N]);
                Agnode_t *m = it->merge_group < merge_cached ? merge_cache[it->merge_group] : NULL;
                if (!m) {
                    const fi_merge_group *gr = &v.groups[it->merge_group];
                    snprintf(name, sizeof name, "merge%d", it->merge_group);
                    m = agnode(g, name, 1);
                    snprintf(buf, sizeof buf, "merge g%d\\nr%d h[%d,%d) q[%d,%d)\\n%d splits",
                             it->merge_group, gr->request, gr->head_begin, gr->head_end,
                             gr->q_begin, gr->q_end, gr->num_splits);
                    set(m, "label", buf);
                    set(m, "shape", "diamond");
                    set(m, "fillcolor", k_palette[it->merge_group % PALETTE_N]);
                    if (it->merge_group < merge_cached) merge_cache[it->merge_group] = m;
                }
                snprintf(name, sizeof name, "s%d", i);
                Agedge_t *ed = agedge(g, n, m, name, 1);
                snprintf(buf, sizeof buf, "slot %d", it->out_slot);
                set(ed, "xlabel", buf);
                set(ed, "fontsize", "8");
            }
            if (i == b && d >= FIPLAN_DOT_ROW_CTAS && row_last[d - FIPLAN_DOT_ROW_CTAS]) {
                /* Wrap: an invisible edge puts this CTA under the one a row before, so the
                 * picture is FIPLAN_DOT_ROW_CTAS CTAs wide, not one long strip. */
                snprintf(name, sizeof name, "w%d", i);
                Agedge_t *ed = agedge(g, row_last[d - FIPLAN_DOT_ROW_CTAS], n, name, 1);
                set(ed, "style", "invis");
            }
            if (prev) {
                snprintf(name, sizeof name, "o%d", i);
                Agedge_t *ed = agedge(g, prev, n, name, 1);
                set(ed, "style", "dotted");
                set(ed, "arrowhead", "none");
            }
            prev = n;
        }
        row_last[d] = prev;
    }
    if (skipped_ctas > 0 || idle_ctas > 0) {
        Agnode_t *n = agnode(g, (char *)"not_drawn", 1);
        snprintf(buf, sizeof buf, "%d busy CTAs (%d items) not drawn (see --json)\\n%d idle CTAs",
                 skipped_ctas, skipped_items, idle_ctas);
        set(n, "label", buf);
        set(n, "shape", "note");
        set(n, "fillcolor", "gray90");
    }
    return g;
}

int fiplan_write_dot(const fi_plan *plan, const fiplan_stats *st, FILE *f) {
    Agraph_t *g = build_graph(plan, st);
    if (!g) return -1;
    int rc = agwrite(g, f) == 0 ? 0 : -1;
    agclose(g);
    if (fflush(f) != 0) rc = -1;
    return rc;
}

int fiplan_write_svg(const fi_plan *plan, const fiplan_stats *st, const char *svg_path) {
    lt_symlist_t builtins[3];
    int k = 0;
    if (&gvplugin_dot_layout_LTX_library && &gvplugin_core_LTX_library) {
        builtins[k++] = (lt_symlist_t){"gvplugin_dot_layout_LTX_library",
                                       (void *)&gvplugin_dot_layout_LTX_library};
        builtins[k++] = (lt_symlist_t){"gvplugin_core_LTX_library",
                                       (void *)&gvplugin_core_LTX_library};
    }
    builtins[k] = (lt_symlist_t){NULL, NULL};
    /* Linked plugins: no demand loading (no config file needed); else the system's. */
    GVC_t *gvc = k ? gvContextPlugins(builtins, 0) : gvContext();
    if (!gvc) {
        fprintf(stderr, "fiplan: graphviz context failed\n");
        return -1;
    }
    Agraph_t *g = build_graph(plan, st);
    int rc = -1;
    if (g && gvLayout(gvc, g, "dot") == 0) {
        rc = gvRenderFilename(gvc, g, "svg", svg_path) == 0 ? 0 : -1;
        gvFreeLayout(gvc, g);
    }
    if (rc != 0) fprintf(stderr, "fiplan: rendering %s with graphviz failed\n", svg_path);
    if (g) agclose(g);
    gvFreeContext(gvc);
    return rc;
}
