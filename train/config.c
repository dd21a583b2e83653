/* train/config.c — moe-train's configuration from its sources (flags, --config file, a checkpoint's config.json
 * and saved run) and as JSON (train/config.h).
 *   from train/options.h: the flag table, setting an option from text with its source, the final checks
 *   from checkpoint.h:    config.json as a model config, the fields that define a model, the newest checkpoint
 *   from fileio.h:        opening the files (a --config file, a checkpoint's manifest.json with the saved run) */
#include "train/config.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/fail.h"
#include "checkpoint/checkpoint.h"
#include "models/fileio.h"
#include "models/optimizer.h"
#include "train/machine.h"
#include "train/option_notes.h"

/* The JSON documents whose strings the options point into: alive for the process, never freed (reachable). */
static json_t **kept;
static size_t num_kept;

static int keep(json_t *j) {
    json_t **more = realloc(kept, (num_kept + 1) * sizeof *kept);
    if (!more) return json_decref(j), -1;
    kept = more, kept[num_kept++] = j;
    return 0;
}

json_t *moe_train_options_json(const moe_train_options *o, int derived_as_auto) {
    json_t *j = json_object();
    int count;
    const moe_train_option *table = moe_train_option_table(&count);
    for (int i = 0; i < count && j; i++) {
        const moe_train_option *s = &table[i];
        const void *field = (const char *)o + s->offset;
        if (s->scope == MOE_OPT_SCOPE_FLAG_ONLY) continue;
        json_t *v;
        if (moe_train_option_undecided(o, s) || (derived_as_auto && o->derived[i]))
            v = json_string("auto");
        else if (s->kind == MOE_OPT_INT) v = json_integer(*(const int *)field);
        else if (s->kind == MOE_OPT_FLOAT) v = moe_json_float(*(const float *)field);
        else if (s->kind == MOE_OPT_STRING) v = json_string(*(const char *const *)field);
        else v = json_string(s->choices[*(const int *)field]);
        if (json_object_set_new(j, moe_train_option_key(s), v)) json_decref(j), j = NULL;
    }
    /* the command as given: a requeued job's saved configuration must say auto again (a review: it said "") */
    if (j && derived_as_auto && o->resume_auto && json_object_set_new(j, "resume", json_string("auto")))
        json_decref(j), j = NULL;
    return j;
}

static const moe_train_option *find_key(const char *key) {
    int count;
    const moe_train_option *table = moe_train_option_table(&count);
    for (int i = 0; i < count; i++)
        if (!strcmp(moe_train_option_key(&table[i]), key)) return &table[i];
    return NULL;
}

/* v as the text moe_train_option_set reads, or NULL with *want set to the type s needs */
static const char *value_text(const moe_train_option *s, json_t *v, char *buf, size_t n, const char **want) {
    if (json_is_string(v) && moe_train_option_has_auto(s) && !strcmp(json_string_value(v), "auto")) return "auto";
    switch (s->kind) {
    case MOE_OPT_INT:
        *want = "an integer";
        if (!json_is_integer(v)) return NULL;
        snprintf(buf, n, "%" JSON_INTEGER_FORMAT, json_integer_value(v));
        return buf;
    case MOE_OPT_FLOAT:
        *want = "a number";
        if (!json_is_number(v)) return NULL;
        snprintf(buf, n, "%.17g", json_number_value(v));
        return buf;
    case MOE_OPT_STRING:
        *want = "a string";
        return json_string_value(v);
    case MOE_OPT_CHOICE:
        *want = "a string";
        return json_string_value(v);
    }
    return NULL;
}

