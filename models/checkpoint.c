/* checkpoint.c — saving and loading checkpoints (layout and format in checkpoint.h). */
#include "models/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "models/safetensors.h"
#include "core/fail.h"

_Static_assert(sizeof(moe_real) == sizeof(float), "checkpoints hold float32 parameters");

/* ---- the tensors of a model, in file order ---------------------------------------------------- */

typedef struct {
    char name[112];
    int ndim;
    long shape[2];
    int expert;           /* global expert id, or -1 for a dense tensor */
    size_t global_offset; /* in the global buffer [dense | all experts of every MoE layer] */
    long local_offset;    /* in this rank's buffer [dense | local experts], -1 if another rank holds it */
} ckpt_tensor;

typedef struct {
    ckpt_tensor *t;
    int count;
    size_t global_count; /* reals in the global buffer */
} ckpt_table;

static void add(ckpt_table *tab, const char *name, int ndim, long rows, long cols, int expert, size_t global_offset,
                long local_offset) {
    ckpt_tensor *t = &tab->t[tab->count++];
    *t = (ckpt_tensor){.ndim = ndim, .shape = {rows, cols}, .expert = expert, .global_offset = global_offset,
                       .local_offset = local_offset};
    snprintf(t->name, sizeof t->name, "%s", name);
}

/* The model's tensors (models/model.h) in file order — the embedding, then each layer's dense tensors followed
 * by its experts (every w1, then every w3, then every w2, by global id), then the final norm and lm_head —
 * with their places in the global buffer [dense | every MoE layer's w1 of all E experts, w3, w2]. */
static int build_table(const moe_trainer *tr, ckpt_table *tab) {
    const moe_model *m = tr->model;
    const moe_model_config *c = &tr->opt.model;
    const int E = c->moe.num_experts, EL = moe_model_num_local_experts(m), first = tr->ranks.ep_rank * EL;
    int count;
    const moe_model_tensor *mt = moe_model_tensors(m, &count);
    size_t *global_at = calloc((size_t)count, sizeof(size_t)), experts_at = moe_model_num_dense(m);
    tab->t = calloc((size_t)count * E + 1, sizeof(ckpt_tensor));
    if (!global_at || !tab->t) return free(global_at), 0;
    for (int i = 0; i < count; i++) /* the expert part of the global buffer is in the table's order */
        if (mt[i].experts) global_at[i] = experts_at, experts_at += (size_t)E * mt[i].rows * mt[i].cols;
    tab->count = 0;
    char name[sizeof tab->t->name];
    for (int layer = -1; layer <= c->num_layers; layer++)
        for (int experts = 0; experts < 2; experts++)
            for (int i = 0; i < count; i++) {
                const moe_model_tensor *t = &mt[i];
                if (t->layer != layer || !t->experts != !experts) continue;
                if (!experts) {
                    add(tab, t->name, t->ndim, t->rows, t->cols, -1, t->offset, (long)t->offset);
                    continue;
                }
                const size_t per_expert = (size_t)t->rows * t->cols;
                for (int j = 0; j < E; j++) {
                    snprintf(name, sizeof name, t->name, j);
                    const long local = j >= first && j < first + EL ? (long)(t->offset + (j - first) * per_expert) : -1;
                    add(tab, name, t->ndim, t->rows, t->cols, j, global_at[i] + j * per_expert, local);
                }
            }
    tab->global_count = experts_at;
    free(global_at);
    return 1;
}

/* ---- gathering and scattering the global buffer ----------------------------------------------- */

