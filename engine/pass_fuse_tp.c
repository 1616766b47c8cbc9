/* fuse_tp — micro-pipeline tensor parallelism.
 *
 *  all_gather(x, g) [-> view] -> matmul(., w_i) for i = 1..n
 *      => fused_all_gather_matmul(x, w_1..w_n): the products concatenated
 *         along the last dim; each old matmul becomes a slice of it (or is
 *         replaced outright when n = 1). Gathers once for Q, K and V.
 *  matmul(a, w) [-> view] -> reduce_scatter(., s)
 *      => fused_matmul_reduce_scatter(a, w)
 *
 * Both also match through a reassembly: slices of the collective's value
 * (gathered input / product) on one dim, concatenated on another by a cat,
 * when the slices cover that dim exactly once — a pure permutation of rows
 * that the fused kernel performs while computing (tp_attrs pieces,
 * reassembly.h); only those slices and that cat are removed.
 *
 * Gathering the contracted dim K makes the product a sum over ranks of
 * x_r times w's matching rows; that fuses too, one matmul per node.
 *
 * A reassembly can also be a collective along another dim in disguise —
 * how functional collectives lower gather_dim / scatter_dim != 0: the d
 * rank chunks of all_gather(x, a) along a, in rank order, cat along b are
 * all_gather(x, b); the product's d chunks along a cat along b before
 * reduce_scatter(b) are reduce_scatter(product, a). fuse_tp rewrites them
 * into that direct form first (when it will then fuse: every reader of the
 * cat fuses, no slice or cat has another reader) and fuses that; cat on K
 * thus becomes the rank-ordered sum, slices of N a column-block scatter.
 *
 * Safety checks, each a reason to leave the pattern alone:
 *  - weights must be 2-D, of one dtype and transpose_b, defined before the
 *    first matmul (so the fused node can take its place);
 *  - a view between gather and matmul must keep the last dim (K) intact;
 *  - the matmul feeding a reduce_scatter (and the view after it) must have
 *    no other reader, because the fused kernel never materializes it;
 *  - the scatter dim must be a dim the fused kernel can chunk: a leading dim
 *    of the product (rows of a), or its last dim (columns of w).
 * The all_gather itself stays if anything else reads the gathered tensor. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "passes.h"
#include "reassembly.h"

static int is_op(const tp_graph *g, int i, tp_op op) { return g->nodes[i].op == op; }

/* Can matmul m take part in fusing gather `ag` (reached through `a`)? */
static int fusable_matmul(const tp_graph *g, int m, int a, int first_w_limit)
{
    const tp_node *n = &g->nodes[m];
    if (n->op != TP_OP_MATMUL || n->inputs[0] != a || n->inputs[1] == a || n->fallback)
        return 0;
    const tp_node *w = &g->nodes[n->inputs[1]];
    return w->ndim == 2 && n->inputs[1] < first_w_limit;
}

/* The matmul input reached from ag: ag itself, or a view of it that keeps
 * the last dim. Returns -1 when the view would break the fused layout. */
static int operand_of(const tp_graph *g, int ag, int user)
{
    const tp_node *u = &g->nodes[user], *x = &g->nodes[ag];
    if (u->op == TP_OP_MATMUL)
        return ag;
    if ((u->op == TP_OP_VIEW || u->op == TP_OP_RESHAPE) && u->storage == x->storage &&
        u->ndim >= 2 && u->shape[u->ndim - 1] == x->shape[x->ndim - 1])
        return user;
    return -1;
}

/* The slices of `src` that are cat's inputs, all on one dim, each read
 * only by cat, with nothing else reading src: their (start, length) in cat
 * order into a's piece attrs. */
static int read_pieces(const tp_graph *g, int src, int cat, tp_attrs *a)
{
    const tp_node *c = &g->nodes[cat];
    if (c->op != TP_OP_CAT || c->n_inputs > TP_MAX_DIMS || c->fallback || tp_graph_n_users(g, src) != c->n_inputs)
        return 0;
    for (int j = 0; j < c->n_inputs; j++) {
        const tp_node *sl = &g->nodes[c->inputs[j]];
        if (sl->op != TP_OP_SLICE || sl->inputs[0] != src || tp_graph_sole_user(g, c->inputs[j]) != cat ||
            (j > 0 && sl->attrs.dim != a->piece_dim))
            return 0;
        a->piece_dim = sl->attrs.dim;
        a->piece_start[j] = sl->attrs.start;
        a->piece_len[j] = sl->attrs.length;
    }
    a->n_pieces = c->n_inputs;
    a->cat_dim = c->attrs.dim;
    return 1;
}

