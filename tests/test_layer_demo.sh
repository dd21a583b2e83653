#!/bin/sh
# test_layer_demo.sh MOE_LAYER_DEMO — the layer example fits (exit 0, "lower"), and a fit that cannot (a step too
# large for 1 token) says so and to lower --lr, exit 1 (a probe, 2026-12-07: it printed "-10169308400.7% lower").
demo=$1 status=0
out=$("$demo" --steps 20 --tokens 256 2>&1) && echo "$out" | grep -q "^moe-layer-demo: mse .* (.*% lower)$" &&
    echo "ok: the fit: $(echo "$out" | tail -n 1)" || { echo "FAIL: the default fit: $out"; status=1; }
for args in "--steps 2 --tokens 1" "--experts 1 --top-k 1 --steps 5 --tokens 512"; do
    # shellcheck disable=SC2086 # flags, no blanks in them
    out=$("$demo" $args 2>&1) && { echo "FAIL: $args: exit 0: $out"; status=1; continue; }
    echo "$out" | grep -q "lower --lr" && echo "ok: $args: $(echo "$out" | tail -n 1)" ||
        { echo "FAIL: $args: no advice: $out"; status=1; }
done
exit $status
