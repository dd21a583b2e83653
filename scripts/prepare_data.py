#!/usr/bin/env python3
"""prepare_data.py — a text corpus to llm.c token shards for moe-train, with a real tokenizer.

    scripts/prepare_data.py --tokenizer tok/tokenizer.json --out-dir data/corpus --val-tokens 1000000 'texts/*.jsonl.gz'

Inputs (files or globs, read in the order given, each glob's matches sorted):
  *.txt (and any other name)  plain UTF-8 text; --text-mode file: the whole file is one document (default);
                              blank-lines: documents are runs of lines separated by blank lines (the last line ending
                              of each dropped); lines: each line is a document (without its line ending)
  *.jsonl, *.json             JSON lines: one object per line, the document in its --text-key field (default "text")
  *.parquet                   the --text-key column (needs pyarrow: pip install pyarrow)
  a trailing .gz              gzip-compressed text or JSON lines (a.txt.gz, a.jsonl.gz)
Documents with nothing but whitespace are skipped. The text is tokenized as it is (no normalisation added here).

Tokenizers (exactly one):
  --tokenizer PATH/tokenizer.json   Hugging Face `tokenizers` (Tokenizer.from_file; nothing is downloaded). Encoded
                                    without the post-processor's special tokens (no BOS added), and with special-token
                                    text in a document (a literal "<|endoftext|>") encoded as ordinary text, so that no
                                    document can forge a document boundary.
  --tiktoken NAME                   a tiktoken encoding (gpt2, cl100k_base, o200k_base, ...) from tiktoken's own cache
                                    (tiktoken fetches it there on first use; set TIKTOKEN_CACHE_DIR for an offline copy)
  --tiktoken PATH.tiktoken          a local BPE-ranks file (lines "<base64 token bytes> <rank>"; every single byte must
                                    be a token) built into an Encoding here. Text is split before BPE by
                                    --tiktoken-pattern, by default GPT-2's rule written as DEFAULT_TIKTOKEN_PATTERN
                                    below: English contractions, runs of letters, of digits, of other symbols (each
                                    with at most one leading space), then whitespace. Give the pattern the ranks were
                                    trained with to reproduce another encoding exactly. The EOT token (the --eot
                                    string, default "<|endoftext|>") is added as a special token with the id after the
                                    highest rank. tiktoken encodes with encode_ordinary (special-token text as text).

End of text: every document is PRECEDED by the EOT token, so each split's stream is EOT doc EOT doc ... (llm.c's
fineweb convention). --eot takes a token string or an integer id; by default the first of <|endoftext|>, </s>,
<|end_of_text|>, <eos> that the tokenizer has.

Output (llm.c's format, read by train/dataloader.h): a header of 256 little-endian int32 — [0] magic, [1] version,
[2] token count N — then N little-endian tokens: magic 20240520 version 1 with uint16 tokens when the vocabulary
(special tokens included) has at most 65536 entries, else magic 20240801 version 7 with uint32 tokens (--dtype
overrides; uint16 is refused for a vocabulary that does not fit). Files DIR/PREFIX_val_000000.bin, ... and
DIR/PREFIX_train_000000.bin, ...: --shard-tokens tokens each (the last shorter; a document may straddle two shards).
--val-tokens N: the corpus's first documents go to val until it holds at least N tokens, the rest to train.

Determinism: the shards are byte-identical for any --workers. Documents are read in order, in chunks, tokenized in
worker processes with results taken back in input order, and the chunking does not depend on --workers.

Failures: a clear one-line error on stderr and exit status 1 (2 for bad flags). A shard is written to a hidden
temporary name and renamed when complete; a run that fails or is interrupted removes its temporary file and the
shards it had completed, so a directory never holds a partial run. Existing shards of the prefix are refused unless
--force, which deletes them all first (no stale higher-numbered shard survives a shorter corpus).
"""
import argparse
import collections
import contextlib
import glob
import importlib
import gzip
import json
import multiprocessing
import os
import re
import signal
import struct
import sys
import time
import zlib
from array import array

# Our worker processes are the parallelism: the Rust tokenizer's own thread pool inside each of them would
# oversubscribe the cores (and it warns when a process that used it forks). Set before `tokenizers` is imported.
os.environ["TOKENIZERS_PARALLELISM"] = "false"