int moe_train_options_apply_json(moe_train_options *o, json_t *j, moe_option_source source, const char *what,
                                 FILE *err) {
    if (!json_is_object(j)) return moe_train_complain(err, "moe-train: %s: not a JSON object of options\n", what), -1;
    const char *key;
    json_t *v;
    char label[1024], buf[64];
    json_object_foreach(j, key, v) {
        const moe_train_option *s = find_key(key);
        if (!s && source == MOE_OPTION_SAVED_RUN) continue;
        if (!s)
            return moe_train_complain(err, "moe-train: %s: unknown key '%s' (keys are the flags without their dashes, '-' as "
                            "'_': see --help or --print-config)\n", what, key), -1;
        if (s->scope == MOE_OPT_SCOPE_FLAG_ONLY)
            return moe_train_complain(err, "moe-train: %s: '%s' is a command-line flag only, not a config file key\n", what, key),
                   -1;
        if (source == MOE_OPTION_SAVED_RUN && s->scope != MOE_OPT_SCOPE_RUN) continue;
        const char *want = NULL, *text = value_text(s, v, buf, sizeof buf, &want);
        if (!text) {
            char got[64] = "";
            json_dumpb(v, got, sizeof got - 1, JSON_ENCODE_ANY);
            return moe_train_complain(err, "moe-train: %s: '%s' must be %s%s, not %s\n", what, key, want,
                            moe_train_option_has_auto(s) ? " (or \"auto\")" : "", got), -1;
        }
        if (moe_train_option_from(o, s, source)) continue; /* a stronger source gave it */
        snprintf(label, sizeof label, "%s: '%s'", what, key);
        if (moe_train_option_set(o, s, text, source, label, err)) return -1;
    }
    return 0;
}

static json_t *read_json_file(const char *path, FILE *err) {
    FILE *f;
    moe_status st = moe_file_open_regular(path, &f);
    if (st != MOE_OK) return moe_train_complain(err, "moe-train: --config: %s\n", moe_failure_message(st)), NULL;
    json_error_t e;
    json_t *j = json_loadf(f, JSON_REJECT_DUPLICATES, &e);
    fclose(f);
    if (!j) moe_train_complain(err, "moe-train: --config %s: not JSON: %s (line %d, column %d)\n", path, e.text, e.line, e.column);
    return j;
}

/* The configuration the checkpoint's run trained with (manifest.json's "config"); NULL when the checkpoint
 * predates it. */
static json_t *saved_run(const char *dir, FILE *err, int *failed, json_t **machine, long *step) {
    char *path = moe_path_join(dir, "manifest.json");
    FILE *f = NULL;
    moe_status st = path ? moe_file_open_regular(path, &f) : MOE_ERR_OUT_OF_MEMORY;
    json_t *j = NULL, *config = NULL;
    if (st == MOE_OK) {
        json_error_t e;
        if (!(j = json_loadf(f, 0, &e)))
            moe_train_complain(err, "moe-train: --resume: %s: not JSON: %s (line %d)\n", path, e.text, e.line), *failed = 1;
        fclose(f);
    } else if (st != MOE_ERR_IO) { /* a missing manifest: a checkpoint from before manifests */
        moe_train_complain(err, "moe-train: --resume: %s\n", moe_failure_message(st)), *failed = 1;
    }
    config = json_object_get(j, "config");
    if (config && !json_is_object(config) && !json_is_null(config))
        moe_train_complain(err, "moe-train: --resume: %s: config is not an object of options\n", path), *failed = 1;
    config = json_is_object(config) && !*failed ? json_incref(config) : NULL;
    *machine = json_incref(json_object_get(j, "machine"));
    json_t *at = json_object_get(j, "step"); /* a string of digits in the manifest */
    *step = json_is_string(at)    ? strtol(json_string_value(at), NULL, 10)
            : json_is_integer(at) ? (long)json_integer_value(at)
                                  : 0;
    json_decref(j);
    free(path);
    return config;
}

/* 1 (said to err) when dir, given to --resume or --init-from, is a --checkpoint-dir (step-NNNNNNNN folders inside, no
 * config.json) rather than one checkpoint: it failed as "DIR/config.json: cannot open" (a probe, 2026-12-07). */