/* global[global_count] = dense part of `local`, plus every rank's experts (allgather over the EP group). */
static moe_status gather_global(const moe_trainer *tr, const moe_real *local, moe_real *global) {
    const moe_model *m = tr->model;
    const size_t dense = moe_model_num_dense(m);
    memcpy(global, local, dense * sizeof(moe_real));
    int count;
    const moe_model_tensor *t = moe_model_tensors(m, &count);
    moe_comm *ep = moe_parallel_ep(tr->par);
    const int R = moe_comm_size(ep);
    size_t *nbytes = malloc((size_t)R * sizeof(size_t)), at = dense;
    if (!nbytes) return MOE_ERR_OUT_OF_MEMORY;
    moe_status st = MOE_OK;
    for (int i = 0; i < count && st == MOE_OK; i++) {
        if (!t[i].experts) continue;
        for (int p = 0; p < R; p++) nbytes[p] = t[i].count * sizeof(moe_real);
        /* EP rank p holds global experts [p*EL, (p+1)*EL): rank order is expert order */
        st = moe_comm_allgatherv_bytes(ep, local + t[i].offset, nbytes[0], global + at, nbytes);
        at += t[i].count * R;
    }
    free(nbytes);
    return st;
}

/* Every rank agrees on the outcome of a step that only some ranks (or only rank 0) performed. */
static moe_status agree(const moe_trainer *tr, moe_status st) {
    return moe_comm_agree(moe_parallel_world(tr->par), st);
}

/* ---- config.json and the run fingerprint ------------------------------------------------------ */

static json_t *config_json(const moe_model_config *c) {
    const moe_config *q = &c->moe;
    int mixtral = c->moe_every == 1 && q->num_experts > 1 && q->score_func == MOE_SCORE_SOFTMAX && q->renormalize &&
                  q->capacity_factor <= 0;
    return json_pack(
        "{s:[s], s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:i, s:b, s:s, s:s, s:f, s:b, s:n, s:f,"
        " s:{s:i, s:s, s:b, s:f, s:s, s:f, s:f, s:b}}",
        "architectures", "MixtralForCausalLM", "model_type", "mixtral", "vocab_size", c->vocab_size, "hidden_size",
        c->d_model, "intermediate_size", c->d_ff, "num_hidden_layers", c->num_layers, "num_attention_heads",
        c->num_heads, "num_key_value_heads", c->num_kv_heads, "head_dim", c->d_model / c->num_heads,
        "max_position_embeddings", c->seq_len, "rms_norm_eps", (double)c->norm_eps, "rope_theta", (double)c->rope_theta,
        "num_local_experts", q->num_experts, "num_experts_per_tok", q->top_k, "tie_word_embeddings", c->tie_embeddings,
        "hidden_act", "silu", "torch_dtype", "float32", "router_aux_loss_coef", (double)q->aux_loss_coef,
        "output_router_logits", 0, "sliding_window", "attention_dropout", 0.0, "moe_train", "moe_every", c->moe_every,
        "score_func", q->score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax", "renormalize", q->renormalize,
        "capacity_factor", (double)q->capacity_factor, "drop_priority",
        q->drop_priority == MOE_DROP_BY_SCORE ? "score" : "token", "z_loss_coef", (double)q->z_loss_coef,
        "bias_update_rate", (double)q->bias_update_rate, "mixtral_compatible", mixtral);
}

