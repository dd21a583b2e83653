/* plan/options.h — moe-plan's flags: one table gives parsing, range checks, --help and the defaults, and the
 * parsed flags become a model, a cluster and a run (plan/model.h, plan/cluster.h). */
#ifndef MOE_PLAN_OPTIONS_H
#define MOE_PLAN_OPTIONS_H

#include <stdio.h>

#include "plan/cluster.h"
#include "plan/routing.h"

typedef struct {
    moe_plan_model model;
    moe_plan_cluster cluster;
    moe_plan_run run;
    moe_plan_routing routing; /* --routing-from: a run's expert counts (num_samples 0: not given); the run's
                                 layout's routing_skew is its skew at the layout's ep (moe_plan_options_free releases it) */
    const char *hf_config; /* NULL: the model came from the shape flags (moe-train's names and defaults) */
    int search;            /* 1: rank every layout that fits (plan/search.h)                       */
    int top;               /* layouts --search prints                                                    */
    int json;              /* 1: one JSON object instead of the text report                              */
} moe_plan_options;

/* Returns 0 on success, 1 when --help was printed to out, -1 on an error (a message naming the flag, the value
 * and what is allowed, or the config file's problem, written to err). */
int moe_plan_options_parse(int argc, char **argv, moe_plan_options *o, FILE *out, FILE *err);
void moe_plan_options_free(moe_plan_options *o);

#endif
