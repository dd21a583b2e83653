/* segment_sum.h — the order in which an expert's per-segment weight-gradient products are added into its gradient
 * (the segments contract of experts/expert_ffn.h), as data: one schedule that the CPU (expert_ffn_cpu.c) and the
 * CUDA experts (expert_ffn.cu) both follow step by step, so their orders cannot drift apart, and that a test can
 * check without a GPU (tests/test_segment_sum.c).
 *
 * Buffers, each one product's size: MOE_SEGMENT_SUM_GRAD is the gradient itself; scratch buffer b >= 1 is at
 * scratch + (b - 1) * count, moe_segment_sum_scratch_buffers(segments) of them: [spare | slot 0 | ... | slot L],
 * L = log2(segments) (L + 2 buffers; expert_ffn.h's moe_expert_ffn_wgrad_scratch_count).
 *
 * segments a power of two: tree_reduce.h's binary counter. Segment sg's product goes into slot 0 (sg even) or the
 * spare (sg odd); then, while bit l of sg is set, slot (l or l + 1) = slot l + carry, the older subtree on the
 * left: after the last segment slot L holds ((p0 + p1) + (p2 + p3)) + ..., and the last step is
 * grad = grad + slot L. Otherwise (3, 5, 6, ...) in segment order: each product into the spare, then
 * grad = grad + spare. An empty segment's product is a zero leaf, so the shape never depends on the counts. */
#ifndef MOE_EXPERTS_SEGMENT_SUM_H
#define MOE_EXPERTS_SEGMENT_SUM_H

enum { MOE_SEGMENT_SUM_GRAD = 0, MOE_SEGMENT_SUM_SPARE = 1 };
/* slot l of the counter */
#define MOE_SEGMENT_SUM_SLOT(l) (2 + (l))
/* the most steps one call of moe_segment_sum_steps writes: a leaf and a carry per bit of an int */
#define MOE_SEGMENT_SUM_MAX_STEPS 33

typedef struct {
    int segment; /* >= 0: buffer dst = that segment's product (formed whole; zero when the segment is empty) */
    int dst;     /* segment < 0: buffer dst = buffer left + buffer right, element by element, one rounding each */
    int left, right;
} moe_segment_sum_step;

/* Scratch buffers the schedule of `segments` uses (segments >= 1): log2 rounded up, plus 2. */
int moe_segment_sum_scratch_buffers(int segments);

/* The steps after which segment sg's product is in (0 <= sg < segments): its leaf, then the additions it causes;
 * sg == segments: what ends the sum (the root into the gradient; none in segment order). Run in order for
 * sg = 0, 1, ..., segments they are the whole sum. Returns how many steps it wrote into steps[], -1 when sg is out
 * of range or segments < 1. */
int moe_segment_sum_steps(int segments, int sg, moe_segment_sum_step steps[MOE_SEGMENT_SUM_MAX_STEPS]);

#endif