PROG = "prepare_data"
HEADER_INTS = 256
FORMATS = {  # dtype -> (magic, version, array typecode, bytes per token)
    "uint16": (20240520, 1, "H", 2),
    "uint32": (20240801, 7, "I", 4),
}
UINT16_VOCAB_MAX = 1 << 16
DEFAULT_EOT_CANDIDATES = ["<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"]
# GPT-2's pre-tokenisation rule (see the docstring): contractions, then letters, digits and other symbols each with
# one optional leading space, then whitespace (a run before a word leaves its last space to the word).
DEFAULT_TIKTOKEN_PATTERN = r"""'(?:s|t|re|ve|m|ll|d)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
CHUNK_DOCS = 1024           # documents per task sent to a worker ...
CHUNK_CHARS = 512 << 10     # ... or fewer once they hold this much text: small enough to spread a few MB over
                            # the workers, large enough that a task's overhead (pickling, a round trip) is noise
PROGRESS_PLAIN_SECONDS = 5  # the plain progress line (without tqdm) is printed this often


class PrepareError(Exception):
    """A problem with the input or the flags: reported as one line, exit status 1."""


class Interrupted(BaseException):
    """SIGTERM, raised like KeyboardInterrupt so that the cleanup runs."""


# ---------------------------------------------------------------------------------------------------------------
# Command line

class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Shows a flag's default where it has one (argparse's own formatter also prints 'default: None')."""

    def _get_help_string(self, action):
        text = action.help or ""
        if action.option_strings and action.default not in (None, False, argparse.SUPPRESS) and "default" not in text:
            text += " (default: %(default)s)"
        return text


EPILOG = """\
example:
  prepare_data.py --tokenizer tok/tokenizer.json --out-dir data/corpus --val-tokens 1000000 'texts/*.jsonl.gz'
  moe-train --train-data data/corpus/data_train_000000.bin --val-data data/corpus/data_val_000000.bin --vocab V
  (V: the vocabulary size this script prints at the end; moe-train's --vocab must be at least it)

shards: a header of 256 little-endian int32 (magic, version, token count N, zeros), then N little-endian tokens:
  uint16 (magic 20240520, version 1) for vocabularies up to 65536, else uint32 (magic 20240801, version 7).
  Written under a temporary name and renamed when complete; a failed or interrupted run leaves none of its shards.
"""


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="prepare_data.py",
        description="Tokenize a text corpus into llm.c token shards for moe-train (docs/DATA.md). Every "
                    "document is preceded by the EOT token: EOT doc EOT doc ...",
        epilog=EPILOG, formatter_class=HelpFormatter)
    p.add_argument("inputs", nargs="+", metavar="INPUT",
                   help="files or globs (quote them): .txt, .jsonl/.json, .parquet; .gz for text and JSON lines")
    tok = p.add_mutually_exclusive_group(required=True)
    tok.add_argument("--tokenizer", metavar="TOKENIZER_JSON", help="a Hugging Face tokenizer.json")
    tok.add_argument("--tiktoken", metavar="NAME_OR_PATH",
                     help="a tiktoken encoding name (from tiktoken's cache) or a local .tiktoken BPE-ranks file")
    p.add_argument("--tiktoken-pattern", default=None,
                   help="with a local .tiktoken file: the pre-tokenisation regex (default: GPT-2's rule)")
    p.add_argument("--eot", default=None,
                   help="end-of-text token (string or integer id) put before every document (default: the first "
                        "of " + ", ".join(DEFAULT_EOT_CANDIDATES) + " in the tokenizer)")
    p.add_argument("--out-dir", required=True, help="directory of the shards (created if missing)")
    p.add_argument("--prefix", default="data", help="shard names: PREFIX_train_000000.bin, PREFIX_val_000000.bin")
    p.add_argument("--shard-tokens", type=int, default=100_000_000,
                   help="tokens per shard (the last one shorter; a document may straddle two shards)")
    p.add_argument("--val-tokens", type=int, default=0,
                   help="validation split: the first documents of the corpus go to val until it holds at least "
                        "this many tokens (whole documents), the rest to train; 0: no val shards")
    p.add_argument("--dtype", choices=["auto", "uint16", "uint32"], default="auto",
                   help="token width: auto is uint16 for vocabularies up to 65536, else uint32")
    p.add_argument("--format", choices=["auto", "text", "jsonl", "parquet"], default="auto",
                   help="input format (auto: by the file name, .gz stripped; unknown names are text)")
    p.add_argument("--text-mode", choices=["file", "blank-lines", "lines"], default="file",
                   help="plain text: one document per file, per blank-line-separated block, or per line")
    p.add_argument("--text-key", default="text", help="JSON lines key / Parquet column of the documents")
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                   help="tokenizer processes (1: in this process); the output does not depend on it (default: "
                        "the CPU count, here %(default)s)")
    p.add_argument("--force", action="store_true", help="delete existing shards of this prefix in --out-dir first")
    p.add_argument("--quiet", action="store_true", help="no progress line and no summary")
    args = p.parse_args(argv)
    if not 1 <= args.shard_tokens <= 2**31 - 1:  # the header's count is an int32
        p.error("--shard-tokens must be 1 .. 2147483647")
    if args.val_tokens < 0:
        p.error("--val-tokens must be 0 or more")
    if args.workers < 1:
        p.error("--workers must be at least 1")
    if not args.prefix or "/" in args.prefix or args.prefix.startswith("."):
        p.error("--prefix must be a plain file name start (no '/', not starting with '.')")
    if args.tiktoken_pattern is not None and not (args.tiktoken and os.path.isfile(args.tiktoken)):
        p.error("--tiktoken-pattern applies only to --tiktoken with a local ranks file")
    return args


