/* checkpoint/write.c — a step directory's tensor files written by every rank at once, nobody gathering the model
 * (checkpoint/internal.h). The files are the ones a single process would write (checkpoint/safetensors_shards.h: one
 * file, or shards and an index, of the tensors in the table's order), byte for byte the same on any layout; only
 * who stores which bytes changes. Each tensor has one writer among the ranks that hold it: a dense (replicated)
 * tensor the rank with the fewest bytes so far, an expert the least loaded of its replicas (the ranks of its EP
 * rank), so the writing spreads over the ranks. World rank 0 creates the files at their final size; each writer
 * stores its tensors at their offsets (pwrite) and their CRC-32Cs reach rank 0 in one all-reduce; rank 0 writes the
 * headers and the indexes. A rank's memory for a save is one tensor (its weights downloaded from the runtime, or
 * its moments: under ZeRO-1 a dense tensor's moments are spread over the ranks and every rank takes the whole
 * tensor, all in the table's order) plus a conversion chunk. Every rank must see the directory: a file system all
 * ranks share (checked first: a rank that cannot read rank 0's token file is an error naming it). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fail.h"
#include "checkpoint/internal.h"
#include "models/fileio.h"
#include "checkpoint/safetensors_shards.h"

static const char kToken[] = ".ranks-see-this";

/* One set of files (the model, or the training state): its entries in file order, each with its tensor (in the
 * table; -1: a router's selection bias, which every rank holds), its moment (-1: the weights), its file, and its
 * byte offset there. */
typedef struct {
    const char *stem;
    moe_safetensors_entry *e;
    char (*names)[160];
    int *tensor, *moment, *file;
    size_t *offset;
    int count;
    int *first, shards; /* moe_safetensors_shard_split */
    const moe_safetensors_meta *meta;
    int num_meta;
} file_set;

/* The ranks that hold tensor t: every rank of its pipeline stage (dense), or of those the EP rank that holds its
 * expert in every replica (alltoall/parallel.h: stage = world_rank / stage_size, ep_rank = world_rank % ep). */
static int holds(const moe_checkpoint_run *run, const moe__ckpt_tensor *t, int world_rank) {
    if (world_rank / run->ranks.stage_size != t->stage) return 0;
    if (t->expert < 0) return 1;
    const int EL = run->config->moe.num_experts / run->ranks.ep_size;
    return world_rank % run->ranks.ep_size == t->expert / EL;
}

/* The rank that writes layer l's selection bias: the first of the stage that holds it (every rank of it has it). */
static int bias_writer(const moe_checkpoint_run *run, int layer) {
    return moe__checkpoint_stage_of(run, layer) * run->ranks.stage_size;
}

/* writer[i] of every tensor: among the ranks holding it, the one with the fewest bytes to write so far (ties: the
 * lowest rank). The same on every rank: sizes and the layout are all it reads. */
static int *plan_writers(const moe_checkpoint_run *run, const moe__ckpt_table *tab) {
    const int W = run->ranks.world_size;
    int *writer = malloc((size_t)(tab->count ? tab->count : 1) * sizeof *writer);
    double *load = calloc((size_t)W, sizeof *load);
    if (!writer || !load) return free(writer), free(load), NULL;
    for (int i = 0; i < tab->count; i++) {
        const moe__ckpt_tensor *t = &tab->t[i];
        int best = -1;
        for (int r = 0; r < W; r++)
            if (holds(run, t, r) && (best < 0 || load[r] < load[best])) best = r;
        writer[i] = best;
        load[best] += (double)t->count;
    }
    free(load);
    return writer;
}

static void set_free(file_set *s) {
    free(s->e), free(s->names), free(s->tensor), free(s->moment), free(s->file), free(s->offset), free(s->first);
    memset(s, 0, sizeof *s);
}

/* Room for n entries. */
static int set_alloc(file_set *s, int n) {
    s->e = calloc((size_t)n + 1, sizeof *s->e), s->names = calloc((size_t)n + 1, sizeof *s->names);
    s->tensor = calloc((size_t)n + 1, sizeof(int)), s->moment = calloc((size_t)n + 1, sizeof(int));
    s->file = calloc((size_t)n + 1, sizeof(int)), s->offset = calloc((size_t)n + 1, sizeof(size_t));
    s->first = calloc((size_t)n + 2, sizeof(int));
    return s->e && s->names && s->tensor && s->moment && s->file && s->offset && s->first;
}

