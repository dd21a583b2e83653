/* train.c — moe-train: trains the MoE language model (models/model.h) on llm.c token files under mpirun.
 *
 *   mpirun -np N moe-train --train-data data/kjv_train.bin --val-data data/kjv_val.bin [flags]
 *
 * Each rank reads its slice of every global batch (train/dataloader.h), runs forward and backward
 * (tokens travel to the experts' ranks inside the MoE layers), gradients are summed over their groups,
 * clipped by the global norm and applied with AdamW (train/trainer.h). Rank 0 prints one line per
 * step and writes the JSON-lines metrics. A bad flag or data file stops every rank with a message; a
 * failure inside a step aborts the job (MPI_Abort) instead of leaving ranks waiting. */
#include <errno.h>
#include <math.h>
#include <mpi.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "alltoall/parallel_mpi.h"
#include "alltoall/wait_policy.h"
#include "core/fail.h"
#include "core/threads.h"
#include "checkpoint/checkpoint.h"
#include "core/cpu_target.h"
#include "kernels/gemm_engine.h"
#include "train/checkpoint_run.h"
#include "train/rank_agreement.h"
#include "train/output_paths.h"
#include "train/run_record.h"
#include "train/config.h"
#include "train/device.h"
#include "train/signals.h"
#include "train/startup_watchdog.h"
#include "pipeline/grid.h"
#include "pipeline/schedule.h"
#include "train/trainer.h"
#include "train/verify.h"
#include "moe/dense_ops_fault.h"

static double now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* The other ranks may be waiting inside a collective: end the whole job. */
static void require(moe_status st, const char *what) {
    if (st == MOE_OK) return;
    int rank;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    fprintf(stderr, "moe-train: rank %d: %s failed: %s\n", rank, what, moe_failure_message(st));
    MPI_Abort(MPI_COMM_WORLD, 1);
}

/* min and max of load / mean load over every (MoE layer, expert), and the coefficient of variation */
static void load_balance(const moe_model_config *m, const double *tokens, double *lo, double *hi, double *cv) {
    const int E = m->moe.num_experts;
    double sum = 0, sum_sq = 0;
    int n = 0;
    *lo = INFINITY, *hi = 0;
    for (int l = 0; l < m->num_layers; l++) {
        if (!moe_model_layer_is_moe(m, l)) continue;
        double mean = 0;
        for (int e = 0; e < E; e++) mean += tokens[l * E + e] / E;
        for (int e = 0; e < E && mean > 0; e++) {
            double ratio = tokens[l * E + e] / mean;
            *lo = fmin(*lo, ratio), *hi = fmax(*hi, ratio), sum += ratio, sum_sq += ratio * ratio, n++;
        }
    }
    if (!n) *lo = *hi = 1;
    double mean = n ? sum / n : 1;
    *cv = n ? sqrt(fmax(0, sum_sq / n - mean * mean)) / mean : 0;
}

/* ,"key":value into a metrics record, null where the value is not finite (a dropped step's loss or norm: "inf" and
 * "nan" made the line invalid JSON, a probe) */
static void json_number(FILE *metrics, const char *key, const char *format, double value) {
    fprintf(metrics, ",\"%s\":", key);
    if (isfinite(value)) fprintf(metrics, format, value);
    else fputs("null", metrics);
}

/* Rank 0: the step's line, and its metrics record. -1 when the metrics file could not be written (a full disk), -2
 * when the step's line found no reader (stdout a pipe whose reader is gone: `| head`, or a `| tee` that a job's stop
 * ended first): the caller stops the run (after a checkpoint where the disk allows) rather than train on without its
 * log. */
static int log_step(const moe_train_options *o, FILE *metrics, int step, const moe_step_result *r, double ms,
                    double val, double eval_ms) {
    const moe_model_config *m = &o->model;
    const double tokens_per_s = (double)o->batch * o->micro_batches * m->seq_len / (ms / 1e3);
    double lo, hi, cv;
    load_balance(m, r->expert_tokens, &lo, &hi, &cv);
    printf("step %5d | loss %.4f | aux %.4f | z %.3f | lr %.2e | norm %.3f | %7.1f ms | %8.0f tok/s | load %.2f-%.2f "
           "cv %.3f | drop %.2f%%",
           step, r->loss, r->aux, r->z, r->lr, r->grad_norm, ms, tokens_per_s, lo, hi, cv, 100 * r->drop_fraction);
    if (val >= 0) printf(" | val %.4f", val);
    if (printf("\n") < 0 && errno == EPIPE) return -2;
    if (!metrics) return 0;
    fprintf(metrics, "{\"step\":%d", step);
    json_number(metrics, "loss", "%.17g", r->loss);
    json_number(metrics, "aux_loss", "%.6f", r->aux);
    json_number(metrics, "z_loss", "%.6f", r->z);
    json_number(metrics, "lr", "%.6e", r->lr);
    json_number(metrics, "grad_norm", "%.6f", r->grad_norm);
    json_number(metrics, "ms", "%.3f", ms);
    json_number(metrics, "tokens_per_s", "%.1f", tokens_per_s);
    json_number(metrics, "load_min", "%.4f", lo);
    json_number(metrics, "load_max", "%.4f", hi);
    json_number(metrics, "load_cv", "%.4f", cv);
    json_number(metrics, "drop_fraction", "%.6f", r->drop_fraction);
    if (val >= 0) fprintf(metrics, ",\"val_loss\":%.17g,\"eval_ms\":%.3f", val, eval_ms);
    moe_run_record_clock(metrics);
    if (r->skipped) fprintf(metrics, ",\"skipped\":true");
    fprintf(metrics, ",\"expert_tokens\":[");
    for (int l = 0, first = 1; l < m->num_layers; l++) {
        if (!moe_model_layer_is_moe(m, l)) continue;
        fprintf(metrics, "%s{\"layer\":%d,\"tokens\":[", first ? "" : ",", l);
        for (int e = 0; e < m->moe.num_experts; e++)
            fprintf(metrics, "%s%.0f", e ? "," : "", r->expert_tokens[l * m->moe.num_experts + e]);
        fprintf(metrics, "]}");
        first = 0;
    }
    fprintf(metrics, "]}\n");
    return fflush(metrics) != 0 || ferror(metrics) ? -1 : 0;
}