# ---------------------------------------------------------------------------------------------------------------
# Inputs and documents

def expand_inputs(patterns):
    """The files of the arguments in order: a glob's matches sorted (so the corpus order is reproducible);
    each file once, however it is named (a glob's match, ./name, an absolute path, a link: by the file itself)."""
    paths, seen = [], set()
    for pattern in patterns:
        if glob.has_magic(pattern):
            matches = sorted(m for m in glob.glob(pattern, recursive=True) if not os.path.isdir(m))
        else:
            matches = [pattern] if os.path.lexists(pattern) else []
        if not matches:
            raise PrepareError(f"no input files match {pattern!r}")
        for m in matches:
            if os.path.isdir(m):
                raise PrepareError(f"{m} is a directory (give its files, e.g. '{m}/*.txt')")
            key = os.path.realpath(m)
            if key not in seen:
                seen.add(key)
                paths.append(m)
    return paths


def input_format(path, forced):
    if forced != "auto":
        return forced
    name = path[:-3] if path.endswith(".gz") else path
    if name.endswith((".jsonl", ".json")):
        return "jsonl"
    if name.endswith(".parquet"):
        return "parquet"
    return "text"


def check_inputs(paths, args):
    """Fail before any work: every file readable, pyarrow present when a Parquet file is given."""
    for path in paths:
        if os.path.exists(path) and not os.path.isfile(path):
            continue  # a pipe or a device: opening it here could block or take its data
        try:
            open(path, "rb").close()
        except OSError as e:
            raise PrepareError(f"cannot read {path}: {e.strerror or e}") from None
    if any(input_format(p, args.format) == "parquet" for p in paths):
        try:
            importlib.import_module("pyarrow.parquet")
        except ImportError:
            raise PrepareError("Parquet input needs pyarrow: pip install pyarrow") from None


def open_text(path):
    # newline="": line endings come through as they are in the file (a document's text is not rewritten)
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", newline="")
    return open(path, "r", encoding="utf-8", newline="")


def strip_line_ending(line):
    if line.endswith("\r\n"):
        return line[:-2]
    if line.endswith(("\n", "\r")):
        return line[:-1]
    return line


def text_documents(path, mode):
    with open_text(path) as f:
        if mode == "file":
            yield f.read()
        elif mode == "lines":
            for line in f:
                yield strip_line_ending(line)
        else:  # blank-lines
            block = []
            for line in f:
                if line.strip():
                    block.append(line)
                elif block:
                    yield strip_line_ending("".join(block))
                    block = []
            if block:
                yield strip_line_ending("".join(block))