static void set_add(file_set *s, const char *name, int ndim, const long *shape, moe_safetensors_dtype dtype,
                    int tensor, int moment) {
    const int k = s->count++;
    snprintf(s->names[k], sizeof s->names[k], "%s", name);
    s->e[k] = (moe_safetensors_entry){s->names[k], ndim, {shape[0], shape[1]}, NULL, dtype};
    s->tensor[k] = tensor, s->moment[k] = moment;
}

/* The split into files and every entry's offset in its file. */
static moe_status set_layout(file_set *s, size_t max_shard_nbytes) {
    s->shards = moe_safetensors_shard_split(s->e, s->count, max_shard_nbytes, s->first);
    for (int f = 0; f < s->shards; f++) {
        char name[160];
        moe_safetensors_shard_name(s->stem, f, s->shards, name, sizeof name);
        size_t start, size;
        const int a = s->first[f], n = s->first[f + 1] - a;
        MOE_TRY(moe_safetensors_layout(name, s->e + a, n, s->meta, s->num_meta, &start, s->offset + a, &size));
        for (int k = a; k < a + n; k++) s->file[k] = f;
    }
    return MOE_OK;
}

/* The model's weights: every tensor in table order, stored as asked (--save-dtype). */
static int model_set(const moe_checkpoint_run *run, const moe__ckpt_table *tab, file_set *s) {
    static const moe_safetensors_meta meta[] = {{"format", "pt"}};
    const moe_model_config *c = run->config;
    *s = (file_set){.stem = "model", .meta = meta, .num_meta = 1};
    if (!set_alloc(s, tab->count + c->num_layers)) return 0;
    for (int i = 0; i < tab->count; i++)
        set_add(s, tab->t[i].name, tab->t[i].ndim, tab->t[i].shape,
                run->save_dtype ? MOE_SAFETENSORS_BF16 : MOE_SAFETENSORS_F32, i, -1);
    char name[96];
    if (c->family == MOE_MODEL_FAMILY_DEEPSEEK_V3 && c->moe.score_func == MOE_SCORE_SIGMOID)
        for (int l = 0; l < c->num_layers; l++) /* its selection biases beside the weights (transformers', in F32) */
            if (moe_model_layer_is_moe(c, l)) {
                const long shape[2] = {c->moe.num_experts, 0};
                moe__checkpoint_hf_bias_name(l, name, sizeof name);
                set_add(s, name, 1, shape, MOE_SAFETENSORS_F32, -1, l);
            }
    return 1;
}

/* The training state: both moments of every tensor, then the routers' selection biases; a bf16 export keeps the
 * biases alone (under sigmoid routing) or nothing (count 0: no file). */
static int state_set(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const moe_safetensors_meta *meta, int num_meta,
                     file_set *s) {
    const moe_model_config *c = run->config;
    *s = (file_set){.stem = "train_state", .meta = meta, .num_meta = num_meta};
    if (!set_alloc(s, 2 * tab->count + c->num_layers)) return 0;
    char name[160];
    if (!run->save_dtype)
        for (int i = 0; i < tab->count; i++)
            for (int m = 0; m < 2; m++) {
                snprintf(name, sizeof name, "%s.%s", m ? "exp_avg_sq" : "exp_avg", tab->t[i].name);
                set_add(s, name, tab->t[i].ndim, tab->t[i].shape, MOE_SAFETENSORS_F32, i, m);
            }
    if (!run->save_dtype || c->moe.score_func == MOE_SCORE_SIGMOID)
        for (int l = 0; l < c->num_layers; l++)
            if (moe_model_layer_is_moe(c, l)) { /* held on one stage, listed on every rank */
                const long shape[2] = {c->moe.num_experts, 0};
                snprintf(name, sizeof name, "expert_bias.layers.%d", l);
                set_add(s, name, 1, shape, MOE_SAFETENSORS_F32, -1, l);
            }
    return 1;
}

/* This rank's values of table tensor t (its block of a tensor-parallel one), or of its moment `moment` (>= 0), into dst
 * on the host. */
static moe_status fetch_local(const moe_checkpoint_run *run, const moe__ckpt_tensor *t, int moment, moe_real *dst) {
    if (moment >= 0) return run->moment_range(run->owner, moment, (size_t)t->local_offset, t->local_count, dst);
    return moe_runtime_download(moe_model_runtime(run->model), dst, moe_model_params(run->model) + t->local_offset,
                                t->local_count * sizeof(moe_real));
}