/* Pieces covering src's piece dim exactly once, neither it nor the cat
 * dim the last: a pure permutation of src's rows. */
static int match_reassembly(const tp_graph *g, int src, int cat, tp_attrs *a)
{
    const tp_node *sn = &g->nodes[src];
    if (!read_pieces(g, src, cat, a))
        return 0;
    int64_t covered = 0;
    for (int j = 0; j < a->n_pieces; j++) {
        covered += a->piece_len[j];
        for (int k = 0; k < j; k++)
            if (a->piece_start[k] < a->piece_start[j] + a->piece_len[j] &&
                a->piece_start[j] < a->piece_start[k] + a->piece_len[k])
                return 0; /* overlapping pieces duplicate rows */
    }
    return covered == sn->shape[a->piece_dim] && a->piece_dim != sn->ndim - 1 && a->cat_dim != sn->ndim - 1;
}

/* Removes the nodes of `list` that nothing reads, highest index first so
 * the indices still to remove stay valid (list is reordered). */
static void remove_unread(tp_graph *g, int *list, int n)
{
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (list[j] > list[i]) {
                int t = list[i];
                list[i] = list[j];
                list[j] = t;
            }
    for (int i = 0; i < n; i++)
        if (tp_graph_n_users(g, list[i]) == 0)
            tp_graph_remove(g, list[i]);
}

/* Removes a cat and its slices (which sit before it) once nothing reads
 * them; indices after `cat` shift, those before do not. */
static void remove_reassembly(tp_graph *g, int cat)
{
    int n = g->nodes[cat].n_inputs, list[TP_MAX_DIMS + 1];
    memcpy(list, g->nodes[cat].inputs, sizeof(int) * (size_t)n);
    list[n] = cat;
    remove_unread(g, list, n + 1);
}

static tp_status make_node(tp_graph *g, tp_op op, const char *base, int n_inputs, tp_node *n, tp_err *err)
{
    memset(n, 0, sizeof *n);
    n->op = op;
    n->name = tp_graph_fresh_name(g, base);
    n->inputs = calloc((size_t)n_inputs, sizeof(int));
    n->n_inputs = n_inputs;
    if (!n->name || !n->inputs) {
        free(n->name);
        free(n->inputs);
        return tp_fail(err, TP_NOMEM, "fuse_tp: out of memory");
    }
    return TP_OK;
}

/* Collects the matmuls reading operand `a` that fuse together. */
static int collect_matmuls(const tp_graph *g, int a, int *mm, int max)
{
    int n = 0, first = -1;
    for (int j = a + 1; j < g->n_nodes && n < max; j++) {
        const tp_node *u = &g->nodes[j];
        if (u->op != TP_OP_MATMUL || u->inputs[0] != a)
            continue;
        if (first < 0)
            first = j;
        if (!fusable_matmul(g, j, a, first))
            continue;
        const tp_node *m0 = n ? &g->nodes[mm[0]] : u;
        if (u->attrs.transpose_b != m0->attrs.transpose_b || u->dtype != m0->dtype)
            continue;
        mm[n++] = j;
    }
    return n;
}

/* Turns matmul m into a slice [start, start+len) of the fused output. */
static void matmul_to_slice(tp_graph *g, int m, int fused, int64_t start, int64_t len)
{
    tp_node *n = &g->nodes[m];
    n->op = TP_OP_SLICE;
    n->n_inputs = 1;
    n->inputs[0] = fused;
    memset(&n->attrs, 0, sizeof n->attrs);
    n->attrs.dim = -1;
    n->attrs.start = start;
    n->attrs.length = len;
}

