#!/bin/bash
# test_symbols.sh NM LIB... — the names the libraries export: every global symbol a library defines starts
# with moe_ (public) or moe__ (internal); C++ names (CUDA files) may only be those of anonymous namespaces,
# which are private to their file. Libraries whose file name has no "cuda" in it must neither define nor
# reference any CUDA, cuBLAS or NCCL symbol (libmoe keeps no CUDA symbols: it links without the toolkit).
nm=$1
shift
status=0
for lib in "$@"; do
    failed=0
    [ -f "$lib" ] || { echo "FAIL: $lib does not exist"; status=1; continue; }
    # strong definitions only: weak (W, V), unique (u) and local symbols come from headers or stay private;
    # an AddressSanitizer build (scripts/sanitize.sh) adds __odr_asan.NAME beside each exported variable NAME
    bad=$("$nm" -g --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[TDBRCGS]$/ {print $3}' | sed 's/^__odr_asan\.//' |
          grep -v -E '^moe_|^_Z.*_GLOBAL__N_' | sort -u)
    if [ -n "$bad" ]; then
        echo "FAIL: $lib exports names without the moe_ prefix:"
        printf '  %s\n' $bad
        failed=1
    fi
    case $(basename "$lib") in
    *cuda*) ;;
    *)
        cuda=$("$nm" "$lib" | awk '{print $NF}' | grep -E '^(cuda|cublas|nccl|cub|__cuda)|_cuda$' | sort -u)
        if [ -n "$cuda" ]; then
            echo "FAIL: $lib names CUDA symbols:"
            printf '  %s\n' $cuda
            failed=1
        fi
        ;;
    esac
    [ $failed -eq 0 ] && echo "ok: $lib ($("$nm" -g --defined-only "$lib" | awk 'NF == 3 && $2 ~ /^[TDBRCGS]$/' | wc -l) exported symbols)"
    [ $failed -eq 0 ] || status=1
done
exit $status