/* "N shard(s) from SPEC[ (M shorter than one sequence: no window)], W windows" of a data set: the files as given (cut
 * at 60 bytes), so that a log says which data it trained and validated on (a probe: the default validation file was
 * used beside another corpus, unsaid); prepare_data.py's last shard may hold no window. */
static const char *describe_data(const moe_token_data *d, const char *given, char out[256]) {
    int empty = 0;
    for (int i = 0; i < moe_token_data_num_shards(d); i++) empty += moe_token_data_shard(d, i).num_windows == 0;
    char note[64] = "";
    if (empty) snprintf(note, sizeof note, " (%d shorter than one sequence: no window)", empty);
    snprintf(out, 256, "%d shard(s) from %.60s%s%s, %lld windows", moe_token_data_num_shards(d), given,
             strlen(given) > 60 ? "..." : "", note, (long long)moe_token_data_num_windows(d));
    return out;
}

/* Where evaluation reads fewer sequences than --eval-batches global batches ask: how many of the validation file's
 * windows it reads (all, or the most that are a multiple of the data-parallel ranks; before, "all the validation file
 * holds" was said of 2 of its 3: a probe); 0 when none short. */
static int eval_shortfall(const moe_trainer *t, char *out, size_t n) {
    const moe_train_options *o = &t->opt;
    const long seqs = moe_trainer_eval_sequences(t), want = moe_trainer_eval_wanted(t);
    const long windows = (long)moe_token_data_num_windows(t->val);
    if (seqs >= want) return 0;
    char why[96] = "";
    if (seqs < windows) snprintf(why, sizeof why, ", a multiple of the %d data-parallel ranks", t->ranks.dp_size);
    char micro[48] = "";
    if (o->micro_batches > 1) snprintf(micro, sizeof micro, " x --micro-batches %d", o->micro_batches);
    snprintf(out, n, "%ld distinct sequences%s the validation file's %ld windows%s (--eval-batches %d x --batch %d%s "
             "asks for %ld)", seqs, seqs == windows ? ", all" : " of", windows, why, o->eval_batches, o->batch, micro,
             want);
    return 1;
}

/* MOE_TEST_FAULT=<dense entry>: that entry of the run's dense table (not the --verify-steps reference's) does
 * its work twice (moe/dense_ops_fault.h): how the tests prove that --verify-steps catches a wrong op and names
 * the tensor it writes. */
static void inject_test_fault(moe_trainer *t) {
    static moe_dense_ops faulty;
    moe_dense_state *state;
    const char *entry = getenv("MOE_TEST_FAULT");
    if (!entry || !*entry) return;
    require(moe_dense_ops_with_fault(moe_model_dense_ops(t->model, &state), entry, &faulty), "MOE_TEST_FAULT");
    moe_model_replace_dense_ops(t->model, &faulty);
    if (t->ranks.world_rank == 0) printf("moe-train: MOE_TEST_FAULT: the run's %s does its work twice\n", entry);
}

/* One step of --verify-steps: computed, checked against the CPU reference (rank 0 prints the report), then
 * applied. MOE_ERR_MISMATCH (rank 0 says why) when outside the tolerances: the step is not applied. */
static moe_status verified_step(moe_verifier *v, moe_trainer *t, int step, moe_step_result *r) {
    moe_verify_report rep;
    moe_status st = moe_verify_step(v, t, step, r, &rep);
    const int rank0 = t->ranks.world_rank == 0;
    if (rank0 && (st == MOE_OK || st == MOE_ERR_MISMATCH)) moe_verify_report_print(&rep, stdout);
    if (st == MOE_ERR_MISMATCH && rank0) fprintf(stderr, "moe-train: --verify-steps: %s\n", moe_failure_message(st));
    return st == MOE_OK ? moe_trainer_apply(t, step, r) : st;
}

/* A failure every rank agreed on (a bad checkpoint, a failed save): each says what it knows; the caller cleans up
 * and exits with the status returned, every rank through MPI_Finalize. A timeout or an MPI error was not agreed on: the
 * rank that gave up on an exchange has left the others inside it, or in the next one, where MPI_Finalize's own wait
 * for them would last as long as their limit (--checkpoint-timeout, an hour by default): that rank ends the job. */