static int names_checkpoint_dir(const moe_train_options *o, const char *dir, FILE *err) {
    char *config = moe_path_join(dir, "config.json"), *newest = NULL;
    struct stat sb;
    const int is_root = config && stat(config, &sb) != 0 && errno == ENOENT &&
                        moe_checkpoint_latest(dir, &newest, NULL) == MOE_OK;
    if (is_root)
        moe_train_complain(err, "moe-train: %s %s holds checkpoints (step-NNNNNNNN folders), not one: give one of them "
                           "(the newest is %s)%s\n", *o->resume ? "--resume" : "--init-from", dir, newest,
                           *o->resume ? ", or --resume with --checkpoint-dir for the newest" : "");
    free(config), free(newest);
    return is_root;
}

/* The value DIR/config.json gives at the dotted key path ("rope_theta", "moe_train.family", "rope_scaling.factor"),
 * as JSON text in out; 0 where it gives none. A disagreement names the file's own value where it gives one, and says
 * so where it does not (a probe: "whose moe_train.family is mixtral" of a transformers file without moe_train, "whose
 * head_dim is 0" of a file saying 16). */
static int file_value(const char *dir, const char *path, char *out, size_t n) {
    char *name = moe_path_join(dir, "config.json");
    json_t *j = name ? json_load_file(name, 0, NULL) : NULL, *at = j;
    free(name);
    char key[64];
    for (const char *p = path; at && *p;) {
        const size_t len = strcspn(p, ".");
        snprintf(key, sizeof key, "%.*s", (int)len, p);
        at = json_is_object(at) ? json_object_get(at, key) : NULL;
        p += len + (p[len] == '.');
    }
    char *text = at ? json_dumps(at, JSON_ENCODE_ANY | MOE_JSON_FLOATS) : NULL;
    if (text) snprintf(out, n, "%s", text);
    free(text);
    json_decref(j);
    return text != NULL;
}

/* config.json defines the architecture: taken where no config file or flag gave it, compared where one did — except
 * the routing policy of training (capacity factor, drop priority: moe_checkpoint_field's policy) under --init-from,
 * which trains with what was given, said in a note; what the run saves then records it. */
static int take_architecture(moe_train_options *o, const char *dir, FILE *err, FILE *notes) {
    int count;
    const moe_train_option *table = moe_train_option_table(&count);
    moe_model_config saved;
    /* the manifest first: an edited config.json is named as such, not refused by a rule its values break */
    moe_status st = moe_checkpoint_verify_file(dir, "config.json");
    if (st == MOE_OK) st = moe_checkpoint_read_config(dir, &saved);
    if (st != MOE_OK) return moe_train_complain(err, "moe-train: %s\n", moe_failure_message(st)), -1;
    for (int i = 0; i < moe_checkpoint_num_fields(); i++) {
        const moe_checkpoint_field have = moe_checkpoint_field_at(&saved, i), asked = moe_checkpoint_field_at(&o->model, i);
        const moe_train_option *s = moe_train_option_at(offsetof(moe_train_options, model) + have.offset);
        const int undecided = moe_train_option_undecided(o, s) && moe_train_option_has_auto(s);
        const int given = moe_train_option_from(o, s, MOE_OPTION_CONFIG_FILE) && !undecided;
        if (given && have.policy && *o->init_from) {
            if (asked.value != have.value && notes && !o->print_config)
                fprintf(notes, "note: --init-from %s: training with %s %s (its config.json's %s is %s); the "
                        "checkpoints of this run record %s\n", dir, s->name, asked.text, have.path, have.text,
                        asked.text);
            continue;
        }
        if (given && asked.value != have.value) {
            char value[64];
            moe_train_option_format(o, s, 0, value, sizeof value);
            char as_flag[128] = ""; /* where the file counts in other units (DeepSeek's n_shared_experts) */
            if (*have.flag_text) snprintf(as_flag, sizeof as_flag, " (%s %s)", s->name, have.flag_text);
            char whose[256], given[96]; /* the file's own words where it gives the key, else what its label implies */
            if (file_value(dir, have.path, given, sizeof given))
                snprintf(whose, sizeof whose, "whose %s is %s", have.path, given);
            else
                snprintf(whose, sizeof whose, "which does not give %s: read as %s (its label's or the default)",
                         have.path, have.text);
            if (have.policy) /* the routing policy of training: --resume continues it, --init-from may change it */
                return moe_train_complain(err, "moe-train: %s %s disagrees with %s/config.json, %s%s: a resume "
                                          "continues that run's routing policy (leave %s out), or start a new run from "
                                          "its weights with --init-from\n", s->name, value, dir, whose, as_flag,
                                          s->name), -1;
            return moe_train_complain(err, "moe-train: %s %s disagrees with %s/config.json, %s%s: the checkpoint "
                                      "defines the architecture (leave %s out, or start without it)\n", s->name,
                                      value, dir, whose, as_flag, s->name), -1;
        }
        moe_checkpoint_field_set(&o->model, i, have.value);
        if (!moe_train_option_from(o, s, MOE_OPTION_CHECKPOINT)) o->source[s - table] = MOE_OPTION_CHECKPOINT;
    }
    o->model.max_positions = saved.max_positions;
    return 0;
}