/* Compares the architecture in DIR/config.json with the model; names the first field that differs. */
static moe_status check_config(const char *dir, const moe_model_config *c) {
    char path[600];
    snprintf(path, sizeof path, "%s/config.json", dir);
    json_error_t err;
    json_t *j = json_load_file(path, 0, &err);
    if (!j) return moe_fail(errno == ENOENT ? MOE_ERR_IO : MOE_ERR_BAD_FILE, "%s: %s", path, err.text);
    const struct { const char *key; long want; } ints[] = {
        {"vocab_size", c->vocab_size},         {"hidden_size", c->d_model},     {"intermediate_size", c->d_ff},
        {"num_hidden_layers", c->num_layers},  {"num_attention_heads", c->num_heads},
        {"num_key_value_heads", c->num_kv_heads}, {"num_local_experts", c->moe.num_experts},
        {"num_experts_per_tok", c->moe.top_k},
    };
    moe_status st = MOE_OK;
    for (size_t i = 0; i < sizeof ints / sizeof *ints && st == MOE_OK; i++) {
        json_t *v = json_object_get(j, ints[i].key);
        if (!json_is_integer(v))
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s is missing or not an integer", path, ints[i].key);
        else if (json_integer_value(v) != ints[i].want)
            st = moe_fail(MOE_ERR_BAD_FILE, "%s: %s is %lld but the flags ask for %ld", path, ints[i].key,
                          (long long)json_integer_value(v), ints[i].want);
    }
    json_t *tie = json_object_get(j, "tie_word_embeddings");
    if (st == MOE_OK && json_is_boolean(tie) && json_is_true(tie) != c->tie_embeddings)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: tie_word_embeddings is %s but the flags ask for %s", path,
                  json_is_true(tie) ? "true" : "false", c->tie_embeddings ? "tied" : "untied");
    /* the numbers that change the function the weights compute, beyond the shapes */
    json_t *theta = json_object_get(j, "rope_theta"), *eps = json_object_get(j, "rms_norm_eps"),
           *window = json_object_get(j, "sliding_window"), *act = json_object_get(j, "hidden_act");
    if (st == MOE_OK &&
        (!json_is_number(theta) || fabs(json_number_value(theta) - c->rope_theta) > 1e-6 * c->rope_theta))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: rope_theta is %g but the flags ask for %g (--rope-theta)", path,
                      json_is_number(theta) ? json_number_value(theta) : -1.0, (double)c->rope_theta);
    if (st == MOE_OK && (!json_is_number(eps) || fabs(json_number_value(eps) - c->norm_eps) > 1e-6 * c->norm_eps))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: rms_norm_eps is %g but this model uses %g", path,
                  json_is_number(eps) ? json_number_value(eps) : -1.0, (double)c->norm_eps);
    if (st == MOE_OK && !json_is_null(window) && window &&
        (!json_is_integer(window) || json_integer_value(window) < c->seq_len))
        st = moe_fail(MOE_ERR_BAD_FILE,
                      "%s: sliding_window %lld is shorter than the sequence length %d (no sliding "
                      "window attention here)",
                      path, json_is_integer(window) ? (long long)json_integer_value(window) : -1LL, c->seq_len);
    if (st == MOE_OK && act && (!json_is_string(act) || strcmp(json_string_value(act), "silu")))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: hidden_act must be silu (SwiGLU experts)", path);
    json_t *score = json_object_get(json_object_get(j, "moe_train"), "score_func");
    const char *want_score = c->moe.score_func == MOE_SCORE_SIGMOID ? "sigmoid" : "softmax";
    if (st == MOE_OK && json_is_string(score) && strcmp(json_string_value(score), want_score))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: the router was trained with %s scores but the flags ask for %s", path,
                  json_string_value(score), want_score);
    json_t *every = json_object_get(json_object_get(j, "moe_train"), "moe_every");
    long moe_every = json_is_integer(every) ? (long)json_integer_value(every) : 1; /* Mixtral: every layer */
    if (st == MOE_OK && moe_every != c->moe_every)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: moe_every is %ld but the flags ask for %d", path, moe_every, c->moe_every);
    json_decref(j);
    return st;
}

/* Everything that must match to continue a run: the architecture, routing, data order and seed. */
static void fingerprint(const moe_trainer *tr, char *out, size_t n) {
    const moe_model_config *c = &tr->opt.model;
    const moe_config *q = &c->moe;
    snprintf(out, n,
             "V=%d L=%d d=%d H=%d KV=%d F=%d S=%d E=%d k=%d every=%d tie=%d score=%d renorm=%d cf=%g prio=%d aux=%g "
             "z=%g bias_rate=%g invariant=%d batch=%d micro=%d seed=%d",
             c->vocab_size, c->num_layers, c->d_model, c->num_heads, c->num_kv_heads, c->d_ff, c->seq_len,
             q->num_experts, q->top_k, c->moe_every, c->tie_embeddings, q->score_func, q->renormalize,
             q->capacity_factor, q->drop_priority, q->aux_loss_coef, q->z_loss_coef, q->bias_update_rate,
             q->layout_invariant, tr->opt.batch, tr->opt.micro_batches, tr->opt.seed);
}

