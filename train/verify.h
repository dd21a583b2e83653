/* verify.h — --verify-steps: a run's first steps computed a second time, in the same process, by the CPU fp32
 * reference (the CPU runtime, fp32 GEMMs) from the same weights and the same batch, and compared. It is how a
 * GPU or bf16 run proves itself on its first steps, where no test machine could.
 *
 * Per verified step (after the run's forward and backward, before its update):
 *   routing agreement: of the run's top-k choices (every micro-batch, MoE layer and token of the global batch),
 *   the fraction the reference's own routers also made (as sets per token: an order swap of a tie agrees);
 *   then the reference runs the step again with the run's choices forced (routing replay), so that what
 *   follows measures arithmetic only: a different choice near a tie is not an error, and with capacity limits
 *   it moves other tokens into or out of an expert's slots, which changes gradients by tens of percent;
 *   loss and gradient norm of both, relative difference |a - b| / |b|;
 *   gradient error per tensor of the rank's buffer (an expert tensor: the rank's experts of one layer and
 *   matrix): ||g - g_ref|| / max(||g_ref||, 0.1 * ||G_ref|| * sqrt(n / N)) (relative L2; G the whole gradient,
 *   n and N the tensor's and the buffer's sizes: a nearly-zero gradient is judged at the step's scale), the
 *   worst one named.
 * Outside the tolerances (moe_verify_tolerances_for) the step fails with MOE_ERR_MISMATCH and a message naming
 * what disagrees first: the loss (the forward pass) before any gradient, and among gradients the tensor that
 * backward produces first (from the output towards the embedding), so the op that writes it is the suspect. */
#ifndef MOE_TRAIN_VERIFY_H
#define MOE_TRAIN_VERIFY_H

#include "train/trainer.h"

typedef struct {
    double loss_rel;          /* relative loss difference allowed                      */
    double grad_norm_rel;     /* relative gradient-norm difference allowed             */
    double grad_rel;          /* relative L2 error allowed per tensor                  */
    double routing_agreement; /* least fraction of routing choices that must agree     */
} moe_verify_tolerances;

/* The documented tolerances for a run of c's precision, on a GPU or not, against the CPU fp32 reference. */
moe_verify_tolerances moe_verify_tolerances_for(const moe_model_config *c, int on_gpu);

typedef struct {
    int step;
    double loss, ref_loss, grad_norm, ref_grad_norm;
    double routing_agreement;     /* 1 when the model has no MoE layer */
    double worst_grad_rel;
    char worst_tensor[160];
} moe_verify_report;

typedef struct {
    moe_trainer ref;           /* the reference: same options, fp32, the CPU runtime, ref_par's layout */
    moe_trainer_shape shape;   /* what the checks read of the run's options: its architecture and batch */
    moe_verify_tolerances tol;
    moe_real *host;            /* [dense + experts] the run's weights, then its gradients, on the host */
    int *routes, *ref_routes;  /* [global tokens * k] one MoE layer's choices */
} moe_verifier;

/* Collective. run: the trainer being checked (created); ref_par: a CPU layout of the same ranks, pp and ep as the
 * run's (its own communicators; in a pipeline each stage's reference holds and checks that stage's layers). The reference loads the data files itself and needs host memory for a
 * second copy of the model. */
moe_status moe_verifier_create(moe_verifier *v, const moe_trainer *run, const moe_parallel *ref_par);
void moe_verifier_destroy(moe_verifier *v);

/* One step of the run, checked: the run's moe_trainer_compute, then the reference's on the same weights and
 * batch, compared into *rep (every rank gets the same report). MOE_ERR_MISMATCH (on every rank, with the
 * message) when outside the tolerances; the caller then applies the run's step (moe_trainer_apply) as usual.
 * Collective. */
moe_status moe_verify_step(moe_verifier *v, moe_trainer *run, int step, moe_step_result *r, moe_verify_report *rep);

/* One line: "verify step 3: loss 2.3456 vs 2.3455 (rel 4e-5) | norm ... | routing 99.8% | worst grad rel 1e-3
 * (model.layers.0....)". */
void moe_verify_report_print(const moe_verify_report *rep, FILE *f);

#endif