/* After a refusal on --resume: the options the saved run gave (not the defaults) and this command did not, since
 * a message about one of them names a flag the user never typed. */
static void name_inherited(const moe_train_options *o, FILE *err) {
    int count, named = 0;
    const moe_train_option *table = moe_train_option_table(&count);
    char value[256];
    for (int i = 0; i < count && err; i++) {
        if (o->source[i] != MOE_OPTION_SAVED_RUN || moe_train_option_is_default(o, &table[i])) continue;
        moe_train_option_format(o, &table[i], 1, value, sizeof value);
        fprintf(err, "%s%s %s", named++ ? ", " : "moe-train: (from the saved run, as --resume keeps what is not given: ",
                table[i].name, value);
    }
    if (named) fprintf(err, "; give a flag to change one)\n");
}

int moe_train_option_kept_on_resume(const moe_train_option *s) {
    static const size_t kept[] = {
        offsetof(moe_train_options, model.seq_len),          offsetof(moe_train_options, model.moe.aux_loss_coef),
        offsetof(moe_train_options, model.moe.z_loss_coef),  offsetof(moe_train_options, model.moe.bias_update_rate),
        offsetof(moe_train_options, model.moe.layout_invariant), offsetof(moe_train_options, batch),
        offsetof(moe_train_options, micro_batches),          offsetof(moe_train_options, seed),
    };
    for (size_t i = 0; i < sizeof kept / sizeof *kept; i++)
        if (kept[i] == s->offset) return 1;
    return 0;
}

/* --resume: the options given now that differ from the saved run's, each refused where the run must keep it
 * (moe_train_option_kept_on_resume), else noted (notes: NULL for none, as under --print-config), and how many it
 * inherited; -1 after a refusal. */