/* Entry k's values into buf on the host (whoever stores it; collective for a ZeRO-sharded dense moment, and for a
 * tensor-parallel tensor over the tensor group, whose blocks are gathered into the whole). */
static moe_status fetch(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const file_set *s, int k, moe_real *buf) {
    if (s->tensor[k] < 0) { /* a selection bias: every rank's host copy */
        memcpy(buf, moe_model_expert_bias(run->model, s->moment[k]), (size_t)s->e[k].shape[0] * sizeof(moe_real));
        return MOE_OK;
    }
    const moe__ckpt_tensor *t = &tab->t[s->tensor[k]];
    if (t->split == MOE_SPLIT_NONE) return fetch_local(run, t, s->moment[k], buf);
    moe_comm *group = moe_parallel_tensor(run->par);
    const size_t copies = (size_t)moe_comm_size(group) / t->parts, n = t->local_count; /* ranks holding each block */
    moe_real *mine = malloc(n * sizeof(moe_real)), *blocks = malloc(copies * t->count * sizeof(moe_real));
    moe_status st = mine && blocks ? fetch_local(run, t, s->moment[k], mine) : MOE_ERR_OUT_OF_MEMORY;
    /* every rank of the group takes part, failed or not (the others would wait) */
    moe_status got = mine && blocks ? moe_comm_allgather_bytes(group, mine, n * sizeof(moe_real), blocks)
                                    : MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK) st = got;
    for (size_t p = 1; p < (size_t)t->parts && st == MOE_OK && copies > 1; p++) /* block p: from rank p x copies */
        memmove(blocks + p * n, blocks + p * copies * n, n * sizeof(moe_real));
    if (st == MOE_OK) moe__ckpt_whole_from_blocks(t, blocks, buf);
    free(mine), free(blocks);
    return st;
}

/* A collective fetch: a tensor-parallel tensor or its moments (every holder, over its tensor group); a moment under
 * ZeRO — a dense tensor's over its stage (every rank of it takes part), an expert tensor's over its
 * expert-data-parallel group: the ranks that hold it, in the table's order. */
static int collective(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const file_set *s, int k) {
    if (s->tensor[k] >= 0 && tab->t[s->tensor[k]].split != MOE_SPLIT_NONE) /* every holder: its tensor group */
        return tab->t[s->tensor[k]].local_offset >= 0;
    if (!run->moments_sharded || s->tensor[k] < 0 || s->moment[k] < 0) return 0;
    return tab->t[s->tensor[k]].local_offset >= 0;
}

static int writer_of(const moe_checkpoint_run *run, const file_set *s, const int *writer, int k) {
    return s->tensor[k] < 0 ? bias_writer(run, s->moment[k]) : writer[s->tensor[k]];
}

/* The first non-finite value of an entry, refused by name. */
static moe_status check_finite(const file_set *s, int k, const moe_real *v) {
    const size_t n = (size_t)s->e[k].shape[0] * (s->e[k].ndim > 1 ? (size_t)s->e[k].shape[1] : 1);
    for (size_t j = 0; j < n; j++)
        if (!isfinite(v[j]))
            return moe_fail(MOE_ERR_NONFINITE, "%s[%zu] is %g: refusing to save non-finite values", s->e[k].name, j,
                            (double)v[j]);
    return MOE_OK;
}

