/* plan/routing.c — a moe-train run's expert token counts and the EP skew they give (plan/routing.h). */
#define _GNU_SOURCE /* getline */
#include "plan/routing.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/fail.h"
#include "models/fileio.h"

/* Appends the samples of one step record's expert_tokens ([{"layer": l, "tokens": [E counts]}, ...]). */
static moe_status add_record(const char *path, long line, json_t *list, moe_plan_routing *r, size_t *cap) {
    if (!json_is_array(list)) return moe_fail(MOE_ERR_BAD_FILE, "%s:%ld: expert_tokens is not a list", path, line);
    for (size_t i = 0; i < json_array_size(list); i++) {
        json_t *tokens = json_object_get(json_array_get(list, i), "tokens");
        const int64_t E = json_is_array(tokens) ? (int64_t)json_array_size(tokens) : 0;
        if (E < 1) return moe_fail(MOE_ERR_BAD_FILE, "%s:%ld: expert_tokens[%zu] has no tokens list", path, line, i);
        if (r->num_experts && E != r->num_experts)
            return moe_fail(MOE_ERR_BAD_FILE, "%s:%ld: %lld experts in expert_tokens[%zu], %lld before", path, line,
                            (long long)E, i, (long long)r->num_experts);
        r->num_experts = E;
        if ((size_t)(r->num_samples + 1) * E > *cap) {
            *cap = 2 * *cap + (size_t)E;
            double *grown = realloc(r->tokens, *cap * sizeof *grown);
            if (!grown) return moe_fail(MOE_ERR_OUT_OF_MEMORY, "%s: out of memory for the expert counts", path);
            r->tokens = grown;
        }
        double *row = r->tokens + r->num_samples * E;
        for (int64_t e = 0; e < E; e++) {
            json_t *v = json_array_get(tokens, (size_t)e);
            if (!json_is_number(v) || json_number_value(v) < 0)
                return moe_fail(MOE_ERR_BAD_FILE, "%s:%ld: expert_tokens[%zu] entry %lld is not a count", path, line, i,
                                (long long)e);
            row[e] = json_number_value(v);
        }
        r->num_samples++;
    }
    return MOE_OK;
}

static moe_status read_lines(const char *path, FILE *f, moe_plan_routing *r) {
    char *text = NULL;
    size_t text_cap = 0, cap = 0;
    moe_status st = MOE_OK;
    long line = 0;
    while (st == MOE_OK && getline(&text, &text_cap, f) >= 0) {
        ++line;
        json_error_t err;
        json_t *j = json_loads(text, 0, &err);
        if (!j) {
            st = moe_fail(MOE_ERR_BAD_FILE, "%s:%ld: not JSON: %s (is it a moe-train metrics.jsonl?)", path, line,
                          err.text);
            break;
        }
        json_t *list = json_object_get(j, "expert_tokens");
        if (json_object_get(j, "step") && list) st = add_record(path, line, list, r, &cap);
        json_decref(j);
    }
    free(text);
    if (st == MOE_OK && ferror(f)) st = moe_fail(MOE_ERR_IO, "%s: read error after line %ld", path, line);
    if (st == MOE_OK && !r->num_samples)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: no step record with expert_tokens of an MoE layer (a moe-train "
                      "metrics.jsonl of a model with more than one expert is needed)", path);
    return st;
}

moe_status moe_plan_routing_load(const char *path, moe_plan_routing *out) {
    *out = (moe_plan_routing){0};
    FILE *f;
    MOE_TRY(moe_file_open_regular(path, &f));
    const moe_status st = read_lines(path, f, out);
    fclose(f);
    if (st != MOE_OK) moe_plan_routing_free(out);
    return st;
}

void moe_plan_routing_free(moe_plan_routing *r) {
    free(r->tokens);
    *r = (moe_plan_routing){0};
}

double moe_plan_routing_skew(const moe_plan_routing *r, int64_t ep) {
    const int64_t E = r->num_experts, per = E / ep;
    double sum = 0;
    int64_t counted = 0;
    for (int64_t s = 0; s < r->num_samples; s++) {
        const double *row = r->tokens + s * E;
        double total = 0, busiest = 0;
        for (int64_t g = 0; g < ep; g++) {
            double rows = 0;
            for (int64_t e = g * per; e < (g + 1) * per; e++) rows += row[e];
            total += rows, busiest = rows > busiest ? rows : busiest;
        }
        if (total > 0) sum += busiest / (total / (double)ep), counted++;
    }
    return counted ? sum / (double)counted : 1;
}
