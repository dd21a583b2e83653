/* fuzz_train_options.c — fuzzes moe-train's flag parser (train/options.c: moe_train_options_parse),
 * which also checks the combinations. An input is a command line: words split at white space (and NUL), ''
 * an empty word; it is parsed for 1, 2 and 4 ranks. Accepted options must make a run the trainer can hold,
 * checked here on their own: a valid model, --pp dividing the ranks and a pipeline split of the layers, --ep
 * dividing a pipeline stage's ranks and the experts, --tp dividing them and --seq-len, --batch divisible by a stage's
 * tensor-parallel groups, the routing of a micro-batch (global tokens * top-k) counted in an int as the trainer, the
 * layer and the routing trace count it, --min-lr <= --lr, --warmup <= --steps, data files named; printing them must
 * work.
 * Seeds: moe-train command lines from the README, docs/TRAINING.md and fuzz/make_corpus.sh
 * (fuzz/corpus/train_options/).
 *   bash scripts/fuzz.sh                                  (the whole fuzz suite: replay, then a timed run)
 *   build-fuzz/fuzz/fuzz_train_options -max_total_time=60 /tmp/new fuzz/corpus/train_options   (longer)
 *   build-fuzz/fuzz/fuzz_train_options FILE               (one input: reproduce a finding) */
#include <ctype.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz/fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes);

enum { MAX_WORDS = 256 };

static void check_accepted(const moe_train_options *o, int world_size) {
    const moe_model_config *m = &o->model;
    const char *problem = moe_model_layout_problem(m, o->tp, o->ep);
    if (problem) fuzz_invalid("options accepted with an invalid model (--tp %d, --ep %d): %s", o->tp, o->ep, problem);
    const moe_pipeline_split split = moe_train_pipeline_split(o); /* uneven ends (--first/last-stage-layers) too */
    if (o->pp < 1 || o->virtual_stages < 1 || world_size % o->pp || moe_pipeline_split_problem(&split, m->num_layers))
        fuzz_invalid("options accepted with --pp %d, --virtual-stages %d, --layers %d on %d ranks", o->pp,
                     o->virtual_stages, m->num_layers, world_size);
    const int stage = world_size / o->pp; /* the ranks of a pipeline stage split the batch and hold its experts */
    if (o->tp < 1 || stage % o->tp || m->seq_len % o->tp)
        fuzz_invalid("options accepted with --tp %d, --seq-len %d on %d ranks of a stage", o->tp, m->seq_len, stage);
    const int groups = stage / o->tp; /* tensor-parallel groups: each reads its part of the batch */
    if (o->ep < 1 || stage % o->ep || m->moe.num_experts % o->ep || o->batch % groups)
        fuzz_invalid("options accepted with --ep %d, --experts %d, --batch %d on %d ranks of a stage (%d ranks, --pp "
                     "%d, --tp %d)", o->ep, m->moe.num_experts, o->batch, stage, world_size, o->pp, o->tp);
    if ((long long)o->batch * m->seq_len * m->moe.top_k > INT_MAX)
        fuzz_invalid("options accepted with %lld routing choices per micro-batch (--batch %d * --seq-len %d * "
                     "--top-k %d), more than an int holds", (long long)o->batch * m->seq_len * m->moe.top_k, o->batch,
                     m->seq_len, m->moe.top_k);
    if (o->min_lr > o->lr || o->warmup > o->steps || !*o->train_data || !*o->val_data)
        fuzz_invalid("options accepted with --min-lr %g > --lr %g, --warmup %d > --steps %d or no data files",
                     o->min_lr, o->lr, o->warmup, o->steps);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t nbytes) {
    static FILE *null;
    if (!null && !(null = fopen("/dev/null", "w"))) abort();
    char *text = malloc(nbytes + 1), *argv[MAX_WORDS + 1] = {"moe-train"};
    if (!text) abort();
    memcpy(text, data, nbytes);
    text[nbytes] = 0;
    int argc = 1;
    for (size_t i = 0; i < nbytes && argc < MAX_WORDS;) {
        while (i < nbytes && (isspace((unsigned char)text[i]) || !text[i])) text[i++] = 0;
        if (i == nbytes) break;
        argv[argc++] = text + i;
        while (i < nbytes && text[i] && !isspace((unsigned char)text[i])) i++;
    }
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "''")) argv[i][0] = 0;
    argv[argc] = NULL;
    static const int world_sizes[] = {1, 2, 4};
    for (int w = 0; w < 3; w++) {
        moe_train_options o;
        /* rank 0 writes its complaints (to /dev/null here); the others pass NULL */
        int rc = moe_train_options_parse(argc, argv, world_sizes[w], &o, w == 1 ? NULL : null);
        if (rc < -1 || rc > 1) fuzz_invalid("moe_train_options_parse returned %d", rc);
        if (rc != 0) continue;
        check_accepted(&o, world_sizes[w]);
        moe_train_options_print(&o, null);
    }
    free(text);
    return 0;
}
