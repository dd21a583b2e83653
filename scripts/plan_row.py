#!/usr/bin/env python3
"""plan_row.py MODEL CASE GPUS [--tflops] — one line of scripts/plan_reference.sh's tables from moe-plan --json on
stdin: a single prediction, or --search's best layout (or, when none fits, the least memory a layout needs). With
--tflops the "limited by" column also gives the model TFLOP/s per GPU (MFU x peak), Megatron-LM's measure; a pipeline
with uneven ends (--first-stage-layers, --last-stage-layers) says so there too."""
import json, sys

d = json.load(sys.stdin)
model, case, gpus = sys.argv[1:4]
tflops = "--tflops" in sys.argv[4:]
if "prediction" in d:
    l = d["prediction"]
elif d["layouts"]:
    l = d["layouts"][0]
else:
    m = d["least_memory"]
    print("%-16s %-17s %5s | none of %d fits: the least needs %.0f GiB (pp %d, tp %d, ep %d, ZeRO-%d, recompute full, 1 "
          "sequence: activations %.0f, all-to-all buffers %.0f, AdamW %.0f, gradients %.0f)" % (model, case, gpus,
          d["layouts_tried"], m["total"] / 2**30, m["pp"], m["tp"], m["ep"], m["zero"], m["activations"] / 2**30,
          m["exchange"] / 2**30, m["optimizer"] / 2**30, m["gradients"] / 2**30))
    sys.exit(0)
s = l["seconds"]
limit = l["limited_by"]
if not l["fits"]:
    limit = "DOES NOT FIT"
if l.get("first_stage_layers") or l.get("last_stage_layers"):  # a pipeline's uneven ends (--first-stage-layers)
    limit += "; ends %d and %d layers" % (l["first_stage_layers"], l["last_stage_layers"])
if tflops:  # model FLOPs per second per GPU: MFU x the 989.4 TFLOP/s peak moe-plan assumes (--gpu-flops)
    limit += "; %.0f TFLOP/s per GPU" % (l["tokens_per_s_serial"] * l["flops_per_token"] / int(gpus) / 1e12)
print("%-16s %-17s %5s | %3d %3d %3d %4d %4d %4d %9s %5d %5d %8.1f %10.3f %10.4g %5.1f%% %5.1f%%  %s" % (model, case,
      gpus, l["pp"], l["virtual_stages"], l["tp"], l["ep"], l["dp"], l["zero"], l["recompute"], l["micro_batch"], l["accum_steps"],
      l["memory_bytes"]["total"] / 2**30, s["step_serial"], l["tokens_per_s_serial"], 100 * l["mfu_serial"],
      100 * l["mfu_overlap"], limit))
