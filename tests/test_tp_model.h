/* test_tp_model.h — the decoder model under tensor and sequence parallelism bitwise the model at tp 1 (issue 28;
 * models/model.h, "Tensor parallelism"), on any runtime: the body of tests/test_tp_model_mpi.c (the CPU, fp32) and
 * tests/test_gpu_tp_model.c (CUDA, bf16). What is compared is in tests/test_tp_model.c. */
#ifndef MOE_TESTS_TEST_TP_MODEL_H
#define MOE_TESTS_TEST_TP_MODEL_H

#include "alltoall/parallel.h"
#include "models/model.h"

typedef enum {
    TEST_TP_DROPLESS,
    TEST_TP_CAPACITY,
    TEST_TP_GQA_TIED,
    TEST_TP_DENSE_FFN,
    TEST_TP_QWEN2,
    TEST_TP_OLMOE,
    TEST_TP_QWEN3_GQA,
    TEST_TP_QWEN3_MQA,
    TEST_TP_MLA_Q_LORA,
    TEST_TP_MLA,
    TEST_TP_MQA_MATERIALIZED,
    TEST_TP_MQA_FUSED,
    TEST_TP_NUM_CASES
} test_tp_case;

/* The case's model with pieces (tp_shards): 2 layers, d 32, 4 heads (8 in TEST_TP_QWEN3_GQA and the MLA cases), 4
 * experts of d_ff 32, top-2. */
moe_model_config test_tp_model_config(test_tp_case c, int pieces);

typedef struct {
    moe_runtime *rt;          /* NULL: the CPU */
    moe_precision precision;  /* the models' GEMM inputs */
    int last_case;            /* the cases run: 0 .. last_case */
    int zero2;                /* also each layout at ep 1 under ZeRO-2 (its gathered gradients: host memory only) */
    /* this world's layout of ep x tp, and a layout of this rank alone (the reference's) */
    moe_status (*layout)(void *ctx, int ep, int tp, moe_parallel **out);
    moe_status (*self)(void *ctx, moe_parallel **out);
    void *ctx;
} test_tp_model_setup;

/* Every rank: the reference alone, then every layout of tp in {1, 2, 4, 8} dividing the world and the case's heads
 * times every ep dividing the world, each compared with the reference (failures through CHECK; a failed gradient
 * names the first tensor that differs). */
void test_tp_model_layouts(const test_tp_model_setup *s, int world, int rank);

#endif
