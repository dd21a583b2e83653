/* batch_reader.c — a step's tokens, read now or on a thread of their own (batch_reader.h). */
#include "train/batch_reader.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fail.h"

moe_status moe_batch_read(moe_token_data *d, moe_data_order order, const int64_t *firsts, const int64_t *advise_firsts,
                          int reads, int num_seqs, int *tokens) {
    if (advise_firsts)
        for (int i = 0; i < reads; i++) moe_token_data_advise(d, order, advise_firsts[i], num_seqs);
    const int S = moe_token_data_seq_len(d);
    const size_t each = (size_t)num_seqs * S;
    for (int i = 0; i < reads; i++)
        MOE_TRY(moe_token_data_sequences(d, order, firsts[i], num_seqs, tokens + i * each, tokens + (reads + i) * each));
    return MOE_OK;
}

static void *read_in_background(void *arg) {
    moe_batch_prefetch *p = arg;
    p->status = moe_batch_read(p->data, p->order, p->firsts, p->advise ? p->firsts + p->reads : NULL, p->reads,
                               p->num_seqs, p->tokens);
    if (p->status != MOE_OK) snprintf(p->message, sizeof p->message, "%s", moe_failure_message(p->status));
    return NULL;
}

moe_status moe_batch_prefetch_start(moe_batch_prefetch *p, moe_token_data *d, moe_data_order order,
                                    const int64_t *firsts, const int64_t *advise_firsts, int reads, int num_seqs,
                                    int *tokens) {
    MOE_TRY(moe_batch_prefetch_wait(p));
    free(p->firsts);
    *p = (moe_batch_prefetch){.data = d, .order = order, .reads = reads, .num_seqs = num_seqs,
                              .advise = advise_firsts != NULL, .tokens = tokens};
    if (!(p->firsts = malloc(2 * (size_t)reads * sizeof(int64_t)))) return MOE_ERR_OUT_OF_MEMORY;
    memcpy(p->firsts, firsts, (size_t)reads * sizeof(int64_t));
    if (advise_firsts) memcpy(p->firsts + reads, advise_firsts, (size_t)reads * sizeof(int64_t));
    const int rc = pthread_create(&p->thread, NULL, read_in_background, p);
    if (rc != 0) return moe_fail(MOE_ERR_IO, "cannot start the data reading thread: %s", strerror(rc));
    p->running = 1;
    return MOE_OK;
}

moe_status moe_batch_prefetch_wait(moe_batch_prefetch *p) {
    if (!p->running) return MOE_OK;
    pthread_join(p->thread, NULL);
    p->running = 0;
    free(p->firsts);
    p->firsts = NULL;
    return p->status == MOE_OK ? MOE_OK : moe_fail(p->status, "%s", p->message);
}
