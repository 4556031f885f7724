/* The sampler's passes over a row of V logits (sampler.c: sampler_pick, sampler_top), vectorised
 * in 16 lanes with one fixed arithmetic, so that every instruction set gives the same bits (the
 * portable vector-extension code compiled for the baseline, FMA3 and AVX2, and AVX-512
 * intrinsics; tests/engine/test_sampler.c compares each with a scalar reference):
 * - z_j = x_j * scale - sub, rounded after each operation;
 * - e_j = simd_exp4(z_j) (Cephes' expf polynomial with simd_fma, within 2 ulp of expf) where
 *   z_j >= -87.3, and +0 below it or where z_j is a NaN: a logit of -INFINITY (a token masked
 *   out) has exactly probability 0 and is never drawn;
 * - sums in chunks of SMX_CHUNK logits from id 0: 16 float lanes (id j in lane j mod 16) added in
 *   increasing j, reduced by simd_tree, and the chunks' sums added in double in increasing order.
 * Internal to core/engine; the functions run on the calling thread. */
#ifndef DAPO_SOFTMAX_H
#define DAPO_SOFTMAX_H

enum { SMX_CHUNK = 256 };

/* The largest of x[V] that is not a NaN (-INFINITY when there is none). */
float smx_max(const float *x, int V);
/* The lowest j with x[j] == mx (mx from smx_max), or 0 when there is none. */
int smx_argmax(const float *x, int V, float mx);
/* The sum of e_j over the row (above) with z_j = x[j] * scale - sub; with p, stores e_j into
 * p[j]; with chunks, each chunk's sum (as added) into chunks[j / SMX_CHUNK]. */
double smx_exp_sum(const float *x, int V, float scale, float sub, float *p, float *chunks);
/* The draw from p[V] (smx_exp_sum's e_j) with u in [0, its sum): the running sum walks the chunks'
 * sums (as smx_exp_sum added them) to the chunk where it passes u, then that chunk's p[j] one by
 * one in double; the first j where it exceeds u (a j with p[j] > 0). When rounding leaves u past
 * the chunk's own sum, its last j with p[j] > 0; -1 when no chunk's sum passes u. */
int smx_draw(const float *p, int V, double u);
/* smx_draw's result without p: from the chunks' sums that smx_exp_sum(x, V, scale, sub, ...)
 * stored, recomputing only the e_j of the chunk where the running sum passes u (the same bits),
 * so the exponentials' pass need not write the row. */
int smx_draw_chunks(const float *x, int V, float scale, float sub, const float *chunks, double u);
/* Appends to idx, in increasing j, every j with p[j] >= cutoff; returns how many. */
int smx_at_least(const float *p, int V, float cutoff, int *idx);
/* The nucleus of p[V] among its candidates idx[n] (ids whose p could be in it, as smx_at_least
 * lists them): the smallest prefix of the tokens ordered by p descending, ties by ascending id,
 * whose mass reaches target, the token that reaches it included (all of them when rounding
 * leaves the whole set short). Found by partitioning idx around medians of three (expected
 * O(n); no sort but of a run of equal p by id), the masses added in double in the order the
 * partitions leave, so the same on every instruction set. Leaves the kept ids in ascending order
 * in idx and returns how many (0 when n is 0; the first candidate alone when target is not
 * positive). */
int smx_nucleus(const float *p, int V, int *idx, int n, double target);
/* The k (1..V) largest of l_j = (x[j] * scale - sub) - lse (a NaN taken as -INFINITY), largest
 * first, ties by ascending j, into ids[k] and lp[k]: each l_j is the scalar expression's value. */
void smx_top(const float *x, int V, float scale, float sub, float lse, int k, int *ids, float *lp);

#endif