static int compare_with_saved(const moe_train_options *o, json_t *saved, FILE *err, FILE *notes) {
    int count, inherited = 0, refused = 0;
    const moe_train_option *table = moe_train_option_table(&count);
    json_t *now = moe_train_options_json(o, 0);
    if (!now) return moe_train_complain(err, "moe-train: out of memory\n"), -1;
    for (int i = 0; i < count && !refused; i++) {
        const moe_train_option *s = &table[i];
        json_t *was = json_object_get(saved, moe_train_option_key(s)), *is = json_object_get(now, moe_train_option_key(s));
        if (o->source[i] == MOE_OPTION_SAVED_RUN) inherited++;
        const int layout = s->scope == MOE_OPT_SCOPE_LAYOUT;
        if ((s->scope != MOE_OPT_SCOPE_RUN && !layout) || !was || !is || json_equal(was, is)) continue;
        if (s->offset == offsetof(moe_train_options, threads) && o->threads == 0) continue; /* this machine's count */
        /* config.json's value, where the saved run's option differs only in form (a capacity factor -1 written 0) */
        if (o->source[i] == MOE_OPTION_CHECKPOINT) continue;
        refused = moe_train_option_kept_on_resume(s);
        if (!refused && !notes) continue;
        char *a = json_dumps(is, JSON_ENCODE_ANY | MOE_JSON_FLOATS), *b = json_dumps(was, JSON_ENCODE_ANY | MOE_JSON_FLOATS);
        if (refused)
            moe_train_complain(err, "moe-train: --resume %s: %s %s, but the saved run trained with %s: a resume "
                               "continues that run, whose training state holds it; keep it (leave %s out), or start a "
                               "new run from its weights with --init-from\n", o->resume, s->name, a ? a : "?",
                               b ? b : "?", s->name);
        else
            fprintf(notes, "resume: %s %s (the saved run had %s%s)\n", s->name, a ? a : "?", b ? b : "?",
                    !layout ? ""
                    : o->source[i] == MOE_OPTION_DEFAULT ? "; layout flags are not inherited: this is the default"
                                                         : "; layout flags are not inherited");
        free(a), free(b);
    }
    if (notes && !refused)
        fprintf(notes, "resume: %d options as the saved run had them (--print-config shows all)\n", inherited);
    json_decref(now);
    return refused ? -1 : 0;
}

/* A resume of one checkpoint (not `latest`) saves beside it unless --checkpoint-dir is given: the saved run's folder
 * (relative to where that run started) put a copy's saves into the original run's folder, whose older checkpoints
 * --keep-last then pruned (a probe, 2026-12-08). The folder holding the checkpoint as the file system has it (a link
 * followed, `--resume .` from inside the step: a review found both saving elsewhere); compare_with_saved notes the
 * change. 0, or -1 (out of memory). */
static int save_beside_resumed(moe_train_options *o, FILE *err) {
    const moe_train_option *s = moe_train_option_at(offsetof(moe_train_options, checkpoint_dir));
    if (!strcmp(o->resume, "latest") || !*o->checkpoint_dir || moe_train_option_from(o, s, MOE_OPTION_CHECKPOINT))
        return 0;
    char *real = realpath(o->resume, NULL); /* NULL: no such checkpoint, which the resume then says */
    const char *path = real ? real : o->resume;
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') n--; /* "ck/step-00000030/" */
    size_t cut = n;
    while (cut > 0 && path[cut - 1] != '/') cut--;
    while (cut > 1 && path[cut - 1] == '/') cut--; /* the separators before the step's name */
    json_t *parent = cut == 0 ? json_string(".") : json_stringn(path, cut);
    free(real);
    if (!parent || keep(parent)) return moe_train_complain(err, "moe-train: out of memory\n"), -1;
    return moe_train_option_set(o, s, json_string_value(parent), MOE_OPTION_SAVED_RUN, "--checkpoint-dir", err);
}

/* The saved run's value of the option at offset (a number), or fallback. */
static double saved_number(json_t *saved, size_t offset, double fallback) {
    json_t *v = json_object_get(saved, moe_train_option_key(moe_train_option_at(offset)));
    return json_is_number(v) ? json_number_value(v) : fallback;
}

/* A learning-rate schedule changed on resume (--steps, --warmup, --lr, --min-lr): the rate the next step trains at
 * beside what the saved run's schedule gave there (or at its last step). A longer --steps stretches the cosine and
 * raises the rate: a probe, 2026-12-08, saw 3.00e-4 at a finished run's step 30 become 1.69e-3 at step 31 with
 * --steps 60, said only as "--steps 60 (the saved run had 30)". */