/* ---- files and directories -------------------------------------------------------------------- */

static int fsync_path(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    close(fd);
    return rc;
}

/* Removes a checkpoint directory: its files, then the directory (nothing recursive beyond that). */
static void remove_checkpoint_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *e;
    char path[1200];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
            unlink(path);
        }
    closedir(d);
    rmdir(dir);
}

static int is_step_dir(const char *name, long *step) {
    char *end;
    if (strncmp(name, "step-", 5) || strlen(name) != 13) return 0;
    *step = strtol(name + 5, &end, 10);
    return *end == 0 && *step >= 0;
}

/* The step directories of root, ascending. */
static long *list_steps(const char *root, int *count) {
    DIR *d = opendir(root);
    long *steps = NULL, step;
    int n = 0, cap = 0;
    struct dirent *e;
    while (d && (e = readdir(d)))
        if (is_step_dir(e->d_name, &step)) {
            if (n == cap) steps = realloc(steps, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *steps);
            steps[n++] = step;
        }
    if (d) closedir(d);
    for (int i = 1; i < n; i++) /* insertion sort: a handful of entries */
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--)
            step = steps[j], steps[j] = steps[j - 1], steps[j - 1] = step;
    *count = n;
    return steps;
}

moe_status moe_checkpoint_latest(const char *root, char *out, size_t out_nbytes) {
    int count;
    long *steps = list_steps(root, &count);
    moe_status st = count ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: no checkpoint (step-NNNNNNNN) to resume from", root);
    if (count) snprintf(out, out_nbytes, "%s/step-%08ld", root, steps[count - 1]);
    free(steps);
    return st;
}

static moe_status write_files(const moe_trainer *tr, const ckpt_table *tab, const moe_real *gp, const moe_real *gm,
                              const moe_real *gv, const char *dir, int step) {
    const moe_model_config *c = &tr->opt.model;
    char path[700], value[512];
    moe_safetensors_entry *e = calloc((size_t)2 * tab->count + c->num_layers, sizeof *e);
    char (*names)[128] = calloc((size_t)2 * tab->count + c->num_layers, sizeof *names);
    if (!e || !names) return free(e), free(names), MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < tab->count; i++) {
        const ckpt_tensor *t = &tab->t[i];
        e[i] = (moe_safetensors_entry){t->name, t->ndim, {t->shape[0], t->shape[1]}, gp + t->global_offset};
    }
    const moe_safetensors_meta model_meta[] = {{"format", "pt"}};
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    moe_status st = moe_safetensors_write(path, e, tab->count, model_meta, 1);

    json_t *config = config_json(c);
    snprintf(path, sizeof path, "%s/config.json", dir);
    if (st == MOE_OK && (json_dump_file(config, path, JSON_INDENT(2) | JSON_SORT_KEYS) != 0 || fsync_path(path) != 0))
        st = moe_fail(MOE_ERR_IO, "%s: cannot write", path);
    json_decref(config);

    int k = 0; /* train state: both moments of every tensor, then the routers' selection biases */
    for (int i = 0; i < tab->count; i++)
        for (int which = 0; which < 2; which++) {
            const ckpt_tensor *t = &tab->t[i];
            snprintf(names[k], sizeof names[k], "%s.%s", which ? "exp_avg_sq" : "exp_avg", t->name);
            e[k] = (moe_safetensors_entry){
                names[k], t->ndim, {t->shape[0], t->shape[1]}, (which ? gv : gm) + t->global_offset};
            k++;
        }
    for (int l = 0; l < c->num_layers; l++) {
        const moe_real *bias = moe_model_expert_bias(tr->model, l);
        if (!bias) continue;
        snprintf(names[k], sizeof names[k], "expert_bias.layers.%d", l);
        e[k++] = (moe_safetensors_entry){names[k - 1], 1, {c->moe.num_experts}, bias};
    }
    char step_text[32], position[32];
    snprintf(step_text, sizeof step_text, "%d", step);
    snprintf(position, sizeof position, "%ld", (long)step * tr->opt.micro_batches);
    fingerprint(tr, value, sizeof value);
    const moe_safetensors_meta state_meta[] = {
        {"format", "moe-train-state-1"}, {"step", step_text}, {"micro_batches_done", position}, {"fingerprint", value}};
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    if (st == MOE_OK) st = moe_safetensors_write(path, e, k, state_meta, 4);
    free(e), free(names);
    return st;
}

