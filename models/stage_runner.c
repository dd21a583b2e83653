/* stage_runner.c — a pipeline stage's step: its schedule walked over its model (stage_runner.h). */
#include "models/stage_runner.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/fail.h"

/* one stream of messages each way: activations forward, gradients back (in posting order per pair and tag) */
enum { TAG_ACTIVATION = 1, TAG_GRADIENT = 2 };

moe_status moe_stage_runner_passes(const moe_pp_shape *shape, int stage, int *passes) {
    moe_pp_step *steps;
    int count;
    MOE_TRY(moe_pp_schedule(shape, stage, &steps, &count));
    *passes = moe_pp_schedule_passes(steps, count, shape->virtual_stages);
    free(steps);
    return MOE_OK;
}

moe_status moe_stage_runner_init(moe_stage_runner *r, moe_model *model, moe_comm *pipeline, const moe_pp_shape *shape,
                                 int max_tokens) {
    memset(r, 0, sizeof *r);
    const int stage = moe_comm_rank(pipeline);
    if (moe_comm_size(pipeline) != shape->stages)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "a pipeline of %d ranks for a schedule of %d stages",
                        moe_comm_size(pipeline), shape->stages);
    r->model = model, r->pipeline = pipeline, r->shape = *shape, r->stage = stage, r->chunks = shape->virtual_stages;
    MOE_TRY(moe_pp_schedule(shape, stage, &r->steps, &r->num_steps));
    r->passes = moe_pp_schedule_passes(r->steps, r->num_steps, r->chunks);
    if (r->passes > moe_model_num_passes(model) || r->chunks != moe_model_stage_of(model)->chunks)
        return moe_stage_runner_free(r), moe_fail(MOE_ERR_INVALID_CONFIG, "stage %d keeps %d forwards of each of %d "
                                                  "chunks in flight; its model holds %d of %d", stage, r->passes,
                                                  r->chunks, moe_model_num_passes(model),
                                                  moe_model_stage_of(model)->chunks);
    const int n = r->chunks * r->passes;
    r->nbytes = (size_t)max_tokens * moe_model_config_of(model)->d_model * sizeof(moe_real);
    r->grad_out = calloc(n, sizeof(moe_real *));
    r->act_sent = calloc(n, sizeof(moe_comm_request *));
    r->grad_sent = calloc(n, sizeof(moe_comm_request *));
    r->pass_mb = malloc(n * sizeof(int));
    moe_status st = r->grad_out && r->act_sent && r->grad_sent && r->pass_mb ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    moe_runtime *rt = moe_model_runtime(model);
    const int exchanges = shape->stages > 1 || r->chunks > 1;
    for (int i = 0; i < 2 && st == MOE_OK && exchanges; i++)
        st = moe_runtime_alloc(rt, r->nbytes, (void **)&r->recv[i]);
    for (int i = 0; i < n && st == MOE_OK && exchanges; i++)
        st = moe_runtime_alloc(rt, r->nbytes, (void **)&r->grad_out[i]);
    for (int i = 0; i < n && st == MOE_OK; i++) r->pass_mb[i] = -1;
    if (st != MOE_OK) moe_stage_runner_free(r);
    return st;
}

void moe_stage_runner_free(moe_stage_runner *r) {
    moe_runtime *rt = r->model ? moe_model_runtime(r->model) : NULL;
    if (rt) {
        moe_runtime_free(rt, r->recv[0]), moe_runtime_free(rt, r->recv[1]);
        for (int i = 0; r->grad_out && i < r->chunks * r->passes; i++) moe_runtime_free(rt, r->grad_out[i]);
    }
    free(r->steps), free(r->grad_out), free(r->act_sent), free(r->grad_sent), free(r->pass_mb);
    memset(r, 0, sizeof *r);
}