static int report_failure(const moe_trainer *t, const char *what, moe_status st) {
    fprintf(stderr, "moe-train: rank %d: %s: %s\n", t->ranks.world_rank, what, moe_failure_message(st));
    if (st == MOE_ERR_TIMEOUT || st == MOE_ERR_COMM) {
        fflush(stdout), fflush(stderr);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return 2;
}

/* --resume / --init-from; *first_step gets the first step to run. */
static moe_status restore(moe_trainer *t, const moe_train_options *o, int *first_step) {
    int done = 0;
    if (*o->resume) {
        char *dir = NULL;
        if (strcmp(o->resume, "latest")) dir = strdup(o->resume);
        else MOE_TRY(moe_checkpoint_latest(o->checkpoint_dir, &dir, t->notes));
        moe_status st = dir ? moe_checkpoint_resume(moe_trainer_checkpoint_run(t), dir, &done) : MOE_ERR_OUT_OF_MEMORY;
        if (st == MOE_OK) snprintf(t->source_dir, sizeof t->source_dir, "%s", dir);
        if (st == MOE_OK && t->ranks.world_rank == 0)
            printf("resumed from %s after step %d (run %s%s%s)\n", dir, done, t->run_id,
                   *t->parent_run_id ? ", continued from run " : "", t->parent_run_id);
        if (st == MOE_OK && t->ranks.world_rank == 0 && *t->data_note) printf("%s\n", t->data_note);
        free(dir);
        MOE_TRY(st);
        if (done == o->steps && t->ranks.world_rank == 0)
            printf("the run is complete at step %d (--steps %d): nothing to train\n", done, o->steps);
    } else if (*o->init_from) {
        MOE_TRY(moe_checkpoint_load_weights(moe_trainer_checkpoint_run(t), o->init_from));
        snprintf(t->source_dir, sizeof t->source_dir, "%s", o->init_from);
        if (t->ranks.world_rank == 0) printf("weights from %s\n", o->init_from);
    }
    *first_step = done + 1;
    return MOE_OK;
}

static int eval_only(moe_trainer *t, const moe_train_options *o, FILE *metrics) {
    double val = 0, t0 = now_ms();
    require(moe_trainer_evaluate(t, &val), "validation");
    if (metrics) {
        fprintf(metrics, "{\"record\":\"eval\",\"val_loss\":%.17g,\"eval_ms\":%.3f", val, now_ms() - t0);
        moe_run_record_clock(metrics);
        fprintf(metrics, "}\n");
    }
    const size_t count = (size_t)o->model.seq_len * o->model.vocab_size;
    moe_real *logits = *o->dump_logits ? malloc(count * sizeof(moe_real)) : NULL;
    if (*o->dump_logits) require(logits ? moe_trainer_validation_logits(t, logits) : MOE_ERR_OUT_OF_MEMORY, "logits");
    if (t->ranks.world_rank == 0) {
        char shortfall[256];
        printf("eval: val_loss %.9f over %ld tokens", val, moe_trainer_eval_sequences(t) * o->model.seq_len);
        if (eval_shortfall(t, shortfall, sizeof shortfall)) printf(" (%s)", shortfall);
        printf("\n");
        FILE *f = logits ? fopen(o->dump_logits, "wb") : NULL;
        const int written = f && fwrite(logits, sizeof(moe_real), count, f) == count;
        if (f && fclose(f) != 0) f = NULL;
        if (logits && (!f || !written)) {
            fprintf(stderr, "moe-train: cannot write %s: %s\n", o->dump_logits, strerror(errno));
            free(logits);
            return 2;
        }
    }
    free(logits);
    return 0;
}

/* What a rank's host memory holds: the run's model on the CPU, and --verify-steps' CPU reference beside it (which the
 * start-up line printed without until 2026-12-07: 1.6x below the peak, a probe). */
static int host_copies(const moe_train_options *o) {
    return (o->device == MOE_TRAIN_DEVICE_CPU) + (o->verify_steps > 0);
}

static moe_train_memory host_memory(const moe_train_options *o, int world_size) {
    moe_train_memory need = moe_train_options_memory(o, world_size);
    need.params *= host_copies(o), need.activations *= host_copies(o);
    need.moments *= o->device == MOE_TRAIN_DEVICE_CPU;
    if (o->device != MOE_TRAIN_DEVICE_CPU) need.process = MOE_TRAIN_PROCESS_BYTES; /* the sums run on the GPU */
    need.total = need.params + need.moments + need.activations + need.process;
    return need;
}

/* The address space a rank maps beyond its memory estimate, at the least: the libraries, thread stacks, allocator
 * arenas, MPI's segments and one OpenBLAS buffer of 128 MiB. Under an address-space limit (ulimit -v) OpenBLAS
 * retries a buffer it cannot map forever: a probe, 2026-12-08, the default model (an estimate of 425 MiB, a VmPeak of
 * 1.08 GiB at 2 threads, 2.14 at 16) hung at 600-800 MB, ran out of memory at 1,000 MB, trained at 1,500 MB. Threads
 * add arenas and stacks, but a small model at 16 threads peaked at 1.03 GiB: not charged per thread, so that no run
 * that fits is refused (a review: 128 MiB a thread refused it). */
static double address_space_beyond_estimate(void) { return 640.0 * (1 << 20); }

/* Refuses, on every rank alike, a configuration whose estimated memory (train/options.h) times the ranks sharing this
 * machine exceeds its physical memory, or a rank's address-space limit: better a sentence now than the kernel's OOM
 * killer after minutes of initialisation, or a hang. On the host: the run's model on the CPU, and --verify-steps' CPU
 * reference beside it (weights, gradients, activations; no optimizer). Returns 0 when it fits. */
static int refuse_oversized(const moe_train_options *o, int world_size) {
    const int copies = host_copies(o);
    const moe_train_memory need = host_memory(o, world_size);
    MPI_Comm node;
    int node_ranks = 1, node_rank = 0;
    if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_size(node, &node_ranks);
        MPI_Comm_rank(node, &node_rank);
        MPI_Comm_free(&node);
    }
    const double have = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE), gib = 1024.0 * 1024 * 1024;
    int too_big = have > 0 && need.total * node_ranks > have;
    struct rlimit space;
    const double mapped = need.total + address_space_beyond_estimate();
    const int limited = getrlimit(RLIMIT_AS, &space) == 0 && space.rlim_cur != RLIM_INFINITY &&
                        (double)space.rlim_cur < mapped;
    if (limited && !too_big && node_rank == 0)
        fprintf(stderr, "moe-train: the address-space limit (ulimit -v) is %.0f MiB per process; this run maps at "
                "least %.0f MiB (its memory estimate, %.0f MiB, with libraries, stacks, MPI and an OpenBLAS buffer), "
                "and below that OpenBLAS waits forever for a buffer: raise it (ulimit -v unlimited, or at least %.0f "
                "KiB), or use a smaller model\n", (double)space.rlim_cur / gib * 1024,
                mapped / gib * 1024, need.total / gib * 1024, mapped / 1024);
    int any = too_big || limited;
    MPI_Allreduce(MPI_IN_PLACE, &any, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    /* the ways out this configuration has not taken already (a probe: "--zero 1 or 2" to a run at --zero 2) */
    char ways[160];
    snprintf(ways, sizeof ways, "%s%s", o->zero < 2 ? (o->zero ? ", --zero 2" : ", --zero 1 or 2") : "",
             o->model.moe.recompute < MOE_RECOMPUTE_FULL ? ", --recompute full" : "");
    if (too_big && node_rank == 0) /* one message per machine that cannot hold its ranks */
        fprintf(stderr, "moe-train: this configuration needs about %.1f GiB per rank (weights and gradients %.1f, "
                "AdamW moments %.1f, activations %.1f GiB%s, the process %.1f), %d rank(s) on this machine: more than "
                "its %.1f GiB. Use fewer or smaller experts (--experts, --d-ff), a smaller --batch%s, or more "
                "machines\n",
                need.total / gib, need.params / gib, need.moments / gib, need.activations / gib,
                copies > 1 ? "; the run's model and --verify-steps' CPU reference" : "", need.process / gib, node_ranks,
                have / gib, ways);
    return any;
}