static void note_schedule(const moe_train_options *o, json_t *saved, long step, FILE *notes) {
    if (!notes || step < 1 || step >= o->steps) return;
    const moe_lr_schedule now = {o->lr, o->min_lr, o->warmup, o->steps};
    const moe_lr_schedule was = {(float)saved_number(saved, offsetof(moe_train_options, lr), o->lr),
                                 (float)saved_number(saved, offsetof(moe_train_options, min_lr), o->min_lr),
                                 (int)saved_number(saved, offsetof(moe_train_options, warmup), o->warmup),
                                 (int)saved_number(saved, offsetof(moe_train_options, steps), o->steps)};
    const long there = step + 1 <= was.total_steps ? step + 1 : was.total_steps;
    const float next = moe_lr_at(&now, step + 1), before = moe_lr_at(&was, there);
    if (next == before) return;
    fprintf(notes, "resume: step %ld trains at lr %.2e under this schedule; the saved run's gave %.2e at %s %ld%s\n",
            step + 1, next, before, there == step + 1 ? "that step" : "its last step,", there,
            next > before ? " (a longer --steps stretches the cosine: the rate rises)" : "");
}

/* --init-from starts a new run from the weights alone: where the checkpoint's run trained with other values of the
 * options that shape what a step learns, and this run takes their defaults, a note names them (a probe, 2026-12-08: a
 * fine-tune of a run trained with --aux-loss-coef 0.05, --z-loss-coef 0 and bf16 ran with 0.01, 0.001 and fp32,
 * unsaid). */
static void note_init_recipe(const moe_train_options *o, json_t *saved, FILE *notes) {
    static const size_t recipe[] = {offsetof(moe_train_options, model.seq_len), offsetof(moe_train_options, batch),
                                    offsetof(moe_train_options, micro_batches),
                                    offsetof(moe_train_options, model.moe.precision),
                                    offsetof(moe_train_options, model.moe.aux_loss_coef),
                                    offsetof(moe_train_options, model.moe.z_loss_coef),
                                    offsetof(moe_train_options, model.moe.bias_update_rate)};
    json_t *now = notes ? moe_train_options_json(o, 0) : NULL;
    char said[640] = "";
    for (size_t i = 0; now && i < sizeof recipe / sizeof recipe[0]; i++) {
        const moe_train_option *s = moe_train_option_at(recipe[i]);
        const char *key = moe_train_option_key(s);
        json_t *was = json_object_get(saved, key), *is = json_object_get(now, key);
        if (!was || !is || json_equal(was, is) || moe_train_option_from(o, s, MOE_OPTION_SAVED_RUN)) continue;
        char *a = json_dumps(was, JSON_ENCODE_ANY | MOE_JSON_FLOATS),
             *b = json_dumps(is, JSON_ENCODE_ANY | MOE_JSON_FLOATS);
        snprintf(said + strlen(said), sizeof said - strlen(said), "%s%s %s (this run: %s)", *said ? ", " : "", s->name,
                 a ? a : "?", b ? b : "?");
        free(a), free(b);
    }
    if (*said)
        fprintf(notes, "note: --init-from %s: its run trained with %s; this run takes the defaults, as a new run (give "
                       "them to keep the run's)\n", o->init_from, said);
    json_decref(now);
}

/* --resume auto (a job script run again and again, Slurm's requeue): the newest checkpoint in --checkpoint-dir as
 * --resume latest, or where it holds none yet a fresh run (from --init-from's weights if given, which a found
 * checkpoint makes moot). Resolved before anything reads --resume. 0, or -1 (said). */
static int resolve_resume_auto(moe_train_options *o, FILE *err, FILE *notes) {
    if (strcmp(o->resume, "auto")) return 0;
    o->resume_auto = 1;
    if (!*o->checkpoint_dir)
        return moe_train_complain(err, "moe-train: --resume auto needs --checkpoint-dir (where it looks for the newest "
                                       "checkpoint)\n"), -1;
    if (moe_checkpoint_none_yet(o->checkpoint_dir)) {
        o->resume = "";
        if (notes && !o->print_config)
            fprintf(notes, "resume: --resume auto: %s holds no checkpoint yet: a fresh run%s%s\n", o->checkpoint_dir,
                    *o->init_from ? " from the weights of " : "", o->init_from);
        return 0;
    }
    o->resume = "latest";
    if (*o->init_from && notes && !o->print_config)
        fprintf(notes, "resume: --resume auto: %s holds checkpoints: the newest is resumed, and --init-from %s has no "
                       "effect\n", o->checkpoint_dir, o->init_from);
    o->init_from = "";
    return 0;
}