def jsonl_documents(path, key):
    with open_text(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise PrepareError(f"{path}:{lineno}: not valid JSON at column {e.colno} ({e.msg})") from None
            if not isinstance(obj, dict):
                raise PrepareError(f"{path}:{lineno}: not a JSON object")
            if key not in obj:
                raise PrepareError(f"{path}:{lineno}: no {key!r} key in this JSON object (--text-key)")
            if not isinstance(obj[key], str):
                raise PrepareError(f"{path}:{lineno}: {key!r} is not a string")
            try:  # a lone surrogate escape (\ud800) is valid JSON but no Unicode text: the tokenizer replaced it
                obj[key].encode("utf-8")
            except UnicodeEncodeError as e:
                raise PrepareError(f"{path}:{lineno}: {key!r} holds a lone surrogate ({e.object[e.start]!r}), "
                                   "not Unicode text") from None
            yield obj[key]


def parquet_documents(path, key):
    import pyarrow
    import pyarrow.parquet as pq
    try:
        pf = pq.ParquetFile(path)
        if key not in pf.schema_arrow.names:
            raise PrepareError(f"{path}: no column {key!r} (--text-key); columns: {', '.join(pf.schema_arrow.names)}")
        row = 0
        for batch in pf.iter_batches(batch_size=1024, columns=[key]):
            for text in batch.column(0).to_pylist():
                row += 1
                if not isinstance(text, str):
                    raise PrepareError(f"{path}: row {row}: {key!r} is {'null' if text is None else 'not a string'}")
                yield text
    except pyarrow.ArrowException as e:
        raise PrepareError(f"{path}: not a readable Parquet file ({e})") from None


def file_documents(path, args):
    """The documents of one file, with its read errors turned into one-line errors naming it."""
    fmt = input_format(path, args.format)
    try:
        if fmt == "jsonl":
            yield from jsonl_documents(path, args.text_key)
        elif fmt == "parquet":
            yield from parquet_documents(path, args.text_key)
        else:
            yield from text_documents(path, args.text_mode)
    except UnicodeDecodeError as e:
        raise PrepareError(f"{path}: not UTF-8 text ({e.reason}, byte 0x{e.object[e.start]:02x}): convert it "
                           f"first (e.g. iconv -t UTF-8)") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise PrepareError(f"{path}: broken gzip data ({e or 'truncated'})") from None
    except OSError as e:
        raise PrepareError(f"cannot read {path}: {e.strerror or e}") from None


class Counts:
    def __init__(self):
        self.documents = 0
        self.skipped = 0   # documents with nothing but whitespace
        self.tokens = 0


def documents(paths, args, counts):
    for path in paths:
        for text in file_documents(path, args):
            if text.strip():
                yield text
            else:
                counts.skipped += 1


def chunks(docs):
    """Lists of documents, cut by count and size only: the same chunks whatever --workers is."""
    chunk, chars = [], 0
    for doc in docs:
        chunk.append(doc)
        chars += len(doc)
        if len(chunk) >= CHUNK_DOCS or chars >= CHUNK_CHARS:
            yield chunk
            chunk, chars = [], 0
    if chunk:
        yield chunk


# ---------------------------------------------------------------------------------------------------------------
# Tokenizers: loaded once in the main process (vocabulary, EOT) and once in each worker from the same spec

def read_tiktoken_ranks(path):
    import base64
    ranks = {}
    try:
        with open(path, "rb") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    token, rank = line.split()
                    ranks[base64.b64decode(token, validate=True)] = int(rank)
                except ValueError:
                    raise PrepareError(f"{path}:{lineno}: not a '<base64 token> <rank>' line") from None
    except OSError as e:
        raise PrepareError(f"cannot read {path}: {e.strerror or e}") from None
    missing = [b for b in range(256) if bytes([b]) not in ranks]
    if missing:
        raise PrepareError(f"{path}: byte 0x{missing[0]:02x} is not a token ({len(missing)} of the 256 single "
                           f"bytes missing): tiktoken needs every byte")
    return ranks


def eot_name_for_local_ranks(eot):
    return eot if eot is not None and not eot.lstrip("-").isdigit() else DEFAULT_EOT_CANDIDATES[0]


class Encoder:
    """One tokenizer behind one interface: ids of texts, vocabulary size, token lookup."""

    def __init__(self, spec):
        kind, source, pattern, eot = spec
        self.kind = kind
        if kind == "hf":
            self._load_hf(source)
        else:
            self._load_tiktoken(source, pattern, eot)

    def _load_hf(self, path):
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise PrepareError("--tokenizer needs the tokenizers package: pip install tokenizers") from None
        try:
            self.tok = Tokenizer.from_file(path)
        except Exception as e:  # the Rust side raises plain Exception for a missing or malformed file
            raise PrepareError(f"cannot load tokenizer {path}: {e}") from None
        # special-token text inside a document is ordinary text (documents cannot inject an EOT)
        if hasattr(self.tok, "encode_special_tokens"):
            self.tok.encode_special_tokens = True
        vocab = self.tok.get_vocab(with_added_tokens=True)
        # ids may have holes: the size moe-train needs is the largest id + 1
        self.vocab_size = max(self.tok.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)

    def _load_tiktoken(self, source, pattern, eot):
        try:
            import tiktoken
        except ImportError:
            raise PrepareError("--tiktoken needs the tiktoken package: pip install tiktoken") from None
        if os.path.isfile(source):
            ranks = read_tiktoken_ranks(source)
            special = {eot_name_for_local_ranks(eot): max(ranks.values()) + 1}
            try:
                self.tok = tiktoken.Encoding(name=os.path.basename(source), pat_str=pattern or DEFAULT_TIKTOKEN_PATTERN,
                                             mergeable_ranks=ranks, special_tokens=special)
            except Exception as e:
                raise PrepareError(f"cannot build a tiktoken encoding from {source}: {e}") from None
        else:
            try:
                self.tok = tiktoken.get_encoding(source)
            except ValueError as e:  # tiktoken's "Unknown encoding"
                raise PrepareError(f"{source!r} is neither a file nor a tiktoken encoding: {e}") from None
            except Exception as e:  # typically no network to fill tiktoken's cache
                raise PrepareError(f"cannot load tiktoken encoding {source!r} (tiktoken fetches it into its cache "
                                   f"on first use; or give a local .tiktoken file): {e}") from None
        self.vocab_size = self.tok.n_vocab

    def token_id(self, text):
        if self.kind == "hf":
            return self.tok.token_to_id(text)
        try:
            return self.tok.encode_single_token(text)
        except KeyError:
            return None

    def token_text(self, token):
        if self.kind == "hf":
            return self.tok.id_to_token(token)
        try:
            return self.tok.decode_single_token_bytes(token).decode("utf-8", "replace")
        except KeyError:
            return None

    def encode(self, texts):
        if self.kind == "hf":
            return [e.ids for e in self.tok.encode_batch(texts, add_special_tokens=False)]
        return [self.tok.encode_ordinary(t) for t in texts]


def resolve_eot(encoder, eot):
    """(id, name) of the token put before every document."""
    if eot is not None and eot.lstrip("-").isdigit():
        token = int(eot)
        if not 0 <= token < encoder.vocab_size:
            raise PrepareError(f"--eot {token} is outside the vocabulary (0 .. {encoder.vocab_size - 1})")
        return token, encoder.token_text(token) or f"id {token}"
    candidates = [eot] if eot is not None else DEFAULT_EOT_CANDIDATES
    for name in candidates:
        token = encoder.token_id(name)
        if token is not None:
            return token, name
    if eot is not None:
        raise PrepareError(f"--eot {eot!r} is not a token of this tokenizer")
    raise PrepareError("the tokenizer has none of " + ", ".join(DEFAULT_EOT_CANDIDATES) +
                       ": give the end-of-text token with --eot TOKEN (a string or an id)")


def choose_dtype(requested, vocab_size):
    if requested == "auto":
        return "uint16" if vocab_size <= UINT16_VOCAB_MAX else "uint32"
    if requested == "uint16" and vocab_size > UINT16_VOCAB_MAX:
        raise PrepareError(f"--dtype uint16: the vocabulary has {vocab_size} tokens, more than uint16's "
                           f"{UINT16_VOCAB_MAX}: use --dtype uint32 (or auto)")
    return requested


# ---------------------------------------------------------------------------------------------------------------
# Tokenizing: a chunk of documents -> one array of the shard dtype (EOT before each) and each document's length

_worker = {}


def init_worker(spec, eot_id, typecode, in_child):
    if in_child:
        # Ctrl-C reaches the whole process group: only the main process acts on it (it terminates the pool)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked since the fork: see tokenized_chunks
    _worker.update(encoder=Encoder(spec), eot=eot_id, typecode=typecode)


def encode_chunk(texts):
    eot, typecode = _worker["eot"], _worker["typecode"]
    tokens = array(typecode)
    lengths = []
    for ids in _worker["encoder"].encode(texts):
        tokens.append(eot)
        try:
            tokens.extend(ids)
        except OverflowError:  # only uint16 can overflow: an id past the vocabulary the tokenizer declared
            raise PrepareError(f"token id {max(ids)} does not fit --dtype uint16 (ids up to 65535): "
                               f"use --dtype uint32") from None
        lengths.append(len(ids) + 1)
    return tokens, lengths, (max(tokens) if tokens else -1)


def ordered_map(pool, fn, items, window):
    """pool.imap's ordered results, but with at most `window` tasks queued: Pool.imap reads its whole input ahead
    (a corpus would end up in memory when the workers are slower than the reader). The input is read in this
    thread, where a signal can interrupt it; finished results are taken whenever they are first in line as the next
    chunk goes out (an input that stalls, such as a quiet pipe, holds back up to `window` chunks' shards)."""
    pending = collections.deque()
    for item in items:
        pending.append(pool.apply_async(fn, (item,)))
        while pending and (len(pending) >= window or pending[0].ready()):
            yield pending.popleft().get()
    while pending:
        yield pending.popleft().get()


# ---------------------------------------------------------------------------------------------------------------
# Shards

def shard_name(prefix, split, index):
    return f"{prefix}_{split}_{index:06d}.bin"


def existing_shards(out_dir, prefix):
    """The prefix's shards in out_dir, named exactly as shard_name names them (six digits or more: [0-9]* also took
    data_train_2024-backup.bin, which --force then deleted: a probe, 2026-12-07)."""
    found = []
    for split in ("train", "val"):
        pattern = re.compile(re.escape(f"{prefix}_{split}_") + r"[0-9]{6,}\.bin")
        found += [os.path.join(out_dir, name) for name in os.listdir(out_dir) if pattern.fullmatch(name)]
    return sorted(found)


class ShardWriter:
    """One split's shards: tokens are appended to a hidden temporary file that is renamed to its shard name once
    it holds --shard-tokens tokens (or at the end), so that no reader ever sees a half-written shard."""

    def __init__(self, out_dir, prefix, split, shard_tokens, dtype):
        self.out_dir, self.prefix, self.split = out_dir, prefix, split
        self.shard_tokens = shard_tokens
        self.magic, self.version, _, self.itemsize = FORMATS[dtype]
        self.written = []     # completed shard paths
        self.tokens = 0       # in completed shards and the open one
        self.documents = 0
        self.file = None
        self.tmp_path = None
        self.in_shard = 0

    def _open(self):
        final = shard_name(self.prefix, self.split, len(self.written))
        self.tmp_path = os.path.join(self.out_dir, f".{final}.{os.getpid()}.tmp")
        self.file = open(self.tmp_path, "wb")
        self.file.write(bytes(HEADER_INTS * 4))  # the header goes in when the count is known
        self.in_shard = 0

    def _close(self):
        header = [0] * HEADER_INTS
        header[0], header[1], header[2] = self.magic, self.version, self.in_shard
        self.file.seek(0)
        self.file.write(struct.pack(f"<{HEADER_INTS}i", *header))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None
        final = os.path.join(self.out_dir, shard_name(self.prefix, self.split, len(self.written)))
        os.replace(self.tmp_path, final)
        self.tmp_path = None
        self.written.append(final)

    def write(self, tokens, documents):
        """tokens: an array of this writer's dtype (native byte order)."""
        if sys.byteorder == "big":
            tokens = array(tokens.typecode, tokens)
            tokens.byteswap()
        view = memoryview(tokens)
        start = 0
        while start < len(view):
            if self.file is None:
                self._open()
            take = min(self.shard_tokens - self.in_shard, len(view) - start)
            self.file.write(view[start:start + take])
            self.in_shard += take
            start += take
            if self.in_shard == self.shard_tokens:
                self._close()
        self.tokens += len(view)
        self.documents += documents

    def finish(self):
        if self.file is not None:
            self._close()

    def abort(self):
        """After a failure: the temporary file and this run's completed shards are removed."""
        if self.file is not None:
            try:
                self.file.close()  # flushes: fails again on a full disk
            except OSError:
                pass
            self.file = None
        for path in ([self.tmp_path] if self.tmp_path else []) + self.written:
            try:
                os.unlink(path)
            except OSError:
                pass


def split_point(lengths, val_tokens, val_have):
    """How many of a chunk's documents still go to val: whole documents until val holds >= val_tokens."""
    k = 0
    while k < len(lengths) and val_have < val_tokens:
        val_have += lengths[k]
        k += 1
    return k


# ---------------------------------------------------------------------------------------------------------------
# Progress

class Progress:
    """tqdm's bar when it can be imported, else a plain line every few seconds. The bar appears with the first
    tokenized chunk, so that an input refused at once gets its error line alone."""

    def __init__(self, quiet):
        self.quiet = quiet
        self.start = time.monotonic()
        self.last_plain = self.start
        self.bar = None
        self.tqdm = None
        if not quiet:
            try:
                from tqdm import tqdm
                self.tqdm = tqdm
            except ImportError:
                pass

    def update(self, new_tokens, counts):
        if self.quiet:
            return
        if self.tqdm is not None and self.bar is None:
            self.bar = self.tqdm(unit="tok", unit_scale=True, file=sys.stderr, desc=PROG, dynamic_ncols=True)
        if self.bar is not None:
            self.bar.set_postfix_str(f"{counts.documents} docs", refresh=False)
            self.bar.update(new_tokens)
            return
        now = time.monotonic()
        if now - self.last_plain >= PROGRESS_PLAIN_SECONDS:
            self.last_plain = now
            rate = counts.tokens / max(now - self.start, 1e-9)
            print(f"{PROG}: {counts.documents} documents, {counts.tokens} tokens, {rate:,.0f} tokens/s",
                  file=sys.stderr, flush=True)

    def close(self):
        if self.bar is not None:
            self.bar.close()
            self.bar = None

    def seconds(self):
        return time.monotonic() - self.start


# ---------------------------------------------------------------------------------------------------------------
# The run

def tokenized_chunks(args, spec, eot_id, typecode, docs):
    """(tokens, lengths, max id) per chunk in corpus order, from --workers processes (or this one)."""
    work = chunks(docs)
    if args.workers == 1:
        init_worker(spec, eot_id, typecode, in_child=False)
        yield from map(encode_chunk, work)
        return
    # The workers are forked with the main process's SIGTERM handler (raise_interrupted); one terminated before its
    # initializer has run would raise there and print a traceback (the pool's terminate() on an early error races
    # the workers' start). So SIGTERM is blocked across the fork: a worker takes it once its initializer has set
    # the default action, and the main process once the pool exists.
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        pool = multiprocessing.Pool(args.workers, initializer=init_worker, initargs=(spec, eot_id, typecode, True))
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
    try:
        yield from ordered_map(pool, encode_chunk, work, window=2 * args.workers + 2)
        pool.close()
    finally:
        pool.terminate()
        pool.join()


def prepare_out_dir(args, inputs):
    try:
        os.makedirs(args.out_dir, exist_ok=True)
    except OSError as e:
        raise PrepareError(f"cannot create --out-dir {args.out_dir}: {e.strerror or e}") from None
    old = existing_shards(args.out_dir, args.prefix)
    for path in inputs:  # --force deleted such an input before reading it
        shard = next((s for s in old if os.path.exists(path) and os.path.samefile(path, s)), None)
        if shard:
            raise PrepareError(f"input {path} is {shard}, a shard of prefix {args.prefix!r} that this run writes "
                               f"over: give another --out-dir or --prefix")
    if old and not args.force:
        raise PrepareError(f"{args.out_dir} already holds {len(old)} shard(s) of prefix {args.prefix!r} "
                           f"({os.path.basename(old[0])} ...): use --force to replace them")
    for path in old:
        os.unlink(path)
    return len(old)


def route_chunk(tokens, lengths, writers, val_tokens):
    """A chunk's documents to val (while it holds fewer than val_tokens tokens) and the rest to train."""
    val, train = writers
    k = split_point(lengths, val_tokens, val.tokens)
    if k == len(lengths):
        val.write(tokens, k)
    elif k == 0:
        train.write(tokens, len(lengths))
    else:
        cut = sum(lengths[:k])
        val.write(tokens[:cut], k)
        train.write(tokens[cut:], len(lengths) - k)


def stream(args, spec, eot_id, dtype, paths, writers, counts, progress):
    """Reads, tokenizes and writes the whole corpus; returns the largest token id seen."""
    max_id = -1
    results = tokenized_chunks(args, spec, eot_id, FORMATS[dtype][2], documents(paths, args, counts))
    with contextlib.closing(results):  # on an error here the pool ends now, not when the traceback is freed
        for tokens, lengths, chunk_max in results:
            route_chunk(tokens, lengths, writers, args.val_tokens)
            counts.documents += len(lengths)
            counts.tokens += len(tokens)
            max_id = max(max_id, chunk_max)
            progress.update(len(tokens), counts)
    return max_id


def check_totals(args, paths, writers, counts, max_id, vocab_size):
    if counts.documents == 0:
        raise PrepareError(f"empty corpus: no document with text in {len(paths)} input file(s)")
    if writers[1].tokens == 0:
        raise PrepareError(f"no tokens left for train: all {counts.tokens} went to val (--val-tokens "
                           f"{args.val_tokens}); lower --val-tokens")
    if max_id >= vocab_size:  # a tokenizer that emits ids past its own vocabulary
        raise PrepareError(f"the tokenizer produced id {max_id}, past its vocabulary of {vocab_size}")


def summarize(args, writers, counts, seconds, vocab_size, dtype, eot_id, eot_name, deleted):
    magic, version, _, _ = FORMATS[dtype]
    rate = counts.tokens / max(seconds, 1e-9)
    skipped = f" ({counts.skipped} empty skipped)" if counts.skipped else ""
    print(f"{PROG}: {counts.documents} documents{skipped}, {counts.tokens} tokens in {seconds:.2f} s "
          f"({rate:,.0f} tokens/s, {args.workers} workers)")
    if deleted:
        print(f"{PROG}: --force: deleted {deleted} earlier shard(s) of prefix {args.prefix!r}")
    for w in writers:
        if w.written:
            names = [os.path.basename(p) for p in w.written]
            span = names[0] + (f" .. {names[-1]}" if len(names) > 1 else "")
            print(f"{PROG}: {w.split}: {len(w.written)} shard(s), {w.tokens} tokens, {w.documents} documents: "
                  f"{os.path.join(args.out_dir, span)}")
    print(f"{PROG}: {dtype} tokens (magic {magic}, version {version}); EOT {eot_name!r} = {eot_id} before every "
          f"document")
    print(f"{PROG}: vocabulary {vocab_size}: moe-train's --vocab must be at least {vocab_size}")


def run(args):
    paths = expand_inputs(args.inputs)
    check_inputs(paths, args)
    if args.tokenizer:
        spec = ("hf", args.tokenizer, None, args.eot)
    else:
        spec = ("tiktoken", args.tiktoken, args.tiktoken_pattern, args.eot)
    encoder = Encoder(spec)
    eot_id, eot_name = resolve_eot(encoder, args.eot)
    vocab_size = encoder.vocab_size
    dtype = choose_dtype(args.dtype, vocab_size)
    del encoder  # the workers load their own
    deleted = prepare_out_dir(args, paths)

    writers = [ShardWriter(args.out_dir, args.prefix, split, args.shard_tokens, dtype) for split in ("val", "train")]
    counts = Counts()
    progress = Progress(args.quiet)
    try:
        max_id = stream(args, spec, eot_id, dtype, paths, writers, counts, progress)
        check_totals(args, paths, writers, counts, max_id, vocab_size)
        for w in writers:
            w.finish()
    except BaseException as e:
        progress.close()
        for w in writers:
            w.abort()
        if isinstance(e, OSError):  # reading errors are PrepareErrors already: this is the shards' disk
            raise PrepareError(f"cannot write the shards in {args.out_dir}: {e.strerror or e}") from None
        raise
    progress.close()
    if not args.quiet:
        summarize(args, writers, counts, progress.seconds(), vocab_size, dtype, eot_id, eot_name, deleted)
    return 0


def raise_interrupted(signum, frame):
    raise Interrupted()


def main(argv=None):
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, raise_interrupted)
    try:
        return run(args)
    except PrepareError as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}", file=sys.stderr)  # one line, whatever a library said
        return 1
    except (KeyboardInterrupt, Interrupted):
        print(f"{PROG}: interrupted: no shard of this run kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 1


if __name__ == "__main__":
    sys.exit(main())