/* This rank's part of a set: each entry it writes, fetched and stored at its offset; crc[k] of those (0 elsewhere). */
static moe_status store_mine(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const int *writer, const char *dir,
                             file_set *s, moe_real *buf, double *crc) {
    const int me = run->ranks.world_rank;
    /* a DeepSeek-V2's file keeps RoPE's rows interleaved (transformers' V2 rotates pairs of adjacent rows) */
    const int interleave = run->config->family == MOE_MODEL_FAMILY_DEEPSEEK_V2 &&
                           moe_checkpoint_hf_computes(run->config, NULL, 0) && !strcmp(s->stem, "model");
    int fd = -1, open_file = -1;
    char *path = NULL;
    moe_status st = MOE_OK;
    for (int k = 0; k < s->count; k++) {
        const int mine = writer_of(run, s, writer, k) == me;
        moe_status got = MOE_OK;
        if (mine || collective(run, tab, s, k)) got = fetch(run, tab, s, k, buf);
        if (!mine || st != MOE_OK) { /* a failed rank still takes part in the collective fetches */
            if (got != MOE_OK && st == MOE_OK) st = got;
            continue;
        }
        if ((st = got) == MOE_OK) st = check_finite(s, k, buf);
        if (st == MOE_OK && interleave && s->tensor[k] >= 0)
            st = moe__checkpoint_reorder_rope_rows(run->config, &tab->t[s->tensor[k]], buf, 1);
        if (st == MOE_OK && open_file != s->file[k]) {
            if (fd >= 0 && (fsync(fd) != 0 || close(fd) != 0)) st = moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
            fd = -1, free(path);
            char name[160];
            moe_safetensors_shard_name(s->stem, s->file[k], s->shards, name, sizeof name);
            path = moe_path_join(dir, name), open_file = s->file[k];
            if (st == MOE_OK && (!path || (fd = open(path, O_WRONLY | O_CLOEXEC)) < 0))
                st = path ? moe_fail(MOE_ERR_IO, "%s: cannot open to write: %s", path, strerror(errno)) : MOE_ERR_OUT_OF_MEMORY;
        }
        uint32_t c = 0;
        moe_safetensors_entry e = s->e[k];
        e.data = buf;
        if (st == MOE_OK) st = moe_safetensors_store_at(path, fd, s->offset[k], &e, &c);
        crc[k] = c;
    }
    if (fd >= 0 && (fsync(fd) != 0 || close(fd) != 0) && st == MOE_OK)
        st = moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
    free(path);
    return st;
}

/* World rank 0: each file of the set created at its final size (before any rank stores into it). */
static moe_status create_files(const file_set *s, const char *dir) {
    for (int f = 0; f < s->shards && s->count; f++) {
        char name[160];
        moe_safetensors_shard_name(s->stem, f, s->shards, name, sizeof name);
        char *path = moe_path_join(dir, name);
        if (!path) return MOE_ERR_OUT_OF_MEMORY;
        const int last = s->first[f + 1] - 1;
        const size_t size = s->offset[last] + moe_safetensors_data_nbytes(&s->e[last], 1);
        const int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        const int ok = fd >= 0 && ftruncate(fd, (off_t)size) == 0;
        moe_status st = ok ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
        if (fd >= 0) close(fd);
        free(path);
        MOE_TRY(st);
    }
    return MOE_OK;
}