static tp_status fuse_gather(tp_graph *g, int ag, int a, const tp_attrs *pieces, int *changed, tp_err *err)
{
    int mm[16];
    /* gathering K, each product is a sum over ranks: one weight per node */
    int k = collect_matmuls(g, a, mm, g->nodes[ag].attrs.dim == g->nodes[ag].ndim - 1 ? 1 : 16);
    if (k == 0)
        return TP_OK;
    const tp_node *gn = &g->nodes[ag];
    tp_node f;
    char base[300];
    snprintf(base, sizeof base, "%s.fused_ag_mm", g->nodes[mm[0]].name);
    tp_status st = make_node(g, TP_OP_FUSED_AG_MM, base, 1 + k, &f, err);
    if (st != TP_OK)
        return st;
    f.inputs[0] = gn->inputs[0];
    f.attrs.dim = gn->attrs.dim;
    f.attrs.algo = TP_ALGO_FUSED;
    f.attrs.transpose_b = g->nodes[mm[0]].attrs.transpose_b;
    f.attrs.n_fused = k;
    int64_t width[16];
    for (int i = 0; i < k; i++) {
        f.inputs[1 + i] = g->nodes[mm[i]].inputs[1];
        width[i] = g->nodes[mm[i]].shape[g->nodes[mm[i]].ndim - 1];
    }
    if (pieces) {
        f.attrs.n_pieces = pieces->n_pieces;
        f.attrs.piece_dim = pieces->piece_dim;
        f.attrs.cat_dim = pieces->cat_dim;
        memcpy(f.attrs.piece_start, pieces->piece_start, sizeof f.attrs.piece_start);
        memcpy(f.attrs.piece_len, pieces->piece_len, sizeof f.attrs.piece_len);
    } else if (a != ag) { /* the view between gather and matmul: keep its target */
        const tp_node *v = &g->nodes[a];
        f.attrs.n_shape = v->attrs.n_shape;
        memcpy(f.attrs.shape, v->attrs.shape, sizeof f.attrs.shape);
    }
    if (k == 1) { /* the fused node replaces the matmul: keep its name */
        char *name = strdup(g->nodes[mm[0]].name);
        if (!name) {
            free(f.name);
            free(f.inputs);
            return tp_fail(err, TP_NOMEM, "fuse_tp: out of memory");
        }
        free(f.name);
        f.name = name;
    }
    int pos = mm[0];
    if ((st = tp_graph_insert(g, pos, &f, err)) != TP_OK)
        return st;
    int64_t start = 0;
    for (int i = 0; i < k; i++) {
        int m = mm[i] + 1; /* shifted by the insert */
        if (k == 1) {
            tp_graph_replace_uses(g, m, pos, m + 1);
            tp_graph_remove(g, m);
        } else {
            matmul_to_slice(g, m, pos, start, width[i]);
        }
        start += width[i];
    }
    /* the gather (and a view between it and the matmuls) stays only if
     * something else still reads the gathered tensor */
    if (pieces)
        remove_reassembly(g, a);
    else if (a != ag && tp_graph_n_users(g, a) == 0)
        tp_graph_remove(g, a);
    if (tp_graph_n_users(g, ag) == 0)
        tp_graph_remove(g, ag);
    *changed += 1;
    return TP_OK;
}

/* Whether fusing will leave nothing reading v (and v is no output): every
 * reader is a matmul taking v as its activation with a 2-D weight or, when
 * via_view, a view keeping the last dim that only such matmuls read. */
static int only_fusable_matmuls_read(const tp_graph *g, int v, int via_view)
{
    int seen = 0;
    for (int j = v + 1; j < g->n_nodes; j++) {
        int reads = 0;
        for (int k = 0; k < g->nodes[j].n_inputs; k++)
            reads += g->nodes[j].inputs[k] == v;
        if (!reads)
            continue;
        seen += reads;
        if (!fusable_matmul(g, j, v, j) && !(via_view && operand_of(g, v, j) == j && only_fusable_matmuls_read(g, j, 0)))
            return 0;
    }
    return seen > 0 && seen == tp_graph_n_users(g, v);
}

/* all_gather(x, a) -> its d rank chunks along a -> cat along b is
 * all_gather(x, b) (tp_pieces_are_rank_chunks). When only matmuls that will
 * fuse read the cat, the cat becomes that gather and the chunks and the old
 * gather go; try_gather then fuses the direct form (gathering K, the
 * contracted dim, as a rank-ordered sum). Returns 1 when rewritten. */