moe_status moe_checkpoint_save(moe_trainer *tr, const char *root, int step, int keep_last) {
    ckpt_table tab = {0};
    moe_real *g = NULL;
    moe_status st = build_table(tr, &tab) ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && !(g = malloc(3 * tab.global_count * sizeof(moe_real)))) st = MOE_ERR_OUT_OF_MEMORY;
    st = agree(tr, st);
    /* the moments in the unsharded local layout first (ZeRO-1 shards the dense part), then like the weights */
    const size_t local_count = moe_model_num_dense(tr->model) + moe_model_num_expert(tr->model);
    moe_real *full = st == MOE_OK ? malloc(local_count * sizeof(moe_real)) : NULL;
    if (st == MOE_OK && !full) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = gather_global(tr, moe_model_params(tr->model), g);
    for (int which = 0; which < 2 && st == MOE_OK; which++) {
        st = moe_trainer_moments_gather(tr, which, full);
        if (st == MOE_OK) st = gather_global(tr, full, g + (1 + which) * tab.global_count);
    }
    free(full);
    if (st == MOE_OK && tr->ranks.world_rank == 0) {
        char tmp[600], final[600], old[600];
        snprintf(tmp, sizeof tmp, "%s/.tmp-step-%08d", root, step);
        snprintf(final, sizeof final, "%s/step-%08d", root, step);
        snprintf(old, sizeof old, "%s/.old-step-%08d", root, step);
        mkdir(root, 0755);
        remove_checkpoint_dir(tmp); /* the leftovers of an interrupted save */
        if (mkdir(tmp, 0755) != 0) st = moe_fail(MOE_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
        if (st == MOE_OK)
            st = write_files(tr, &tab, g, g + tab.global_count, g + 2 * tab.global_count, tmp, step);
        if (st == MOE_OK && fsync_path(tmp) != 0) st = moe_fail(MOE_ERR_IO, "%s: fsync failed", tmp);
        /* the new directory takes the final name in one rename; an older save of the same step goes after */
        if (st == MOE_OK && rename(final, old) != 0 && errno != ENOENT)
            st = moe_fail(MOE_ERR_IO, "%s: cannot move aside: %s", final, strerror(errno));
        if (st == MOE_OK && rename(tmp, final) != 0)
            st = moe_fail(MOE_ERR_IO, "%s: cannot rename to %s: %s", tmp, final, strerror(errno));
        if (st == MOE_OK) {
            remove_checkpoint_dir(old);
            fsync_path(root);
            int count;
            long *steps = list_steps(root, &count);
            for (int i = 0; keep_last > 0 && i < count - keep_last; i++) {
                snprintf(old, sizeof old, "%s/step-%08ld", root, steps[i]);
                remove_checkpoint_dir(old);
            }
            free(steps);
        } else {
            remove_checkpoint_dir(tmp);
        }
    }
    free(g), free(tab.t);
    return agree(tr, st);
}

/* ---- loading ---------------------------------------------------------------------------------- */

/* Reads the table's tensors (named prefix + name) that this rank holds into dst; checks every tensor of
 * the table exists with its shape and F32, and that the file has no tensor the model does not know. */
