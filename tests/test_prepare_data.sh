#!/bin/bash
# test_prepare_data.sh PYTHON SCRIPT_DIR WORKDIR [MOE_TRAIN] — scripts/prepare_data.py on a real corpus and a real
# tokenizer: the first chapters of the King James Bible (Debian's bible-kjv, one chapter a document) and a byte-level
# BPE tokenizer (1024 tokens + <|endoftext|>) trained here with the `tokenizers` package. Checked: every shard's
# header against its size, each document decoded back to its exact text, EOT before every document, shard sizes,
# the val split (whole leading documents), byte-identical shards for --workers 1 and 2 and for the same corpus as
# plain text, blank-line blocks, one file per document, JSON lines and gzip; --dtype uint32 holding the same
# tokens; a vocabulary above 65536 (uint32 by default, uint16 refused); the refusals (one line, exit 1, no
# traceback, no shard left); a run killed halfway leaving nothing; a local .tiktoken ranks file when tiktoken is
# importable; and, with MOE_TRAIN, 2 training steps on the shards with the --vocab the script prints.
# Exit 77 (skip) without `bible` or when PYTHON cannot import tokenizers.
set -euo pipefail
python=$1 scripts=$(cd "$2" && pwd) work=$3 train=${4:-}
[ -z "$train" ] || [[ $train == /* ]] || train=$PWD/$train  # the test runs in $work
prep=("$python" "$scripts/prepare_data.py")
if ! command -v bible > /dev/null; then
    echo "test_prepare_data: skipped: needs bible (apt-get install bible-kjv)"
    exit 77
fi
if ! "$python" -c 'import tokenizers' 2> /dev/null; then
    echo "test_prepare_data: skipped: $python cannot import tokenizers (pip install tokenizers)"
    exit 77
fi
# WORKDIR is emptied first: only one that this test made (its marker inside) or an empty one
if [ -n "$(ls -A "$work" 2> /dev/null)" ] && [ ! -e "$work/.test_prepare_data" ]; then
    echo "test_prepare_data: $work is not empty and not this test's work directory: not deleting it"
    exit 1
fi
rm -rf "$work"
mkdir -p "$work"
cd "$work"
touch .test_prepare_data
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
ok() { echo "ok: $*"; }
start=$(date +%s.%N)

# 1. The corpus: the first 150 chapters (Genesis to Numbers, 0.6 MB: a few seconds of the whole test on 2 cores),
# written in every input form, and the documents they must give (expected_*.json).
bible -f "gen1:1-rev22:21" > bible.txt
cat > make_corpus.py << 'EOF'
import gzip, json, os, re, sys
chapters, verses = [], []
for line in open("bible.txt", encoding="utf-8"):
    m = re.match(r"([1-3]?[A-Za-z]+[0-9]+):[0-9]+ (.*)$", line.rstrip("\n"))
    if not m:
        continue
    if not chapters or chapters[-1][0] != m.group(1):
        if len(chapters) == int(sys.argv[1]):
            break
        chapters.append((m.group(1), []))
    chapters[-1][1].append(m.group(2))
    verses.append(m.group(2))
docs = ["\n".join(v) for _, v in chapters]
with open("corpus.txt", "w") as f:               # blank-lines: chapters separated by a blank line
    f.write("\n\n".join(docs) + "\n")
with gzip.open("corpus.txt.gz", "wt") as f:
    f.write("\n\n".join(docs) + "\n")
with open("corpus.jsonl", "w") as f:             # JSON lines, other keys around the text
    for i, d in enumerate(docs):
        f.write(json.dumps({"id": i, "text": d, "meta": "kjv"}) + "\n")
with gzip.open("corpus.jsonl.gz", "wt") as f:
    for d in docs:
        f.write(json.dumps({"text": d}) + "\n")
os.makedirs("chapters")
for i, d in enumerate(docs):                     # --text-mode file: one chapter per file
    with open(f"chapters/ch{i:04d}.txt", "w") as f:
        f.write(d)
with open("verses.txt", "w") as f:               # --text-mode lines: one verse per line (first 20 chapters)
    f.write("\n".join(verses[:sum(len(v) for _, v in chapters[:20])]) + "\n")
json.dump(docs, open("expected_chapters.json", "w"))
json.dump(verses[:sum(len(v) for _, v in chapters[:20])], open("expected_verses.json", "w"))
print(f"corpus: {len(docs)} chapters, {sum(map(len, docs))} characters")
EOF
"$python" make_corpus.py 150

# 2. The tokenizer: byte-level BPE (every byte a token, so any text round-trips), <|endoftext|> added last (id 1024)
cat > train_tokenizer.py << 'EOF'
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=1024, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                              show_progress=False)
tok.train(["corpus.txt"], trainer)
tok.add_special_tokens(["<|endoftext|>"])
tok.save("tokenizer.json")
print("tokenizer:", tok.get_vocab_size(), "tokens, <|endoftext|> =", tok.token_to_id("<|endoftext|>"))
EOF
"$python" train_tokenizer.py

# The checker: check.py DIR PREFIX EXPECTED.json SHARD_TOKENS VAL_TOKENS DTYPE [--tiktoken RANKS] — every shard of
# DIR/PREFIX_{val,train}_*.bin read and checked, the documents decoded against EXPECTED.json; prints a summary.
cat > check.py << 'EOF'
import base64, glob, json, os, re, struct, sys
out, prefix, expected, shard_tokens, val_tokens, dtype = sys.argv[1:7]
shard_tokens, val_tokens = int(shard_tokens), int(val_tokens)
docs = json.load(open(expected))
if len(sys.argv) > 7:  # --tiktoken RANKS: decode by the ranks file itself; EOT is the id after the last rank
    ranks = {int(r): base64.b64decode(t) for t, r in (l.split() for l in open(sys.argv[8]) if l.strip())}
    eot = max(ranks) + 1
    decode = lambda ids: b"".join(ranks[i] for i in ids).decode("utf-8")
else:
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file("tokenizer.json")
    eot = tok.token_to_id("<|endoftext|>")
    decode = lambda ids: tok.decode(ids, skip_special_tokens=False)
magic, version, code = {"uint16": (20240520, 1, "H"), "uint32": (20240801, 7, "I")}[dtype]

def read_split(split):
    paths = sorted(glob.glob(os.path.join(out, f"{prefix}_{split}_*.bin")))
    names = [os.path.basename(p) for p in paths]
    assert names == [f"{prefix}_{split}_{i:06d}.bin" for i in range(len(paths))], names
    tokens, sizes = [], []
    for p in paths:
        data = open(p, "rb").read()
        header = struct.unpack("<256i", data[:1024])
        assert header[:2] == (magic, version), (p, header[:3])
        assert not any(header[3:]), p
        n = header[2]
        assert len(data) == 1024 + n * struct.calcsize(code), (p, n, len(data))
        tokens += struct.unpack(f"<{n}{code}", data[1024:])
        sizes.append(n)
    # every shard full but the last, which is not empty
    assert all(s == shard_tokens for s in sizes[:-1]) and 0 < sizes[-1] <= shard_tokens, (split, sizes)
    return tokens, sizes

def documents(tokens):
    assert tokens[0] == eot, "the stream does not start with EOT"
    cuts = [i for i, t in enumerate(tokens) if t == eot] + [len(tokens)]
    return [tokens[a + 1:b] for a, b in zip(cuts, cuts[1:])]

train, train_sizes = read_split("train")
val, val_sizes = read_split("val") if val_tokens else ([], [])
assert not glob.glob(os.path.join(out, ".*")), "temporary files left"
val_docs, train_docs = (documents(val) if val else []), documents(train)
assert len(val_docs) + len(train_docs) == len(docs), (len(val_docs), len(train_docs), len(docs))
for i, ids in enumerate(val_docs + train_docs):
    assert ids, f"document {i} has no tokens"
    text = decode(ids)
    assert text == docs[i], f"document {i} decodes to {text[:60]!r}..., want {docs[i][:60]!r}..."
if val_tokens:  # whole documents until at least val_tokens, not one more
    assert len(val) >= val_tokens and len(val) - (len(val_docs[-1]) + 1) < val_tokens, (len(val), val_tokens)
assert max(train + val) < 2 ** 16 or dtype == "uint32"
print(f"{len(docs)} documents decoded exactly: val {len(val)} tokens in {val_sizes}, train {len(train)} tokens "
      f"in {len(train_sizes)} shards")
json.dump(val + train, open(os.path.join(out, "tokens.json"), "w"))  # for comparisons between runs
EOF

check() { # WHAT DIR PREFIX EXPECTED SHARD_TOKENS VAL_TOKENS DTYPE [--tiktoken RANKS]
    local what=$1
    shift
    if "$python" check.py "$@" > check.txt 2>&1; then
        ok "$what: $(tail -n 1 check.txt)"
    else
        fail "$what:"; cat check.txt
    fi
}
same_shards() { # WHAT DIR_A DIR_B: the same shard files, byte for byte
    local a b differ=0
    for a in "$2"/*.bin; do
        b="$3/$(basename "$a")"
        cmp -s "$a" "$b" || differ=1
    done
    [ "$(ls "$2"/*.bin | wc -l)" -eq "$(ls "$3"/*.bin | wc -l)" ] || differ=1
    [ $differ -eq 0 ] && ok "$1: byte-identical shards" || fail "$1: shards differ ($2 vs $3)"
}
run_ok() { # WHAT PREPARE_DATA_ARGS...: runs it, keeps its stdout in run.txt
    local what=$1
    shift
    if "${prep[@]}" --tokenizer tokenizer.json --quiet "$@" > run.txt 2> run_err.txt; then
        return 0
    fi
    fail "$what: prepare_data.py $* failed:"
    cat run.txt run_err.txt
    return 1
}

# 3. Plain text (blank-line blocks), 2 workers: small shards and a val split; the summary names the --vocab
shard=40000 val=12000
if "${prep[@]}" --tokenizer tokenizer.json --text-mode blank-lines --out-dir text --shard-tokens $shard \
        --val-tokens $val --workers 2 corpus.txt > summary.txt 2> progress.txt; then
    cat summary.txt
    check "text, 2 workers" text data expected_chapters.json $shard $val uint16
    grep -q "moe-train's --vocab must be at least 1025$" summary.txt && ok "--vocab 1025 printed" ||
        fail "no --vocab 1025 line in the summary"
    grep -q "EOT '<|endoftext|>' = 1024 before every document" summary.txt && ok "EOT named" || fail "EOT line"
    if "$python" -c 'import tqdm' 2> /dev/null; then  # without tqdm a plain line comes every 5 s: none in this run
        grep -q "tok/s" progress.txt && ok "a tqdm progress line on stderr" || { fail "progress:"; cat progress.txt; }
    fi
else
    fail "text, 2 workers:"; cat summary.txt progress.txt
fi
# the same corpus through every other door gives the same bytes
run_ok "1 worker" --text-mode blank-lines --out-dir text_w1 --shard-tokens $shard --val-tokens $val --workers 1 \
    corpus.txt && same_shards "--workers 1 vs 2" text text_w1
# a file named three ways (a glob's match, ./name, its absolute path) is read once (before: three times, silently)
run_ok "one file named three ways" --text-mode blank-lines --out-dir text_thrice --shard-tokens $shard \
    --val-tokens $val --workers 2 'corpus.tx[t]' ./corpus.txt "$PWD/corpus.txt" &&
    same_shards "one file named three ways" text text_thrice
run_ok "text.gz" --text-mode blank-lines --out-dir text_gz --shard-tokens $shard --val-tokens $val --workers 2 \
    corpus.txt.gz && same_shards "corpus.txt.gz" text text_gz
run_ok "jsonl" --out-dir jsonl --shard-tokens $shard --val-tokens $val --workers 2 corpus.jsonl &&
    same_shards "JSON lines" text jsonl
run_ok "jsonl.gz" --out-dir jsonl_gz --shard-tokens $shard --val-tokens $val --workers 2 corpus.jsonl.gz &&
    same_shards "JSON lines, gzip" text jsonl_gz
run_ok "file per document" --text-mode file --out-dir files --shard-tokens $shard --val-tokens $val --workers 2 \
    'chapters/ch*.txt' && same_shards "--text-mode file, a glob of 150 files" text files
run_ok "lines" --text-mode lines --out-dir lines --shard-tokens 10000 --workers 2 verses.txt &&
    check "--text-mode lines (a verse a document), no val" lines data expected_verses.json 10000 0 uint16
# uint32 tokens: the other header, the same token values
if run_ok "uint32" --text-mode blank-lines --out-dir text32 --shard-tokens $shard --val-tokens $val --workers 2 \
        --dtype uint32 corpus.txt; then
    check "--dtype uint32" text32 data expected_chapters.json $shard $val uint32
    cmp -s text/tokens.json text32/tokens.json && ok "uint32 tokens equal the uint16 ones" ||
        fail "uint32 tokens differ from uint16"
fi

# Parquet, when pyarrow is there
if "$python" -c 'import pyarrow' 2> /dev/null; then
    "$python" -c '
import json, pyarrow, pyarrow.parquet
docs = json.load(open("expected_chapters.json"))
table = pyarrow.table({"n": list(range(len(docs))), "text": docs})
pyarrow.parquet.write_table(table, "corpus.parquet", row_group_size=40)  # 4 row groups'
    run_ok "parquet" --out-dir parquet --shard-tokens $shard --val-tokens $val --workers 2 corpus.parquet &&
        same_shards "Parquet" text parquet
else
    echo "skip: Parquet input not tested ($python cannot import pyarrow)"
fi

# 4. A vocabulary past 65536 (a word-level tokenizer, ids up to 69999): uint32 by default, uint16 refused
cat > big_vocab.py << 'EOF'
from tokenizers import Tokenizer, models, pre_tokenizers
vocab = {"[UNK]": 0, "in": 1, "the": 2, "beginning": 69999}
vocab.update({f"w{i}": i for i in range(3, 69999)})
tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.save("big.json")
EOF
"$python" big_vocab.py
printf 'In the beginning\n' > big.txt
if "${prep[@]}" --tokenizer big.json --eot 0 --out-dir big --quiet big.txt 2> big_err.txt &&
   "$python" - << 'EOF'
import struct
data = open("big/data_train_000000.bin", "rb").read()
header = struct.unpack("<3i", data[:12])
tokens = struct.unpack(f"<{header[2]}I", data[1024:])
assert header == (20240801, 7, 4) and tokens == (0, 0, 2, 69999), (header, tokens)
EOF
then
    ok "vocabulary 70000: uint32 shards by default, token 69999 kept"
else
    fail "vocabulary 70000"; cat big_err.txt
fi

# 5. Refusals: exit 1, one line naming the problem, no traceback, no shard written
refuses() { # PATTERN PREPARE_DATA_ARGS...
    local pattern=$1 rc=0
    shift
    "${prep[@]}" "$@" > refuse_out.txt 2> refuse_err.txt || rc=$?
    # the error is one line, the last (a progress bar may come before it when the problem is met halfway)
    if [ $rc -eq 1 ] && [ "$(grep -c 'error:' refuse_err.txt)" -eq 1 ] &&
       tail -n 1 refuse_err.txt | grep -Eq -e "$pattern" &&
       ! grep -q Traceback refuse_err.txt && [ -z "$(ls -A refused 2> /dev/null)" ]; then
        ok "refused: $(tail -n 1 refuse_err.txt)"
    else
        fail "not refused as /$pattern/ (exit $rc): prepare_data.py $*"
        cat refuse_out.txt refuse_err.txt
        ls -A refused 2> /dev/null || true
    fi
    rm -rf refused
}
tk=(--tokenizer tokenizer.json --out-dir refused)
refuses "no input files match 'nothing/\*.jsonl'" "${tk[@]}" 'nothing/*.jsonl'
refuses "no input files match 'missing.txt'" "${tk[@]}" missing.txt
ln -s no-such-file dangling.txt
refuses "cannot read dangling.txt: No such file or directory" "${tk[@]}" dangling.txt
head -n 2 corpus.jsonl > bad.jsonl
echo '{"id": 2, "txt": "the wrong key"}' >> bad.jsonl
refuses "bad.jsonl:3: no 'text' key" "${tk[@]}" bad.jsonl
echo '{"text": "cut off' > broken.jsonl
refuses "broken.jsonl:1: not valid JSON" "${tk[@]}" broken.jsonl
printf '{"text": "hello"}\n{"text": "a\\ud800b"}\n' > surrogate.jsonl # valid JSON, no Unicode text (was replaced)
refuses "surrogate.jsonl:2: 'text' holds a lone surrogate" "${tk[@]}" surrogate.jsonl
printf '\n  \n\n' > empty.txt
refuses "empty corpus" "${tk[@]}" --text-mode blank-lines empty.txt
refuses "all [0-9]+ went to val .*--val-tokens 100000000" "${tk[@]}" --val-tokens 100000000 corpus.jsonl
refuses "--dtype uint16: the vocabulary has 70000 tokens" --tokenizer big.json --eot 0 --dtype uint16 \
    --out-dir refused big.txt
refuses "none of <\|endoftext\|>, </s>, <\|end_of_text\|>, <eos>: give the end-of-text token with --eot" \
    --tokenizer big.json --out-dir refused big.txt
refuses "--eot '<eos>' is not a token" "${tk[@]}" --eot '<eos>' corpus.jsonl
refuses "Parquet input needs pyarrow: pip install pyarrow|not a readable Parquet file" "${tk[@]}" \
    --format parquet corpus.jsonl
refuses "cannot load tokenizer nope.json" --tokenizer nope.json --out-dir refused corpus.jsonl
# an error in the second file, after the first one's shards were complete: nothing of the run is left
mkdir -p refused
refuses "bad.jsonl:3: no 'text' key" "${tk[@]}" --shard-tokens 5000 corpus.jsonl bad.jsonl
# existing shards: refused without --force; --force replaces all of them (none of the 11 old ones left over)
rc=0
"${prep[@]}" --tokenizer tokenizer.json --out-dir text --quiet corpus.jsonl 2> exists_err.txt || rc=$?
if [ $rc -eq 1 ] && grep -q "text already holds [0-9]* shard(s) of prefix 'data' .*use --force" exists_err.txt &&
   same_shards "untouched after the refusal" text text_w1 > /dev/null; then
    ok "refused: $(cat exists_err.txt)"
else
    fail "existing shards not refused (exit $rc):"; cat exists_err.txt
fi
# (a file of the user's whose name starts like a shard's stays: [0-9]*.bin took data_train_2024-backup.bin, a probe)
echo mine > text/data_train_2024-backup.bin
run_ok "--force" --out-dir text --shard-tokens 100000 --workers 2 --force corpus.jsonl
[ -f text/data_train_2024-backup.bin ] && ok "--force left data_train_2024-backup.bin" &&
    rm text/data_train_2024-backup.bin || fail "--force deleted data_train_2024-backup.bin, not a shard"
check "--force: old shards replaced (none stale)" text data expected_chapters.json 100000 0 uint16
# an input that is one of the shards --force replaces (a probe, 2026-12-07: deleted before it was read)
rc=0
cp text/data_train_000000.bin own_shard.bin
"${prep[@]}" --tokenizer tokenizer.json --out-dir text --force --quiet text/data_train_000000.bin 2> own_err.txt ||
    rc=$?
if [ $rc -eq 1 ] && grep -q "input text/data_train_000000.bin is .*a shard of prefix 'data' that this run writes over" \
    own_err.txt && cmp -s own_shard.bin text/data_train_000000.bin; then
    ok "refused, the input kept: $(cat own_err.txt)"
else
    fail "an input among the shards --force replaces not refused (exit $rc):"; cat own_err.txt
fi

# 6. Interrupted (SIGTERM) halfway, with shards written: exit 130, no shard and no temporary file left. The input
# is a pipe fed 50 copies of the corpus (far more than the seconds this takes).
mkfifo pipe.txt
"${prep[@]}" --tokenizer tokenizer.json --text-mode blank-lines --out-dir killed --shard-tokens 5000 --workers 2 \
    --quiet pipe.txt > killed_out.txt 2>&1 &
pid=$!
for _ in $(seq 1 50); do cat corpus.txt; done > pipe.txt 2> /dev/null &
feeder=$!
for _ in $(seq 1 100); do [ -e killed/data_train_000001.bin ] && break; sleep 0.1; done
had_shards=$(ls killed 2> /dev/null | wc -l || true)
kill -TERM $pid
rc=0
wait $pid || rc=$?
kill $feeder 2> /dev/null || true
wait $feeder 2> /dev/null || true
if [ "$had_shards" -gt 1 ] && [ $rc -eq 130 ] && [ -z "$(ls -A killed)" ] && grep -q "interrupted" killed_out.txt; then
    ok "SIGTERM after $had_shards shards: exit 130, $(cat killed_out.txt)"
else
    fail "SIGTERM: exit $rc with $had_shards shards before; left: $(ls -A killed | tr '\n' ' ')"; cat killed_out.txt
fi

# 7. A local tiktoken ranks file: the 256 bytes and the 300 most frequent byte pairs of the corpus
if "$python" -c 'import tiktoken' 2> /dev/null; then
    "$python" - << 'EOF'
import base64, collections
data = open("corpus.txt", "rb").read()
pairs = collections.Counter(data[i:i + 2] for i in range(len(data) - 1))
tokens = [bytes([b]) for b in range(256)] + [p for p, _ in pairs.most_common(300)]
with open("ranks.tiktoken", "w") as f:
    for rank, t in enumerate(tokens):
        f.write(f"{base64.b64encode(t).decode()} {rank}\n")
EOF
    if "${prep[@]}" --tiktoken ranks.tiktoken --text-mode blank-lines --out-dir tiktoken --shard-tokens $shard \
            --val-tokens $val --workers 2 corpus.txt > tiktoken.txt 2>&1; then
        check "--tiktoken ranks.tiktoken (EOT = 556)" tiktoken data expected_chapters.json $shard $val uint16 \
            --tiktoken ranks.tiktoken
        grep -q "at least 557$" tiktoken.txt && ok "tiktoken: --vocab 557" || fail "tiktoken vocabulary:"
    else
        fail "--tiktoken:"; cat tiktoken.txt
    fi
else
    echo "skip: --tiktoken not tested ($python cannot import tiktoken)"
fi

# 8. moe-train: 2 steps on the first shards with the printed --vocab (uint16 and uint32); one less is refused
if [ -n "$train" ]; then
    tiny=(--d-model 32 --layers 1 --heads 2 --kv-heads 2 --d-ff 32 --experts 2 --top-k 1 --seq-len 32 --batch 4
          --steps 2 --warmup 1 --eval-batches 1 --sample-tokens 0 --threads 1)
    for d in text_w1 text32; do
        if timeout 120 "$train" "${tiny[@]}" --vocab 1025 --train-data $d/data_train_000000.bin \
                --val-data $d/data_val_000000.bin > train_$d.txt 2>&1 &&
           grep -q "^step     2 .* | val " train_$d.txt; then
            ok "moe-train, $d shards: $(grep '^step     2' train_$d.txt | cut -c 1-40)"
        else
            fail "moe-train on $d:"; tail -n 20 train_$d.txt
        fi
    done
    if timeout 120 "$train" "${tiny[@]}" --vocab 1024 --train-data text_w1/data_train_000000.bin \
            --val-data text_w1/data_val_000000.bin > train_small.txt 2>&1; then
        fail "moe-train --vocab 1024 accepted token 1024"
    else
        ok "moe-train --vocab 1024 refused: $(grep -m 1 -i "vocab\|token" train_small.txt | cut -c 1-120)"
    fi
else
    echo "skip: no moe-train given"
fi

seconds=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
echo "test_prepare_data: $failures failure(s) in $seconds s"
[ "$failures" -eq 0 ]