static int redirect_gather(tp_graph *g, int ag)
{
    int first = -1;
    for (int j = ag + 1; j < g->n_nodes && first < 0; j++)
        for (int k = 0; k < g->nodes[j].n_inputs; k++)
            if (g->nodes[j].inputs[k] == ag)
                first = j;
    int cat = first >= 0 && is_op(g, first, TP_OP_SLICE) ? tp_graph_sole_user(g, first) : -1;
    tp_attrs pieces = {0};
    if (cat < 0 || !read_pieces(g, ag, cat, &pieces) || pieces.piece_dim != g->nodes[ag].attrs.dim ||
        !tp_pieces_are_rank_chunks(&pieces, g->world_size, g->nodes[ag].shape) ||
        !only_fusable_matmuls_read(g, cat, pieces.cat_dim != g->nodes[cat].ndim - 1))
        return 0;
    tp_node *c = &g->nodes[cat];
    int list[TP_MAX_DIMS + 1];
    memcpy(list, c->inputs, sizeof(int) * (size_t)pieces.n_pieces);
    list[pieces.n_pieces] = ag;
    c->op = TP_OP_ALL_GATHER;
    c->n_inputs = 1;
    c->inputs[0] = g->nodes[ag].inputs[0];
    memset(&c->attrs, 0, sizeof c->attrs);
    c->attrs.dim = pieces.cat_dim;
    remove_unread(g, list, pieces.n_pieces + 1);
    return 1;
}

/* Gather `ag` at index i: fuse its matmuls, directly or through one view. */
static tp_status try_gather(tp_graph *g, int ag, int *changed, tp_err *err)
{
    const tp_node *n = &g->nodes[ag];
    int gdim = n->attrs.dim;
    if (n->fallback)
        return TP_OK;
    if (redirect_gather(g, ag)) {
        *changed += 1; /* the caller rescans and meets the gather along b */
        return TP_OK;
    }
    for (int j = ag + 1; j < g->n_nodes; j++) {
        int reads = 0;
        for (int k = 0; k < g->nodes[j].n_inputs; k++)
            reads |= g->nodes[j].inputs[k] == ag;
        if (!reads)
            continue;
        tp_attrs pieces = {0};
        int cat = g->nodes[j].op == TP_OP_SLICE ? tp_graph_sole_user(g, j) : -1;
        int through = cat >= 0 && match_reassembly(g, ag, cat, &pieces);
        int a = through ? cat : operand_of(g, ag, j);
        if (a < 0 || (gdim == n->ndim - 1 && (through || a != ag)))
            continue; /* a gathered K is summed over ranks: direct matmuls only */
        int before = *changed;
        tp_status st = fuse_gather(g, ag, a, through ? &pieces : NULL, changed, err);
        if (st != TP_OK || *changed != before)
            return st; /* indices moved: the caller rescans */
    }
    return TP_OK;
}

/* Rewrites rs as fused_matmul_reduce_scatter(a, w) of matmul m. */
static tp_status become_fused_rs(tp_graph *g, int rs, int m, tp_err *err)
{
    tp_node *r = &g->nodes[rs];
    const tp_node *mn = &g->nodes[m];
    int a = mn->inputs[0], w = mn->inputs[1];
    int *ins = realloc(r->inputs, 2 * sizeof(int));
    if (!ins)
        return tp_fail(err, TP_NOMEM, "fuse_tp: out of memory");
    r->attrs.algo = TP_ALGO_FUSED;
    r->attrs.transpose_b = mn->attrs.transpose_b;
    r->inputs = ins;
    r->n_inputs = 2;
    r->inputs[0] = a;
    r->inputs[1] = w;
    r->op = TP_OP_FUSED_MM_RS;
    return TP_OK;
}

/* A matmul whose product fused_matmul_reduce_scatter can compute. */
static int fusable_product(const tp_graph *g, int m)
{
    const tp_node *mn = &g->nodes[m];
    return mn->op == TP_OP_MATMUL && !mn->fallback && g->nodes[mn->inputs[1]].ndim == 2;
}

/* matmul -> its d rank chunks along a -> cat along b -> reduce_scatter
 * along b is reduce_scatter(matmul, a): the cat's chunk r along b is the
 * product's chunk r along a (tp_pieces_are_rank_chunks). Rewritten when
 * the cat has no other reader, so try_scatter then fuses the direct form
 * (a scatter of column blocks of w when a is the last dim). Returns 1 when
 * rewritten. */
static int redirect_scatter(tp_graph *g, int rs, int cat)
{
    int m = g->nodes[g->nodes[cat].inputs[0]].inputs[0];
    tp_attrs pieces = {0};
    if (!fusable_product(g, m) || tp_graph_sole_user(g, cat) != rs || !read_pieces(g, m, cat, &pieces) ||
        pieces.cat_dim != g->nodes[rs].attrs.dim ||
        !tp_pieces_are_rank_chunks(&pieces, g->world_size, g->nodes[m].shape))
        return 0;
    g->nodes[rs].inputs[0] = m;
    g->nodes[rs].attrs.dim = pieces.piece_dim;
    remove_reassembly(g, cat);
    return 1;
}

