/* tensors.h — inside models/ only: the tensor table of the layers a model holds, the views into a buffer laid out by
 * it, and the stage (the chunks of layers a model holds, models/model.h). */
#ifndef MOE_MODELS_TENSORS_H
#define MOE_MODELS_TENSORS_H

#include "models/model_internal.h"

/* The shape symbols of model.h's tensor lists, and model_activations.h's BK. */
typedef struct {
    long d, A, B, F, DF, E; /* DF: the dense FFN layers' width (moe_model_dense_d_ff) */
    long BK;
    long QN, KN; /* the q and k norms' widths (MOE_MODEL_QK_NORM_TENSORS) */
    long SF;     /* the shared expert's width (MOE_MODEL_SHARED_TENSORS; 0: none) */
    long QL, KLR, KL, HNV, HV; /* multi-head latent attention's (MOE_MODEL_MLA_*_TENSORS) */
} model_dims;
model_dims moe__model_dims(const moe_model *m);

/* The stage's chunks and ends, checked: MOE_ERR_INVALID_CONFIG with a message for chunks outside the model or
 * overlapping, or no pass. */
moe_status moe__model_set_stage(moe_model *m, const moe_model_stage *stage);
/* The chunk that holds `layer` (-1, the embedding: chunk 0; num_layers, the final norm and lm_head: the last chunk),
 * or -1 when this model holds none of it. */
int moe__model_chunk_of(const moe_model *m, int layer);
int moe__model_holds_layer(const moe_model *m, int layer);
/* Whether chunk c starts with the embedding / ends with the head. */
int moe__model_chunk_embeds(const moe_model *m, int c);
int moe__model_chunk_heads(const moe_model *m, int c);
/* Every layer this model holds, ascending: for (FIRST_LAYER(m, c, l); l >= 0; l = moe__model_next_layer(m, &c, l)). */
#define FIRST_LAYER(m, c, l) int c = 0, l = (m)->first[0]
int moe__model_next_layer(const moe_model *m, int *c, int l);

/* The most tensors a table of cfg holds. */
int moe__model_max_tensors(const moe_model_config *cfg);
/* Every tensor this model holds in buffer order into m->tensors (or, with m->tensors NULL, only counted), and
 * num_dense / num_expert. */
void moe__model_lay_out(moe_model *m);
/* Each chunk's slices of the two regions, from the table. */
void moe__model_find_chunk_slices(moe_model *m);
/* Points the views of one buffer (params or grads; with zg ZeRO-2's gradients) at the tensors. */
void moe__model_set_views(moe_model *m, moe_real *base, const moe_zero_grads *zg, moe_model_views *v);
/* The GEMMs' views (m->c): p's, with the dense GEMM weights moved into m->compute when there is one. */
void moe__model_set_compute_views(moe_model *m);
/* The bf16 copies and the weights' version, when the parameters changed since the last forward. */
moe_status moe__model_refresh_compute_weights(moe_model *m);

#endif
