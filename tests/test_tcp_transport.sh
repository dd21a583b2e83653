#!/bin/bash
# test_tcp_transport.sh MPIRUN MOE_TRAIN TEXT_TO_TOKENS EXPECT_FAILURE — the transport between nodes gives the
# same bits as the one within a node: a small 2-rank run (ep 2, capacity drops, ZeRO-1, 2 micro-batches) over
# Open MPI's shared memory (pml ob1, btl vader) and again over TCP on loopback (btl tcp), each checked to have
# used that transport; every loss in the metrics and the saved checkpoint's files are bitwise the same.
# (The MPI test programs also run over TCP: `meson test --setup tcp --suite transport`, from scripts/test.sh.)
source "$(dirname "$0")/train_cli_common.sh"

run() { # NAME BTL: the small run over that btl, its metrics and checkpoint under $dir/NAME
    local name=$1 btl=$2
    merge --ep 2 --capacity-factor 1.25 --zero 1 --micro-batches 2 --steps 4 --warmup 1 \
        --log-file "$dir/$name.jsonl" --checkpoint-dir "$dir/$name.ckpt"
    OMPI_MCA_pml=ob1 OMPI_MCA_btl=self,$btl OMPI_MCA_btl_tcp_if_include=lo OMPI_MCA_btl_base_verbose=100 \
        timeout 300 "$mpirun" -np 2 "$train" "${merged[@]}" > "$dir/$name.txt" 2>&1 ||
        { fail_with_output "the run over $btl failed"; cp "$dir/$name.txt" "$dir/out.txt"; return 1; }
    # btl_base_verbose makes Open MPI name each btl component it initialises
    if ! grep -q "initializing btl component $btl" "$dir/$name.txt"; then
        cp "$dir/$name.txt" "$dir/out.txt"
        fail_with_output "no sign in Open MPI's verbose output that the run used btl $btl"
    fi
}
run shm vader && run tcp tcp || finish test_tcp_transport
losses() { sed -n 's/.*"loss":\([^,]*\),.*/\1/p' "$1"; }
if [ -n "$(losses "$dir/shm.jsonl")" ] && [ "$(losses "$dir/shm.jsonl")" = "$(losses "$dir/tcp.jsonl")" ]; then
    echo "ok: every loss bitwise the same over shared memory and TCP: $(losses "$dir/tcp.jsonl" | tr '\n' ' ')"
else
    echo "FAIL: the losses differ (or are missing): shm: $(losses "$dir/shm.jsonl" | tr '\n' ' ') tcp: $(losses "$dir/tcp.jsonl" | tr '\n' ' ')"
    failures=$((failures + 1))
fi
for f in model.safetensors train_state.safetensors; do
    a=$(ls "$dir"/shm.ckpt/step-*/$f 2>/dev/null | tail -n 1) b=$(ls "$dir"/tcp.ckpt/step-*/$f 2>/dev/null | tail -n 1)
    if [ -n "$a" ] && [ -n "$b" ] && cmp -s "$a" "$b"; then echo "ok: $f bitwise the same"
    else echo "FAIL: $f differs between shared memory and TCP (or is missing)"; failures=$((failures + 1))
    fi
done
finish test_tcp_transport