/* --print-config: a --config file that reproduces this run, derived values as "auto" (so that flags given beside the
 * file re-derive them as on a fresh command line), and on stderr which those are and what they are here. */
/* --print-schedule: every pipeline stage's steps (pipeline/schedule.h), and the forwards each keeps in flight. */
static int print_schedule(const moe_train_options *o) {
    const moe_pp_shape shape = {o->pp, o->virtual_stages, o->micro_batches};
    for (int s = 0; s < o->pp; s++) {
        moe_pp_step *steps;
        int count;
        const moe_status st = moe_pp_schedule(&shape, s, &steps, &count);
        if (st != MOE_OK) return fprintf(stderr, "moe-train: %s\n", moe_failure_message(st)), -1;
        printf("stage %d of %d (%d virtual stage(s) each, %d micro-batches): %d steps, at most %d forwards in flight\n",
               s, o->pp, o->virtual_stages, o->micro_batches, count, moe_pp_schedule_max_in_flight(steps, count));
        moe_pp_schedule_print(stdout, steps, count);
        free(steps);
    }
    return 0;
}

static int print_config(const moe_train_options *o) {
    json_t *j = moe_train_options_json(o, 1);
    int failed = !j || json_dumpf(j, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER | MOE_JSON_FLOATS) != 0;
    /* a configuration file cut short must not look written (a probe, 2026-12-07: > /dev/full exited 0, empty) */
    if (printf("\n") < 0 || fflush(stdout) != 0 || ferror(stdout))
        failed = 1, fprintf(stderr, "moe-train: --print-config: the standard output cannot be written: %s\n",
                            strerror(errno));
    json_decref(j);
    int count, shown = 0;
    const moe_train_option *table = moe_train_option_table(&count);
    char value[64];
    for (int i = 0; i < count; i++) {
        if (!o->derived[i]) continue;
        moe_train_option_format(o, &table[i], 0, value, sizeof value);
        fprintf(stderr, "%s%s %s", shown++ ? ", " : "moe-train: --print-config: derived, written \"auto\": ",
                moe_train_option_key(&table[i]), value);
    }
    if (shown) fprintf(stderr, "\n");
    return failed ? -1 : 0;
}

