#!/bin/bash
# test_verify_cli.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — moe-train --verify-steps on the CPU, where
# the run under test is the CPU itself: fp32 against the fp32 reference is bitwise; bf16 is within the bf16
# tolerances (docs/GPU.md); a wrong op (MOE_TEST_FAULT, moe/dense_ops_fault.h) stops the run with exit status
# 3 and the name of the tensor it writes first in backward, or of the forward pass; all of it in a pipeline too
# (--pp 2, and 2 virtual stages). And --device cuda where there is no GPU is a clear refusal.
source "$(dirname "$0")/train_cli_common.sh"

moe=(--ep 2 --capacity-factor 1.25 --micro-batches 2)
trains "fp32 against the fp32 reference is bitwise" "verify step 2: .*every gradient bitwise equal" \
    --verify-steps 2 "${moe[@]}"
trains "sigmoid routing with drops by score, bitwise" "verify step 2: .*every gradient bitwise equal" \
    --verify-steps 2 "${moe[@]}" --score sigmoid --drop-priority score
trains "bf16 within the bf16 tolerances" "verify step 3: .*routing agrees" \
    --verify-steps 3 --steps 3 --precision bf16 "${moe[@]}"
# in a pipeline the reference is one too (its own communicators): each stage checks the layers it holds
pp=(--pp 2 --layers 2 --micro-batches 2)
trains "pp 2: fp32 against the fp32 reference is bitwise" "verify step 2: .*every gradient bitwise equal" \
    --verify-steps 2 "${pp[@]}" --capacity-factor 1.25
trains "pp 2 x 2 virtual stages, tied embeddings, bf16 within the bf16 tolerances" "verify step 2: .*routing agrees" \
    --verify-steps 2 --precision bf16 --pp 2 --virtual-stages 2 --layers 4 --micro-batches 2 --tie-embeddings 1

faulty() { # ENTRY PATTERN FLAGS...: the run with ENTRY done twice stops with exit status 3 and PATTERN
    local entry=$1 pattern=$2
    shift 2
    merge --verify-steps 2 "$@"
    MOE_TEST_FAULT=$entry timeout 120 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/out.txt" 2>&1
    local rc=$?
    if [ $rc -eq 3 ] && grep -Eq -e "$pattern" "$dir/out.txt"; then
        echo "ok: $entry done twice: $(grep -E -e "$pattern" "$dir/out.txt" | head -n 1)"
    else
        fail_with_output "$entry done twice: exit status $rc (3 expected), or no line /$pattern/"
    fi
}
faulty linear_backward_weight "gradient of lm_head\.weight differs" --precision bf16
faulty rmsnorm_backward "gradient of model\.norm\.weight differs" --precision bf16
faulty swiglu_backward "gradient of model\.layers\.0\.mlp\.down_proj\.weight differs" --layers 2 --moe-every 2
faulty embedding_backward "gradient of model\.embed_tokens\.weight differs" "${moe[@]}"
faulty rope_forward "the forward pass disagrees"
faulty rmsnorm_backward "gradient of model\.norm\.weight differs" --precision bf16 "${pp[@]}" # the last stage's
faulty embedding_backward "gradient of model\.embed_tokens\.weight differs" "${pp[@]}"        # the first stage's
export MOE_TEST_FAULT=softmax
refuses "no fault for the dense entry 'softmax'" --verify-steps 1
unset MOE_TEST_FAULT

refuses "--device cuda: (this node has no CUDA device|this moe-train was built without CUDA)" --device cuda
refuses "--gpu-transport needs --device cuda" --gpu-transport mpi
refuses "--device cuda runs the experts in bf16 only" --device cuda --precision fp32
finish test_verify_cli
