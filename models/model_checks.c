/* model_checks.c — finding the first NaN or Inf: in a buffer laid out like the parameters (named by its tensor and
 * element), and while checking (moe_model_set_checks), in each op's output as forward and backward write them. */
#include <stdarg.h>
#include <stdio.h>

#include "core/fail.h"
#include "models/model_internal.h"

/* The name of element i of tensor t, with the global expert id filled in for an expert tensor. */
static void element_name(const moe_model *m, const moe_model_tensor *t, size_t i, char *out, size_t n) {
    if (!t->experts) {
        snprintf(out, n, "%s[%zu]", t->name, i);
        return;
    }
    const size_t per = t->count / t->experts;
    char name[sizeof t->name + 16];
    snprintf(name, sizeof name, t->name, moe_parallel_ranks(m->par).ep_rank * m->num_local_experts + (int)(i / per));
    snprintf(out, n, "%s[%zu]", name, i % per);
}

/* The first NaN or Inf among values [lo, hi) of tensor t, held at `at` (on_host 0: by the runtime's find_nonfinite
 * in its memory; 1: by the CPU's in host memory), as a failure naming the element. */
static moe_status tensor_finite(moe_model *m, const moe_model_tensor *t, const moe_real *at, size_t lo, size_t hi,
                                int on_host, const char *what) {
    long long first;
    if (on_host) first = moe_find_nonfinite_cpu(at, hi - lo);
    else MOE_TRY(m->dense->find_nonfinite(m->ops_state, at, hi - lo, &first));
    if (first < 0) return MOE_OK;
    char name[192];
    element_name(m, t, lo + (size_t)first, name, sizeof name);
    return moe_fail(MOE_ERR_NONFINITE, "%s: %s is the first NaN or Inf (world rank %d)", what, name,
                    moe_parallel_ranks(m->par).world_rank);
}

/* The first NaN or Inf of a buffer laid out like the parameters, found tensor by tensor. */
static moe_status check_finite(moe_model *m, const moe_real *buffer, int on_host, const char *what) {
    for (int i = 0; i < m->num_tensors; i++)
        MOE_TRY(tensor_finite(m, &m->tensors[i], buffer + m->tensors[i].offset, 0, m->tensors[i].count, on_host, what));
    return MOE_OK;
}

moe_status moe_model_check_finite(moe_model *m, const moe_real *buffer, const char *what) {
    return check_finite(m, buffer, 0, what);
}

moe_status moe_model_check_finite_host(moe_model *m, const moe_real *host_buffer, const char *what) {
    return check_finite(m, host_buffer, 1, what);
}

moe_status moe_model_check_range_grads_finite(moe_model *m, const char *what) {
    for (int i = 0; i < m->num_tensors; i++) {
        const moe_model_tensor *t = &m->tensors[i];
        const int expert = t->offset >= m->num_dense;
        const moe_zero_region *r = expert ? &m->zero.expert : &m->zero.dense;
        const size_t from = t->offset - (expert ? m->num_dense : 0); /* in the region */
        const size_t lo = from > r->begin ? from : r->begin, hi = from + t->count < r->end ? from + t->count : r->end;
        if (hi > lo)
            MOE_TRY(tensor_finite(m, t, moe_model_range_grads(m, expert) + (lo - r->begin), lo - from, hi - from, 0,
                                  what));
    }
    return MOE_OK;
}

void moe_model_set_checks(moe_model *m, moe_nonfinite_finding *finding) {
    m->finding = finding;
    for (int i = 0; i < m->stage.chunks * m->stage.passes; i++)
        for (int l = 0; l < m->cfg.num_layers; l++)
            if (m->passes[i].moe[l]) moe_layer_set_checks(m->passes[i].moe[l], finding);
}

moe_status moe__model_watch(moe_model *m, const moe_real *data, size_t count, const char *fmt, ...) {
    if (!m->finding || m->finding->found) return MOE_OK;
    long long first;
    MOE_TRY(m->dense->find_nonfinite(m->ops_state, data, count, &first));
    if (first < 0) return m->finding->looks++, MOE_OK;
    char what[160];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    m->finding->found = 1, m->finding->order = m->finding->looks;
    snprintf(m->finding->where, sizeof m->finding->where, "%s holds the first NaN or Inf (element %lld, world rank %d)",
             what, first, moe_parallel_ranks(m->par).world_rank);
    return MOE_OK;
}