static moe_status read_tensors(moe_safetensors_file *f, const ckpt_table *tab, const char *prefix, moe_real *dst,
                               int extra_ok) {
    char name[160];
    for (int i = 0; i < tab->count; i++) {
        const ckpt_tensor *t = &tab->t[i];
        snprintf(name, sizeof name, "%s%s", prefix, t->name);
        moe_status st;
        if (t->local_offset >= 0) {
            st = moe_safetensors_read(f, name, t->ndim, t->shape, dst + t->local_offset);
        } else {
            const moe_safetensors_tensor *s = moe_safetensors_find(f, name);
            int same =
                s && s->ndim == t->ndim && s->shape[0] == t->shape[0] && (t->ndim < 2 || s->shape[1] == t->shape[1]);
            st = same && !strcmp(s->dtype, "F32") ? MOE_OK : moe_safetensors_read(f, name, t->ndim, t->shape, NULL);
        }
        if (st != MOE_OK) return st;
    }
    for (int i = 0; i < f->num_tensors && !extra_ok; i++) {
        const char *have = f->tensors[i].name;
        int known = 0;
        for (int j = 0; j < tab->count && !known; j++) {
            snprintf(name, sizeof name, "%s%s", prefix, tab->t[j].name);
            known = !strcmp(name, have);
        }
        if (!known)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: unexpected tensor %s (a different model, or wrong names)", f->path,
                            have);
    }
    return MOE_OK;
}

static moe_status load_weights(moe_trainer *tr, const ckpt_table *tab, const char *dir) {
    char path[600];
    moe_safetensors_file f;
    moe_status st = check_config(dir, &tr->opt.model);
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    if (st == MOE_OK && (st = moe_safetensors_open(path, &f)) == MOE_OK) {
        st = read_tensors(&f, tab, "", moe_model_params(tr->model), 0);
        moe_safetensors_close(&f);
    }
    return st;
}

moe_status moe_checkpoint_load_weights(moe_trainer *tr, const char *dir) {
    ckpt_table tab = {0};
    moe_status st = build_table(tr, &tab) ? load_weights(tr, &tab, dir) : MOE_ERR_OUT_OF_MEMORY;
    free(tab.t);
    return agree(tr, st);
}

static moe_status load_state(moe_trainer *tr, const ckpt_table *tab, const char *dir, int *step) {
    const moe_model_config *c = &tr->opt.model;
    char path[600], want[512], name[64];
    moe_safetensors_file f;
    snprintf(path, sizeof path, "%s/train_state.safetensors", dir);
    moe_status st = moe_safetensors_open(path, &f);
    if (st != MOE_OK) return st;
    const char *format = moe_safetensors_metadata(&f, "format"), *fp = moe_safetensors_metadata(&f, "fingerprint"),
               *saved = moe_safetensors_metadata(&f, "step");
    fingerprint(tr, want, sizeof want);
    if (!format || strcmp(format, "moe-train-state-1") || !saved)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: not a moe-train training state", path);
    else if (!fp || strcmp(fp, want))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: training state from another run: saved for [%s], this run is [%s]", path,
                      fp ? fp : "?", want);
    const size_t local_count = moe_model_num_dense(tr->model) + moe_model_num_expert(tr->model);
    moe_real *full = malloc(local_count * sizeof(moe_real)); /* unsharded local layout (ZeRO-1 keeps a range) */
    if (!full) st = MOE_ERR_OUT_OF_MEMORY;
    for (int which = 0; which < 2 && st == MOE_OK; which++) {
        st = read_tensors(&f, tab, which ? "exp_avg_sq." : "exp_avg.", full, 1);
        if (st == MOE_OK) moe_trainer_moments_set(tr, which, full);
    }
    free(full);
    for (int l = 0; l < c->num_layers && st == MOE_OK; l++) {
        moe_real *bias = moe_model_expert_bias(tr->model, l);
        long E = c->moe.num_experts;
        snprintf(name, sizeof name, "expert_bias.layers.%d", l);
        if (bias) st = moe_safetensors_read(&f, name, 1, &E, bias);
    }
    if (st == MOE_OK) *step = atoi(saved);
    moe_safetensors_close(&f);
    return st;
}

moe_status moe_checkpoint_resume(moe_trainer *tr, const char *dir, int *step) {
    ckpt_table tab = {0};
    moe_status st = build_table(tr, &tab) ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = load_weights(tr, &tab, dir);
    if (st == MOE_OK) st = load_state(tr, &tab, dir, step);
    free(tab.t);
    return agree(tr, st);
}