/* The (chunk, pass) slot of micro-batch mb's forward of chunk c, selected. */
static int slot_of(const moe_stage_runner *r, int mb, int chunk) { return chunk * r->passes + mb % r->passes; }
static moe_status select_pass(moe_stage_runner *r, int mb, int chunk) {
    return moe_model_select_pass(r->model, chunk, mb % r->passes);
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* moe_comm_wait, its time added to r->wait_s. */
static moe_status timed_wait(moe_stage_runner *r, moe_comm_request *req) {
    const double start = now_s();
    const moe_status st = moe_comm_wait(r->pipeline, req);
    r->wait_s += now_s() - start;
    return st;
}

/* Waits for a slot's earlier send, if any (its buffer is about to be written again). */
static moe_status wait_slot(moe_stage_runner *r, moe_comm_request **slot) {
    moe_comm_request *req = *slot;
    *slot = NULL;
    return req ? timed_wait(r, req) : MOE_OK;
}

/* Receives nbytes of an activation from pipeline rank peer into its buffer (complete on return). */
static moe_status receive_activation(moe_stage_runner *r, size_t nbytes, int peer) {
    moe_comm_request *req;
    MOE_TRY(moe_comm_irecv_bytes(r->pipeline, r->recv[0], nbytes, peer, TAG_ACTIVATION, &req));
    return timed_wait(r, req);
}

/* Waits for every send still posted. */
static moe_status finish_sends(moe_stage_runner *r) {
    const double start = now_s();
    moe_status st = moe_comm_wait_all(r->pipeline, r->act_sent, r->chunks * r->passes);
    if (st == MOE_OK) st = moe_comm_wait_all(r->pipeline, r->grad_sent, r->chunks * r->passes);
    r->wait_s += now_s() - start;
    return st;
}

static moe_status forward_step(moe_stage_runner *r, const moe_stage_hooks *h, int mb, int chunk, int num_seqs,
                               const moe_real *x) {
    const int slot = slot_of(r, mb, chunk);
    if (r->pass_mb[slot] >= 0)
        return moe_fail(MOE_ERR_INVALID_CONFIG, "stage %d: micro-batch %d's forward of chunk %d would overwrite "
                        "micro-batch %d's activations (the schedule keeps more in flight than the stash holds)",
                        r->stage, mb, chunk, r->pass_mb[slot]);
    MOE_TRY(wait_slot(r, &r->act_sent[slot])); /* the pass's output is rewritten */
    MOE_TRY(select_pass(r, mb, chunk));
    const int *inputs = NULL, *targets = NULL;
    MOE_TRY(h->before_forward(h->ctx, mb, chunk, &inputs, &targets));
    double loss = 0;
    MOE_TRY(moe_model_stage_forward(r->model, inputs, x, targets, num_seqs, &loss, NULL));
    r->pass_mb[slot] = mb;
    return h->after_forward(h->ctx, mb, chunk, loss);
}

static moe_status backward_step(moe_stage_runner *r, const moe_stage_hooks *h, int mb, int chunk,
                                moe_real loss_scale, const moe_real *dy) {
    const int slot = slot_of(r, mb, chunk);
    if (r->pass_mb[slot] != mb)
        return moe_fail(MOE_ERR_NO_FORWARD, "stage %d: micro-batch %d's backward of chunk %d has no forward in the "
                        "stash", r->stage, mb, chunk);
    MOE_TRY(h->before_backward(h->ctx, mb, chunk));
    MOE_TRY(select_pass(r, mb, chunk));
    MOE_TRY(moe_model_stage_backward(r->model, loss_scale, dy));
    r->pass_mb[slot] = -1;
    return h->after_backward(h->ctx, mb, chunk);
}

/* One post of a run of exchanges. */
typedef struct {
    int send, peer, tag;
    const void *from; /* a send's */
    void *into;       /* a receive's */
    moe_comm_request **req;
} exchange_post;

/* The run of exchange steps [i, end) posted as one batch (schedule.h "Posting in order"): an activation sent from
 * its pass's output, a gradient from the pass's copy of the input gradient, each after the slot's earlier send is
 * done; then the run's receives (at most one of each kind: the computes after it read them) waited for, arrived[0]
 * (the activation) and arrived[1] (the gradient) set to what came. */
static moe_status exchange(moe_stage_runner *r, int i, int end, size_t nbytes, const moe_real *arrived[2]) {
    exchange_post posts[4];
    moe_comm_request *received[2] = {NULL, NULL};
    int n = 0;
    if (end - i > (int)(sizeof posts / sizeof posts[0]))
        return moe_fail(MOE_ERR_INVALID_CONFIG, "stage %d: %d exchanges between two computes at step %d of its "
                        "schedule (at most 4)", r->stage, end - i, i);
    for (int j = i; j < end; j++) { /* before the batch: a batch may not wait */
        const moe_pp_step *s = &r->steps[j];
        const int slot = slot_of(r, s->micro_batch, s->chunk), grad = s->op == MOE_PP_SEND_GRADIENT ||
                                                                      s->op == MOE_PP_RECV_GRADIENT;
        exchange_post *p = &posts[n++];
        *p = (exchange_post){.peer = s->peer, .tag = grad ? TAG_GRADIENT : TAG_ACTIVATION};
        if (s->op == MOE_PP_SEND_ACTIVATION) { /* the pass's output stays until its next forward */
            MOE_TRY(wait_slot(r, &r->act_sent[slot]));
            MOE_TRY(select_pass(r, s->micro_batch, s->chunk));
            p->send = 1, p->from = moe_model_stage_output(r->model), p->req = &r->act_sent[slot];
        } else if (s->op == MOE_PP_SEND_GRADIENT) { /* the input gradient is scratch the next backward rewrites */
            MOE_TRY(wait_slot(r, &r->grad_sent[slot]));
            MOE_TRY(moe_runtime_copy(moe_model_runtime(r->model), r->grad_out[slot],
                                     moe_model_stage_input_grad(r->model), nbytes));
            p->send = 1, p->from = r->grad_out[slot], p->req = &r->grad_sent[slot];
        } else if (s->op != MOE_PP_RECV_ACTIVATION && s->op != MOE_PP_RECV_GRADIENT) {
            return moe_fail(MOE_ERR_INVALID_CONFIG, "stage %d: unknown schedule step %d", r->stage, (int)s->op);
        } else if (arrived[grad] || received[grad]) {
            return moe_fail(MOE_ERR_INVALID_CONFIG, "stage %d: a second %s received before a compute reads the "
                            "first, at step %d of its schedule", r->stage, grad ? "gradient" : "activation", j);
        } else {
            p->into = r->recv[grad], p->req = &received[grad];
        }
    }
    MOE_TRY(moe_comm_batch_begin(r->pipeline));
    moe_status st = MOE_OK;
    for (int j = 0; j < n && st == MOE_OK; j++)
        st = posts[j].send ? moe_comm_isend_bytes(r->pipeline, posts[j].from, nbytes, posts[j].peer, posts[j].tag,
                                                  posts[j].req)
                           : moe_comm_irecv_bytes(r->pipeline, posts[j].into, nbytes, posts[j].peer, posts[j].tag,
                                                  posts[j].req);
    const moe_status ended = moe_comm_batch_end(r->pipeline); /* closed whatever happened inside */
    MOE_TRY(st != MOE_OK ? st : ended);
    for (int k = 0; k < 2; k++)
        if (received[k]) {
            MOE_TRY(timed_wait(r, received[k]));
            arrived[k] = r->recv[k];
        }
    return MOE_OK;
}

/* What passes between stages for num_seqs sequences: [T, d], or at tp > 1 this rank's slice of it (models/model.h). */
static size_t activation_nbytes(const moe_stage_runner *r, int num_seqs) {
    const moe_model_config *c = moe_model_config_of(r->model);
    const int tp = moe_parallel_ranks(moe_model_parallel(r->model)).tp_size;
    return (size_t)num_seqs * c->seq_len / tp * c->d_model * sizeof(moe_real);
}

static moe_status run_steps(moe_stage_runner *r, const moe_stage_hooks *h, int num_seqs, moe_real loss_scale) {
    const size_t nbytes = activation_nbytes(r, num_seqs);
    if (nbytes > r->nbytes) return MOE_ERR_INVALID_ARG;
    for (int i = 0; i < r->chunks * r->passes; i++) r->pass_mb[i] = -1; /* a failed step left its stash behind */
    const moe_real *arrived[2] = {NULL, NULL}; /* what the receives brought for the next forward and backward */
    for (int i = 0; i < r->num_steps; i++) {
        const moe_pp_step *s = &r->steps[i];
        if (moe_pp_step_exchanges(s)) {
            const int end = moe_pp_exchange_run_end(r->steps, r->num_steps, i);
            MOE_TRY(exchange(r, i, end, nbytes, arrived));
            i = end - 1;
        } else if (s->op == MOE_PP_FORWARD) {
            MOE_TRY(forward_step(r, h, s->micro_batch, s->chunk, num_seqs, arrived[0]));
            arrived[0] = NULL;
        } else {
            MOE_TRY(backward_step(r, h, s->micro_batch, s->chunk, loss_scale, arrived[1]));
            arrived[1] = NULL;
        }
    }
    return finish_sends(r);
}

moe_status moe_stage_runner_step(moe_stage_runner *r, const moe_stage_hooks *h, int num_seqs, moe_real loss_scale) {
    const double start = now_s();
    const moe_status st = run_steps(r, h, num_seqs, loss_scale);
    r->step_s += now_s() - start;
    return st;
}

moe_status moe_stage_runner_forward(moe_stage_runner *r, const int *inputs, const int *targets, int num_seqs,
                                    double *loss_sum, moe_real *logits) {
    const size_t nbytes = activation_nbytes(r, num_seqs);
    if (nbytes > r->nbytes) return MOE_ERR_INVALID_ARG;
    const int P = r->shape.stages, V = r->chunks, prev = (r->stage + P - 1) % P, next = (r->stage + 1) % P;
    *loss_sum = 0;
    moe_comm_request *sent = NULL; /* the previous chunk's output on its way (to this rank itself when P = 1) */
    moe_status st = MOE_OK;
    for (int c = 0; c < V && st == MOE_OK; c++) { /* virtual stage c P + stage: from the one before, to the next */
        const int v = c * P + r->stage, first = v == 0, last = v == P * V - 1;
        if (!first) st = receive_activation(r, nbytes, prev);
        if (st == MOE_OK && sent) st = timed_wait(r, sent); /* its receive is posted by now (or just completed) */
        sent = NULL;
        if (st == MOE_OK) st = moe_model_select_pass(r->model, c, 0);
        double loss = 0;
        if (st == MOE_OK)
            st = moe_model_stage_forward(r->model, inputs, first ? NULL : r->recv[0], last ? targets : NULL, num_seqs,
                                         &loss, last ? logits : NULL);
        *loss_sum += loss;
        if (st == MOE_OK && !last)
            st = moe_comm_isend_bytes(r->pipeline, moe_model_stage_output(r->model), nbytes, next, TAG_ACTIVATION,
                                      &sent);
    }
    if (sent) { /* the last chunk of a stage before the last: its send completes once the next stage takes it */
        const moe_status waited = timed_wait(r, sent);
        st = st == MOE_OK ? waited : st;
    }
    return st;
}