/* World rank 0: each file's header with every tensor's checksum, and the index of a set in shards. */
static moe_status finish_files(const file_set *s, const char *dir, const double *crc) {
    uint32_t *c = malloc(((size_t)s->count + 1) * sizeof *c);
    if (!c) return MOE_ERR_OUT_OF_MEMORY;
    for (int k = 0; k < s->count; k++) c[k] = (uint32_t)crc[k];
    moe_status st = MOE_OK;
    for (int f = 0; f < s->shards && s->count && st == MOE_OK; f++) {
        char name[160];
        moe_safetensors_shard_name(s->stem, f, s->shards, name, sizeof name);
        char *path = moe_path_join(dir, name);
        const int fd = path ? open(path, O_WRONLY | O_CLOEXEC) : -1;
        const int a = s->first[f];
        if (!path) st = MOE_ERR_OUT_OF_MEMORY;
        else if (fd < 0) st = moe_fail(MOE_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
        else st = moe_safetensors_write_header(path, fd, s->e + a, s->first[f + 1] - a, s->meta, s->num_meta, c + a);
        if (fd >= 0 && (fsync(fd) != 0 || close(fd) != 0) && st == MOE_OK)
            st = moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
        free(path);
    }
    if (st == MOE_OK && s->shards > 1) st = moe_safetensors_write_index(dir, s->stem, s->e, s->count, s->first, s->shards);
    free(c);
    return st;
}

/* Every rank reads rank 0's token in DIR: the directory is one they all see. */
static moe_status check_shared(const moe_checkpoint_run *run, const char *dir, moe_status st) {
    moe_comm *world = moe_parallel_world(run->par);
    char token[64] = "", seen[64] = "";
    if (run->ranks.world_rank == 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        snprintf(token, sizeof token, "%s %lld.%09ld %ld", run->run_id, (long long)ts.tv_sec, ts.tv_nsec, (long)getpid());
    }
    char *path = moe_path_join(dir, kToken);
    if (!path) st = MOE_ERR_OUT_OF_MEMORY;
    if (st == MOE_OK && run->ranks.world_rank == 0) {
        FILE *f = fopen(path, "wb");
        if (!f || fputs(token, f) < 0 || fclose(f) != 0) st = moe_fail(MOE_ERR_IO, "%s: %s", path, strerror(errno));
    }
    size_t *nbytes = calloc((size_t)run->ranks.world_size, sizeof(size_t));
    if (!nbytes) st = MOE_ERR_OUT_OF_MEMORY;
    else nbytes[0] = sizeof token;
    st = moe_comm_agree(world, st);
    if (st == MOE_OK) st = moe_comm_allgatherv_bytes(world, token, run->ranks.world_rank == 0 ? sizeof token : 0, seen, nbytes);
    free(nbytes);
    if (st == MOE_OK) {
        char got[64] = "";
        FILE *f = fopen(path, "rb");
        if (f) got[fread(got, 1, sizeof got - 1, f)] = 0, fclose(f);
        if (strcmp(got, seen)) {
            char host[256] = "?";
            gethostname(host, sizeof host - 1);
            st = moe_fail(MOE_ERR_IO, "world rank %d (host %s) does not see %s, which world rank 0 wrote: every rank "
                          "writes its part of a checkpoint, so --checkpoint-dir must be on a file system all ranks "
                          "share", run->ranks.world_rank, host, path);
        }
    }
    st = moe_comm_agree(world, st);
    if (run->ranks.world_rank == 0 && path) unlink(path);
    free(path);
    return st;
}

int moe__checkpoint_model_shards(const moe_checkpoint_run *run, const moe__ckpt_table *tab) {
    file_set s;
    const int made = model_set(run, tab, &s);
    const int shards = made ? moe_safetensors_shard_split(s.e, s.count, (size_t)run->save_shard_nbytes, s.first) : -1;
    set_free(&s);
    return shards;
}

moe_status moe__checkpoint_write_tensors(const moe_checkpoint_run *run, const moe__ckpt_table *tab, const char *dir,
                                         const moe_safetensors_meta *state_meta, int num_state_meta) {
    moe_comm *world = moe_parallel_world(run->par);
    const int rank0 = run->ranks.world_rank == 0;
    file_set sets[2];
    size_t largest = 1;
    for (int i = 0; i < tab->count; i++) largest = tab->t[i].count > largest ? tab->t[i].count : largest;
    if ((size_t)run->config->moe.num_experts > largest) largest = (size_t)run->config->moe.num_experts;
    int *writer = plan_writers(run, tab);
    moe_real *buf = malloc(largest * sizeof(moe_real));
    const int made_model = model_set(run, tab, &sets[0]), made_state = state_set(run, tab, state_meta, num_state_meta, &sets[1]);
    moe_status st = writer && buf && made_model && made_state ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int i = 0; i < 2 && st == MOE_OK; i++) st = set_layout(&sets[i], i == 0 ? (size_t)run->save_shard_nbytes : 0);
    if (st == MOE_OK && rank0)
        for (int i = 0; i < 2 && st == MOE_OK; i++) st = create_files(&sets[i], dir);
    st = check_shared(run, dir, st);
    double *crc[2] = {NULL, NULL};
    for (int i = 0; i < 2 && st == MOE_OK; i++) {
        if (!(crc[i] = calloc((size_t)sets[i].count + 1, sizeof(double)))) st = MOE_ERR_OUT_OF_MEMORY;
        st = moe_comm_agree(world, st);
        if (st == MOE_OK) st = store_mine(run, tab, writer, dir, &sets[i], buf, crc[i]);
        st = moe_comm_agree(world, st);
        /* each entry's checksum is its writer's: the sum over ranks is it (exact: below 2^32) */
        if (st == MOE_OK) st = moe_comm_allreduce_sum_f64(world, crc[i], (size_t)sets[i].count + 1);
    }
    if (st == MOE_OK && rank0)
        for (int i = 0; i < 2 && st == MOE_OK; i++) st = finish_files(&sets[i], dir, crc[i]);
    free(crc[0]), free(crc[1]), free(buf), free(writer);
    set_free(&sets[0]), set_free(&sets[1]);
    return st; /* rank 0's failure in finish_files: agreed by the caller */
}