int moe_train_options_load(int argc, char **argv, int world_size, moe_train_options *o, FILE *err, FILE *notes) {
    int rc = moe_train_options_parse_flags(argc, argv, o, err);
    if (rc) return rc;
    if (*o->config_file) {
        json_t *j = read_json_file(o->config_file, err);
        if (!j) return -1;
        if (keep(j)) return moe_train_complain(err, "moe-train: out of memory\n"), -1;
        if (moe_train_options_apply_json(o, j, MOE_OPTION_CONFIG_FILE, o->config_file, err)) return -1;
    }
    if (resolve_resume_auto(o, err, notes)) return -1;
    char *dir = NULL; /* both, or latest without a directory: moe_train_options_finish says why not */
    const int usable = !(*o->resume && *o->init_from) && (strcmp(o->resume, "latest") || *o->checkpoint_dir);
    if (!usable) {
    } else if (!strcmp(o->resume, "latest")) {
        moe_status st = moe_checkpoint_latest(o->checkpoint_dir, &dir, NULL); /* restore() warns of what it skips */
        if (st != MOE_OK) return moe_train_complain(err, "moe-train: --resume: %s\n", moe_failure_message(st)), -1;
    } else if (*o->resume || *o->init_from) {
        dir = strdup(*o->resume ? o->resume : o->init_from);
        if (!dir) return moe_train_complain(err, "moe-train: out of memory\n"), -1;
        if (names_checkpoint_dir(o, dir, err)) return free(dir), -1;
    }
    json_t *saved = NULL, *machine = NULL;
    int failed = 0;
    long saved_step = 0;
    if (dir && *o->resume && (saved = saved_run(dir, err, &failed, &machine, &saved_step)) != NULL)
        failed = keep(saved) ? (moe_train_complain(err, "moe-train: out of memory\n"), 1)
                             : moe_train_options_apply_json(o, saved, MOE_OPTION_SAVED_RUN,
                                                            "the saved run's configuration", err);
    if (!failed && saved) failed = save_beside_resumed(o, err);
    if (!failed && dir) failed = take_architecture(o, dir, err, notes);
    if (!failed && machine && !o->print_config) moe_run_machine_note(notes, dir, machine);
    json_decref(machine);
    free(dir);
    if (failed) return -1;
    if (moe_train_options_finish(o, world_size, err)) {
        if (*o->config_file) moe_train_complain(err, "moe-train: (the options include those of --config %s)\n", o->config_file);
        if (saved) name_inherited(o, err);
        return -1;
    }
    if (saved && compare_with_saved(o, saved, err, o->print_config ? NULL : notes)) return -1;
    if (saved && !o->print_config && !o->eval_only) note_schedule(o, saved, saved_step, notes);
    /* the metrics log is not inherited (the first run's would be rotated away): said where the saved run kept one (a
     * probe: a resumed run wrote no metrics, unsaid) */
    const char *saved_log = json_string_value(json_object_get(saved, "log_file"));
    if (notes && saved_log && *saved_log && !*o->log_file && !o->print_config && !o->eval_only)
        fprintf(notes, "resume: the saved run logged metrics to %s; this run keeps no metrics log unless --log-file is "
                       "given (that file again keeps the earlier one as %s.1)\n", saved_log, saved_log);
    if (*o->init_from && !o->print_config && !o->eval_only) {
        long ignored;
        int unreadable = 0; /* moe_checkpoint_load_weights says what is wrong with it */
        json_t *machine_of_init = NULL, *run = saved_run(o->init_from, NULL, &unreadable, &machine_of_init, &ignored);
        if (run) note_init_recipe(o, run, notes);
        json_decref(run), json_decref(machine_of_init);
    }
    if (!o->print_config) moe_train_note_inert_options(o, notes);
    return 0;
}