/* Rank 0: the metrics file, opened and begun with the run record; NULL without --log-file. */
static FILE *open_metrics(const moe_trainer *t, int world_size, const char *device) {
    FILE *metrics = NULL;
    char kept[4096 + 16] = "";
    const int keeping = *t->opt.log_file ? moe_train_keep_previous(t->opt.log_file, kept, sizeof kept) : 0;
    if (keeping < 0) {
        fprintf(stderr, "moe-train: --log-file %s holds an earlier log, which could not be kept%s%s: %s\n",
                t->opt.log_file, *kept ? " as " : "", kept, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (keeping) printf("note: --log-file %s held an earlier log: kept as %s\n", t->opt.log_file, kept);
    /* appended: the file is new or empty here, or a link the log goes through (/dev/stdout into a `>> out.txt`) */
    if (*t->opt.log_file && !(metrics = fopen(t->opt.log_file, "a"))) {
        fprintf(stderr, "moe-train: cannot write the metrics file '%s': %s\n", t->opt.log_file, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    if (metrics && moe_run_record_write(metrics, t, world_size, device) != 0) {
        fprintf(stderr, "moe-train: cannot write the metrics file '%s': %s\n", t->opt.log_file, strerror(errno));
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    return metrics;
}

/* What ends a run before its last step, agreed by every rank at a step boundary: the first watched signal any rank
 * received (train/signals.h), and rank 0's failure to write an output (the metrics log, the routing trace). */
typedef struct {
    int signo, log_failed;
} stop_request;

/* Through the world's communicator, under the exchange watchdog (a rank stopped here is named, not waited for): per
 * signal number the ranks that received it, and the ranks whose output failed; the lowest signal any rank got wins. */
static stop_request agree_on_stop(moe_trainer *t, int log_failed) {
    enum { SIGNALS = 32 };
    double counts[SIGNALS + 1] = {0};
    const int signo = moe_train_signal_received();
    if (signo > 0 && signo < SIGNALS) counts[signo] = 1;
    counts[SIGNALS] = log_failed;
    require(moe_comm_allreduce_sum_f64(moe_parallel_world(t->par), counts, SIGNALS + 1),
            "agreeing on a stop at the step boundary");
    stop_request stop = {0, counts[SIGNALS] > 0};
    for (int s = 1; s < SIGNALS && !stop.signo; s++) stop.signo = counts[s] > 0 ? s : 0;
    return stop;
}

/* stop for moe_trainer_sample: a stop signal, agreed by every rank (each token's one all-reduce beside a forward) */
typedef struct {
    moe_trainer *t;
    int signo; /* the agreed signal, 0 while none */
} sample_watch;

static int sample_stop(void *arg) {
    sample_watch *w = arg;
    moe_train_signals_boundary(1); /* no GEMM runs here: a signal may arrive (train/signals.h) */
    w->signo = agree_on_stop(w->t, 0).signo;
    moe_train_signals_boundary(0);
    return w->signo;
}

/* The sample after training, on rank 0's stdout. Returns 0, or 128 + N when signal N stopped it (what was sampled
 * printed first: a SIGTERM during a long sample was ignored and the job exited 0, a probe). */
static int print_sample(moe_trainer *t) {
    const moe_train_options *o = &t->opt;
    int n = 0, max_n = (int)strlen(o->sample_prompt) + o->sample_tokens + 1;
    int *text = calloc((size_t)max_n, sizeof(int));
    if (!text) require(MOE_ERR_OUT_OF_MEMORY, "sampling");
    /* a prompt's bytes are its tokens: one given with a byte past the vocabulary is refused (train/options.c); the
     * default one ("And God said") is replaced, said so (before: its bytes were taken modulo the vocabulary) */
    int past = 0; /* (only the default's can be: options.c) */
    for (const char *c = o->sample_prompt; *c; c++) past |= (unsigned char)*c >= o->model.vocab_size;
    const int start = '\n' < o->model.vocab_size ? '\n' : 0; /* an empty prompt's token (a newline, or token 0) */
    if (past && t->ranks.world_rank == 0)
        printf("sample: the default prompt holds bytes past --vocab %d: sampling from %s instead (give "
               "--sample-prompt)\n", o->model.vocab_size, start ? "a newline" : "token 0");
    for (const char *c = o->sample_prompt; *c && !past; c++) text[n++] = (unsigned char)*c;
    if (n == 0) text[n++] = start;
    const int want = n + o->sample_tokens;
    sample_watch watch = {t, 0};
    require(moe_trainer_sample(t, text, &n, want, o->sample_temperature, (unsigned long long)o->seed + 7, sample_stop,
                               &watch), "sampling");
    if (t->ranks.world_rank == 0) {
        printf("sample (temperature %g):\n---\n", o->sample_temperature);
        for (int i = 0; i < n; i++) putchar(text[i] < 128 && (text[i] >= 32 || text[i] == '\n') ? text[i] : '?');
        printf("\n---\n");
        if (watch.signo)
            printf("moe-train: %s: sampling stopped after %d of %d tokens; exit status %d\n",
                   moe_train_signal_name(watch.signo), o->sample_tokens - (want - n), o->sample_tokens,
                   128 + watch.signo);
    }
    free(text);
    return watch.signo ? 128 + watch.signo : 0;
}

/* With --pp: each stage's time per step and how much of it was spent waiting for its neighbours (the bubble and
 * the imbalance), over the steps after the first (which holds one-time costs), on rank 0's stdout: the waiting
 * against the work, beside the schedule's bubble (p - 1) / m (idle slots per busy slot). Collective over the
 * pipeline. */
static void report_pipeline(moe_trainer *t, const double first[2], int steps) {
    moe_comm *pipeline = moe_parallel_pipeline(t->par);
    const int P = moe_comm_size(pipeline), m = t->opt.micro_batches;
    if (P == 1 || steps < 1) return;
    double mine[2] = {(t->runner.step_s - first[0]) / steps * 1e3, (t->runner.wait_s - first[1]) / steps * 1e3};
    double *all = calloc((size_t)2 * P, sizeof(double));
    size_t *nbytes = calloc(P, sizeof(size_t));
    if (!all || !nbytes) return free(all), free(nbytes);
    for (int p = 0; p < P; p++) nbytes[p] = sizeof mine;
    require(moe_comm_allgatherv_bytes(pipeline, mine, sizeof mine, all, nbytes), "the pipeline's timings");
    if (t->ranks.world_rank == 0) {
        /* Every stage starts a step together (the last one ended in sums over the pipeline) and waits at its end
         * for the slowest: a stage's idle time is its waits inside the schedule plus the tail from its last step
         * to the slowest stage's end, so that waiting + work = the pipeline's step on every stage. */
        double pipeline_ms = 0;
        for (int p = 0; p < P; p++) pipeline_ms = all[2 * p] > pipeline_ms ? all[2 * p] : pipeline_ms;
        const int V = t->opt.virtual_stages;
        printf("pipeline: %d stages x %d micro-batches (%s), per step over the last %d steps:", P, m,
               V > 1 ? "interleaved 1F1B" : "1F1B", steps);
        for (int p = 0; p < P; p++) { /* idle against busy: what (p - 1) / (V m) predicts */
            const double busy = all[2 * p] - all[2 * p + 1], idle = pipeline_ms - busy;
            printf("%s stage %d %.1f ms, waiting %.1f ms (%.1f%% of its %.1f ms of work)", p ? ";" : "", p, pipeline_ms,
                   idle, busy > 0 ? 100 * idle / busy : 0, busy);
        }
        printf("; waiting includes the tail after a stage's last step; the schedule's bubble (p - 1) / (V m) = %.1f%%\n",
               100.0 * (P - 1) / ((double)V * m));
    }
    free(all), free(nbytes);
}

/* After the first step on a GPU (world rank 0): the GEMMs pinned on cuBLASLt for its products (MOE_LINEAR_GEMM=lt),
 * one line each on stdout and a gemm record in the metrics log; nothing where none is. 0, or -1 when the metrics log
 * could not take it. */
static int report_pinned_gemms(const moe_train_placement *place, FILE *metrics, int step) {
    const int len = moe_train_gpu_gemms(place, NULL, 0);
    char *lines = len > 0 ? malloc((size_t)len + 1) : NULL;
    if (!lines) return 0; /* none, or no memory for a report */
    moe_train_gpu_gemms(place, lines, (size_t)len + 1);
    for (const char *p = lines; *p;) {
        const size_t n = strcspn(p, "\n");
        printf("gemm: %.*s\n", (int)n, p);
        p += n + (p[n] == '\n');
    }
    const int failed = metrics ? moe_run_record_gemms(metrics, step, lines) : 0;
    free(lines);
    return failed;
}

/* The steps from first_step on, with their evaluations, logs and checkpoints. Returns the exit status: 0 at the end;
 * 3 when --verify-steps found a step outside its tolerances; 128 + N when signal N stopped the run (after a
 * checkpoint, with --checkpoint-dir); 2 when the metrics log could not be written, a save failed, the validation data
 * held a bad window (after the step's checkpoint), or --max-skipped-steps consecutive steps were dropped. A checkpoint
 * due at a dropped step waits for the next step that updates, but at the run's end (below, `ends`). */
static int train(moe_trainer *t, const moe_train_options *o, const moe_train_placement *place, moe_verifier *verifier,
                 FILE *metrics, int first_step, moe_step_result *r) {
    const int rank0 = t->ranks.world_rank == 0;
    int skipped_in_a_row = 0, save_waiting = 0;
    double pipeline_first[2] = {0, 0}; /* the runner's times after the first step */
    for (int step = first_step; step <= o->steps; step++) {
        double t0 = now_ms(), val = -1;
        moe_status st;
        moe_gpu_counters before, after; /* on a GPU: the step's host waits and allocations (issue 50, item 4) */
        const int on_gpu = moe_train_gpu_counters(place, &before);
        require(moe_train_profile_mark(place, step, 1), "MOE_PROFILE_STEPS");
        if (verifier && step < first_step + o->verify_steps) {
            if ((st = verified_step(verifier, t, step, r)) == MOE_ERR_MISMATCH) return 3;
            require(st, "training step (verified)");
        } else {
            require(moe_trainer_step(t, step, r), "training step");
        }
        require(moe_train_profile_mark(place, step, 0), "MOE_PROFILE_STEPS");
        double ms = now_ms() - t0;
        if (on_gpu && rank0 && (step < first_step + 3 || step == o->steps)) {
            char counts[512];
            moe_train_gpu_counters(place, &after);
            moe_gpu_counters_delta_text(&after, &before, counts, sizeof counts);
            printf("step %5d on the GPU: %s\n", step, counts);
            if (step == first_step && report_pinned_gemms(place, metrics, step) != 0 && !t->output_error[0])
                snprintf(t->output_error, sizeof t->output_error, "the metrics log %s: %s", o->log_file,
                         strerror(errno));
        }
        if (step == first_step) pipeline_first[0] = t->runner.step_s, pipeline_first[1] = t->runner.wait_s;
        if (r->skipped && rank0)
            fprintf(stderr, "moe-train: step %d skipped (--skip-nonfinite): %s\n", step,
                    moe_failure_message(MOE_ERR_NONFINITE));
        skipped_in_a_row = r->skipped ? skipped_in_a_row + 1 : 0;
        double eval_t0 = now_ms();
        moe_status eval_st = MOE_OK;
        if (step == o->steps || (o->eval_interval > 0 && step % o->eval_interval == 0)) {
            /* bad validation data (found as it is read, agreed by every rank: the rank that read it has the file's
             * failure, the others MOE_ERR_PEER) loses nothing: the step's checkpoint is saved below, then the run stops
             * (a probe: found at the last step, it ended the job before its save) */
            eval_st = moe_trainer_evaluate(t, &val);
            if (eval_st != MOE_ERR_BAD_FILE && eval_st != MOE_ERR_PEER) require(eval_st, "validation");
            if (eval_st != MOE_OK) val = -1;
        }
        moe_train_signals_boundary(1); /* the computation is over: a stop signal may arrive (train/signals.h) */
        const double eval_ms = now_ms() - eval_t0;
        const int logged = rank0 && !t->output_error[0] ? log_step(o, metrics, step, r, ms, val, eval_ms) : 0;
        if (logged == -2) snprintf(t->output_error, sizeof t->output_error, "the standard output: its reader is gone");
        else if (logged) snprintf(t->output_error, sizeof t->output_error, "the metrics log %s: %s", o->log_file,
                                  strerror(errno));
        const stop_request stop = agree_on_stop(t, t->output_error[0] != 0);
        if (skipped_in_a_row >= o->max_skipped_steps) {
            if (rank0)
                fprintf(stderr, "moe-train: %d steps in a row were dropped as non-finite (--max-skipped-steps %d): the "
                        "run no longer learns; stopping without a checkpoint of them (the last one saved stays the "
                        "newest)\n", skipped_in_a_row, o->max_skipped_steps);
            return 2;
        }
        /* a save due at a dropped step waits for the next step that updates, but for the run's end: the state is exact
         * (the last applied update's weights and moments, the data position after this step), and waiting for a step
         * that never comes lost every step since the last save (a probe, 2026-12-07: steps 1-5 applied, 6 dropped,
         * nothing saved, exit 0) */
        const int ends = step == o->steps || stop.signo || stop.log_failed || eval_st != MOE_OK;
        const int due = ends || (o->checkpoint_interval > 0 && step % o->checkpoint_interval == 0);
        if (*o->checkpoint_dir && (due || save_waiting)) {
            if (r->skipped && !ends) {
                if (rank0 && !save_waiting)
                    printf("moe-train: step %d's update was dropped: its checkpoint waits for the next step that "
                           "updates\n", step);
                save_waiting = 1;
            } else {
                if (r->skipped && rank0)
                    printf("moe-train: step %d's update was dropped, and the run ends here: its checkpoint holds the "
                           "last applied update's weights\n", step);
                const double save_t0 = now_ms();
                st = moe_checkpoint_save(moe_trainer_checkpoint_run(t), o->checkpoint_dir, step, o->keep_last);
                if (stop.signo) moe_train_signals_block_output(); /* saved: the last messages may wait for a reader */
                if (st != MOE_OK) {
                    if (stop.log_failed && t->output_error[0]) /* the stop's cause first (both on one full disk) */
                        fprintf(stderr, "moe-train: cannot write %s; stopping after step %d with a save, which "
                                "failed too:\n", t->output_error, step);
                    return report_failure(t, "checkpoint save failed (earlier checkpoints are intact)", st);
                }
                save_waiting = 0;
                if (rank0) printf("checkpoint: %s/step-%08d saved in %.2f s\n", o->checkpoint_dir, step,
                                  (now_ms() - save_t0) / 1e3);
            }
        }
        const char *saved = *o->checkpoint_dir ? " (the checkpoint above has it)"
                                               : " (no --checkpoint-dir: nothing saved)";
        if (eval_st != MOE_OK) {
            if (eval_st != MOE_ERR_PEER)
                fprintf(stderr, "moe-train: rank %d: validation failed: %s\n", t->ranks.world_rank,
                        moe_failure_message(eval_st));
            if (rank0) fprintf(stderr, "moe-train: bad validation data: stopped after step %d%s\n", step, saved);
            return 2;
        }
        if (stop.log_failed) {
            if (rank0)
                fprintf(stderr, "moe-train: cannot write %s; stopped after step %d%s\n", t->output_error, step, saved);
            return 2;
        }
        if (stop.signo) {
            moe_train_signals_block_output();
            if (rank0)
                printf("moe-train: %s: stopped after step %d of %d%s; exit status %d\n",
                       moe_train_signal_name(stop.signo), step, o->steps,
                       !*o->checkpoint_dir ? " (no --checkpoint-dir: nothing saved)"
                       : o->save_dtype     ? ", bf16 export saved (--save-dtype bf16: --init-from takes it, --resume "
                                             "does not)"
                                           : ", checkpoint saved",
                       128 + stop.signo);
            return 128 + stop.signo;
        }
        moe_train_signals_boundary(0);
    }
    report_pipeline(t, pipeline_first, o->steps - first_step);
    return 0;
}

int main(int argc, char **argv) {
    /* a line at a time: under mpirun stdout is a pipe (else buffered until exit), and a rank that mpirun kills after
     * another rank's failure must not take its last lines with it */
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* a write to a pipe without a reader, or past the file-size limit (ulimit -f), fails with EPIPE or EFBIG, said
     * and stopped at with a save, instead of killing the process mid-step or mid-save (a probe, 2026-12-07: a job's
     * stop ended its `| tee` first, and the SIGPIPE of the stop's message ended the run before its save) */
    signal(SIGPIPE, SIG_IGN);
    signal(SIGXFSZ, SIG_IGN);
    /* the open-file limit as high as the process may set it: a sharded checkpoint's load keeps every shard open */
    struct rlimit files;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != files.rlim_max) {
        files.rlim_cur = files.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &files); /* not raised: a load past it says so */
    }
    moe_run_record_start();
    moe_startup_watchdog_start(argc, argv);
    /* funneled: threads beside the main one (the start-up watchdog, the data reader of train/batch_reader.h, OpenMP's)
     * never call MPI; Open MPI gives at least that, and an MPI_Init failure aborts under MPI's default handler */
    int thread_level = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &thread_level);
    int world_rank, world_size;
    MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world_size);
    moe_train_options opt;
    /* every rank parses the same argv; rank 0 alone reports, all ranks stop together */
    int parsed = moe_train_options_load(argc, argv, world_size, &opt, world_rank == 0 ? stderr : NULL,
                                        world_rank == 0 ? stdout : NULL);
    int parsed_on_rank0 = parsed; /* a command line refused here and not on rank 0 (which alone reports): said here,
                                   * before the agreement lets rank 0 end the job */
    MPI_Bcast(&parsed_on_rank0, 1, MPI_INT, 0, MPI_COMM_WORLD);
    if (parsed < 0 && parsed_on_rank0 >= 0) {
        fprintf(stderr, "moe-train: rank %d's command line:\n", world_rank);
        moe_train_options_load(argc, argv, world_size, &opt, stderr, NULL);
    }
    parsed = moe_train_options_agree(parsed, &opt, MPI_COMM_WORLD, world_rank == 0 ? stderr : NULL);
    if (parsed == 0) moe_startup_watchdog_rearm(opt.startup_timeout_s, opt.exchange_timeout_s);
    if (parsed == 0 && opt.print_config && world_rank == 0) parsed = print_config(&opt);
    if (parsed == 0 && opt.print_schedule && world_rank == 0) parsed = print_schedule(&opt);
    if (parsed != 0 || opt.print_config || opt.print_schedule) {
        MPI_Finalize();
        return parsed >= 0 ? 0 : 2;
    }
    char why[512];
    if (world_rank == 0 && !moe_checkpoint_hf_computes(&opt.model, why, sizeof why))
        printf("note: not a %s (%s): checkpoints are labelled " MOE_CHECKPOINT_VARIANT ", not %s "
               "(docs/CHECKPOINTS.md)\n", opt.model.family == MOE_MODEL_FAMILY_MIXTRAL ? "Mixtral"
               : moe_checkpoint_hf_class(opt.model.family), why, moe_checkpoint_hf_class(opt.model.family));
    const int threads_asked = opt.threads != 0;
    if (opt.threads == 0) opt.threads = moe_threads_default();
    moe_threads_set(opt.threads);
    char advice[512];
    if (world_rank == 0 && moe_threads_advice(opt.threads, threads_asked, advice, sizeof advice))
        printf("%s\n", advice);
    /* the host holds the model on the CPU, and the CPU reference of --verify-steps on any device */
    if ((opt.device == MOE_TRAIN_DEVICE_CPU || opt.verify_steps > 0) && refuse_oversized(&opt, world_size)) {
        MPI_Finalize();
        return 2;
    }
    /* what each rank's environment names, agreed: the CPU GEMM library (MOE_CPU_GEMM: a node without it stops the
     * job, not itself alone) and the wait policy (MOE_WAIT_POLICY: one rank's bad value, read inside the placement,
     * left the others waiting there until the start-up alarm, the reason unsaid: a probe, 2026-12-07) */
    moe_wait_policy policy;
    for (int i = 0; i < 2; i++) { /* one at a time: each failure's message is reported before the next check */
        const moe_status st = moe_train_agree(MPI_COMM_WORLD, i == 0 ? moe_gemm_engine_available()
                                                                     : moe_wait_policy_here(&policy));
        if (st != MOE_OK) {
            moe_train_report_agreed_failure(st, i == 0 ? "the CPU GEMM library" : "the wait policy", MPI_COMM_WORLD);
            MPI_Finalize();
            return 2;
        }
    }
    moe_train_placement place;
    moe_status st = moe_train_place(&opt, MPI_COMM_WORLD, world_rank == 0 ? stdout : NULL, &place);
    if (st != MOE_OK) { /* every rank agreed: each message once, then all stop */
        moe_train_report_agreed_failure(st, "placement", MPI_COMM_WORLD);
        MPI_Finalize();
        return 2;
    }
    moe_startup_watchdog_stop();
    moe_trainer t;
    st = moe_trainer_create(&t, &opt, place.rt, place.par);
    if (st == MOE_ERR_BAD_FILE || st == MOE_ERR_IO || st == MOE_ERR_PEER) { /* a data file or a trace */
        moe_train_report_agreed_failure(st, "cannot start", MPI_COMM_WORLD);
        moe_train_unplace(&place);
        MPI_Finalize();
        return 2;
    }
    require(st, "model set-up");
    char train_data[256], val_data[256];
    if (world_rank == 0 && t.train)
        printf("data: train %s of %d + 1 tokens, %s; val %s; opened in %.3f s\n",
               describe_data(t.train, opt.train_data, train_data), opt.model.seq_len,
               opt.shuffle ? "shuffled (a permutation per epoch, seeded by --seed)" : "in order",
               describe_data(t.val, opt.val_data, val_data), t.data_open_s);
    else if (world_rank == 0) /* --eval-only: no training data */
        printf("data: val %s of %d + 1 tokens; opened in %.3f s\n", describe_data(t.val, opt.val_data, val_data),
               opt.model.seq_len, t.data_open_s);
    int first_step = 1;
    t.notes = world_rank == 0 ? stderr : NULL;
    moe_checkpoint_lock *lock = NULL;
    FILE *metrics = NULL;
    moe_parallel *ref_par = NULL; /* --verify-steps: the CPU fp32 reference's own layout of the same ranks */
    moe_verifier verifier;
    moe_step_result r = {0};
    int rc = 0;
    if ((st = restore(&t, &opt, &first_step)) != MOE_OK) {
        rc = report_failure(&t, "cannot load the checkpoint", st);
        goto done;
    }
    if (!opt.eval_only && first_step - 1 > opt.steps) { /* loaded, and past the run's end (not a load failure) */
        rc = report_failure(&t, "--resume", moe_fail(MOE_ERR_INVALID_CONFIG, "the checkpoint is at step %d, beyond "
                                                     "--steps %d: nothing to train (raise --steps to continue)",
                                                     first_step - 1, opt.steps));
        goto done;
    }
    if (*opt.checkpoint_dir && !opt.eval_only &&
        (st = moe_checkpoint_prepare(moe_trainer_checkpoint_run(&t), opt.checkpoint_dir, first_step - 1, &lock)) !=
            MOE_OK) {
        rc = report_failure(&t, "before training", st);
        goto done;
    }
    const char *device = place.rt ? moe_runtime_name(place.rt) : "cpu";
    metrics = world_rank == 0 ? open_metrics(&t, world_size, device) : NULL;
    if (opt.eval_only) {
        rc = eval_only(&t, &opt, metrics);
        goto done;
    }
    if (world_rank == 0) {
        moe_train_options_print(&opt, stdout);
        moe_rank_grid grid;
        if (moe_rank_grid_make(world_size, opt.pp, opt.ep, opt.tp, 0, &grid) == MOE_OK)
            moe_rank_grid_print(stdout, &grid);
        const moe_model_stage *stage = moe_model_stage_of(t.model);
        printf("world %d ranks x %d threads on %s: pp %d x ep %d x expert-data-parallel %d; %zu dense + %zu expert "
               "parameters per rank of stage 0 (%d chunk(s) of %d layers from layer %d, %d forwards of each in "
               "flight), about %.1f MiB of memory per rank%s (an estimate, on the high side)\n",
               world_size, moe_threads_get(), device, opt.pp, t.ranks.ep_size, t.ranks.edp_size,
               moe_model_num_dense(t.model), moe_model_num_expert(t.model), stage->chunks, stage->num_layers,
               stage->first_layer, moe_model_num_passes(t.model),
               (opt.device == MOE_TRAIN_DEVICE_CPU ? host_memory(&opt, world_size)
                                                   : moe_train_options_memory(&opt, world_size)).total /
                   (1024.0 * 1024),
               host_copies(&opt) > 1 ? " with --verify-steps' CPU reference" : "");
        if (!place.rt) /* which GEMM library on which CPU, and how bf16 GEMMs run (MOE_BF16_GEMM) */
            printf("cpu GEMMs: %s; CPU %s\n", moe_gemm_library(), moe_cpu_model());
        moe_wait_policy wait;
        if (moe_wait_policy_here(&wait) == MOE_OK && wait == MOE_WAIT_PASSIVE)
            printf("MOE_WAIT_POLICY=passive: a rank waiting for its peers sleeps between polls\n");
        char shortfall[256];
        if (eval_shortfall(&t, shortfall, sizeof shortfall)) printf("validation: %s\n", shortfall);
    }
    if (opt.verify_steps > 0) {
        require(moe_parallel_create_mpi_tp(MPI_COMM_WORLD, opt.pp, opt.ep, opt.tp, opt.exchange_timeout_s, &ref_par),
                "the reference's layout (--verify-steps)");
        require(moe_verifier_create(&verifier, &t, ref_par), "the CPU fp32 reference (--verify-steps)");
    }
    inject_test_fault(&t);
    r.expert_tokens = calloc((size_t)opt.model.num_layers * opt.model.moe.num_experts, sizeof(double));
    if (!r.expert_tokens) require(MOE_ERR_OUT_OF_MEMORY, "statistics");
    if (moe_train_signals_watch(opt.stop_signals, why, sizeof why))
        require(moe_fail(MOE_ERR_INVALID_CONFIG, "%s", why), "--stop-signals");
    rc = train(&t, &opt, &place, ref_par ? &verifier : NULL, metrics, first_step, &r);
    if (rc == 0 && opt.sample_tokens > 0) rc = print_sample(&t);
done:
    if (ref_par) moe_verifier_destroy(&verifier), moe_parallel_destroy(ref_par);
    if (metrics) fclose(metrics);
    free(r.expert_tokens);
    moe_checkpoint_unlock(lock);
    moe_trainer_destroy(&t);
    moe_train_unplace(&place);
    MPI_Finalize();
    return rc;
}