/* matmul -> slices -> cat -> reduce_scatter: the product's rows permuted. */
static tp_status try_scatter_reassembly(tp_graph *g, int rs, int cat, int *changed, tp_err *err)
{
    int m = g->nodes[g->nodes[cat].inputs[0]].inputs[0];
    tp_attrs pieces = {0};
    if (!fusable_product(g, m) || !match_reassembly(g, m, cat, &pieces) || g->nodes[rs].attrs.dim >= g->nodes[cat].ndim - 1 ||
        tp_graph_sole_user(g, cat) != rs)
        return TP_OK;
    tp_attrs *ra = &g->nodes[rs].attrs;
    tp_attrs keep = *ra;
    memset(ra, 0, sizeof *ra);
    ra->dim = keep.dim;
    ra->reduce = keep.reduce;
    ra->n_pieces = pieces.n_pieces;
    ra->piece_dim = pieces.piece_dim;
    ra->cat_dim = pieces.cat_dim;
    memcpy(ra->piece_start, pieces.piece_start, sizeof ra->piece_start);
    memcpy(ra->piece_len, pieces.piece_len, sizeof ra->piece_len);
    tp_status st = become_fused_rs(g, rs, m, err);
    if (st != TP_OK)
        return st;
    remove_reassembly(g, cat);
    tp_graph_remove(g, m);
    *changed += 1;
    return TP_OK;
}

/* matmul m [-> view v] -> reduce_scatter rs, all single-use. */
static tp_status try_scatter(tp_graph *g, int rs, int *changed, tp_err *err)
{
    tp_node *r = &g->nodes[rs];
    int src = r->inputs[0], v = -1, m = src;
    if (r->fallback)
        return TP_OK;
    if (is_op(g, src, TP_OP_CAT) && is_op(g, g->nodes[src].inputs[0], TP_OP_SLICE)) {
        if (!redirect_scatter(g, rs, src))
            return try_scatter_reassembly(g, rs, src, changed, err);
        *changed += 1; /* the caller rescans and meets the direct form */
        return TP_OK;
    }
    if (is_op(g, src, TP_OP_VIEW) || is_op(g, src, TP_OP_RESHAPE)) {
        v = src;
        m = g->nodes[v].inputs[0];
        if (g->nodes[v].storage != g->nodes[m].storage || tp_graph_sole_user(g, v) != rs)
            return TP_OK;
    }
    if (!fusable_product(g, m) || tp_graph_sole_user(g, m) != (v >= 0 ? v : rs))
        return TP_OK;
    const tp_node *mn = &g->nodes[m];
    const tp_node *out = &g->nodes[src];
    if (v >= 0 && out->shape[out->ndim - 1] != mn->shape[mn->ndim - 1])
        return TP_OK; /* the view must keep N as the last dim */
    if (v >= 0 && tp_pass_is_strided(g, mn->inputs[0]))
        return TP_OK; /* a is re-viewed in the view's coordinates */
    tp_attrs at = r->attrs;
    memset(&r->attrs, 0, sizeof r->attrs);
    r->attrs.dim = at.dim;
    r->attrs.reduce = at.reduce;
    if (v >= 0) {
        r->attrs.n_shape = g->nodes[v].attrs.n_shape;
        memcpy(r->attrs.shape, g->nodes[v].attrs.shape, sizeof r->attrs.shape);
    }
    tp_status st = become_fused_rs(g, rs, m, err);
    if (st != TP_OK)
        return st;
    if (v >= 0)
        tp_graph_remove(g, v);
    tp_graph_remove(g, m);
    *changed += 1;
    return TP_OK;
}

tp_status tp_pass_fuse_tp(tp_graph *g, const tp_pass_opts *o, int *changed, tp_err *err)
{
    (void)o;
    *changed = 0;
    for (int i = 0; i < g->n_nodes; i++) {
        int before = *changed;
        tp_status st = TP_OK;
        if (g->nodes[i].op == TP_OP_ALL_GATHER)
            st = try_gather(g, i, changed, err);
        else if (g->nodes[i].op == TP_OP_REDUCE_SCATTER)
            st = try_scatter(g, i, changed, err);
        if (st == TP_OK && *changed != before)
            st = tp_graph_infer(g, g->batch, err);
        if (st != TP_OK)
            return st;
        if (*changed != before)
            i = -1; /* indices moved: rescan from the top */
    }
    return TP_OK;
}
