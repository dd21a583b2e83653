/* dataloader.c — data sets of llm.c token files (uint16 or uint32 tokens): the list and its patterns, each shard's
 * header, windows across shards, and reading a batch's windows with pread (dataloader.h says why not the map). */
#include "train/dataloader.h"

#include <errno.h>
#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fail.h"
#include "core/fnv1a.h"
#include "models/fileio.h"
#include "train/data_order.h"

typedef struct {
    moe_token_shard info;
    char *path;                /* info.path's memory */
    FILE *file;                /* kept open: pread(fileno) reads the tokens */
    void *map;                 /* the whole file, PROT_READ + MAP_SHARED; NULL where mmap failed (advice only) */
    size_t map_nbytes;
} shard;

struct moe_token_data {
    shard *shards;
    int num_shards, capacity;
    int64_t num_windows;
    int vocab_size, seq_len;
};

enum { HEADER_NBYTES = MOE_TOKEN_FILE_HEADER_INTS * 4 };

static int32_t le32(const unsigned char *b) {
    return (int32_t)((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24);
}

/* The bytes of one token for a header's magic and version: 2, 4, or 0 for neither format (*why says what). */
static int token_nbytes(int32_t magic, int32_t version, const char **why) {
    if (magic == MOE_TOKEN_FILE_MAGIC) return version == MOE_TOKEN_FILE_VERSION ? 2 : (*why = "version", 0);
    if (magic == MOE_TOKEN_FILE_MAGIC_U32) return version == MOE_TOKEN_FILE_VERSION_U32 ? 4 : (*why = "version", 0);
    return *why = "magic", 0;
}

static uint64_t shard_hash(const char *path, int64_t num_tokens) {
    const char *slash = strrchr(path, '/'), *base = slash ? slash + 1 : path;
    uint64_t h = moe_fnv1a(MOE_FNV1A_SEED, base, strlen(base));
    const uint64_t n = (uint64_t)num_tokens;
    return moe_data_mix64(moe_fnv1a(h, &n, sizeof n));
}

/* FNV-1a of the file's first and last CONTENT_NBYTES (all of a shorter one): what a shard's content is checked by at a
 * resume, read in two preads however large the shard. */
enum { CONTENT_NBYTES = 4096 };
static uint64_t content_hash(FILE *f, long long nbytes) {
    unsigned char head[CONTENT_NBYTES], tail[CONTENT_NBYTES];
    const size_t first = nbytes < CONTENT_NBYTES ? (size_t)nbytes : CONTENT_NBYTES;
    const long long rest = nbytes - (long long)first;
    const size_t last = rest < CONTENT_NBYTES ? (size_t)rest : CONTENT_NBYTES;
    ssize_t a = pread(fileno(f), head, first, 0), b = pread(fileno(f), tail, last, (off_t)(nbytes - (long long)last));
    uint64_t h = moe_fnv1a(MOE_FNV1A_SEED, head, a > 0 ? (size_t)a : 0);
    return moe_data_mix64(moe_fnv1a(h, tail, b > 0 ? (size_t)b : 0));
}

/* Opens one shard and checks its header; the shard is appended to d. */
static moe_status add_shard(moe_token_data *d, const char *path) {
    if (d->num_shards == d->capacity) {
        const int capacity = d->capacity ? 2 * d->capacity : 8;
        shard *more = realloc(d->shards, (size_t)capacity * sizeof *more);
        if (!more) return MOE_ERR_OUT_OF_MEMORY;
        d->shards = more, d->capacity = capacity;
    }
    FILE *f;
    moe_status opened = moe_file_open_regular(path, &f);
    struct rlimit files; /* every shard stays open (and mapped) for the run: a limit reached is named (a probe) */
    if (opened != MOE_OK && strstr(moe_failure_message(opened), strerror(EMFILE)) &&
        getrlimit(RLIMIT_NOFILE, &files) == 0)
        return moe_fail(MOE_ERR_IO, "%s: cannot open the data set's shard %d: this process may hold %llu open files "
                        "(each shard stays open for the run): raise the limit (ulimit -n) or use fewer, larger "
                        "shards", path, d->num_shards + 1, (unsigned long long)files.rlim_cur);
    MOE_TRY(opened);
    unsigned char header[HEADER_NBYTES];
    const size_t got = fread(header, 1, sizeof header, f);
    const long long file_nbytes = moe_file_size(f);
    moe_status st = MOE_OK;
    /* the count as unsigned: llm.c writes an int32, and a count past 2^31 - 1 (a uint32 shard of up to 16 GiB) is
     * read as the positive number it is, never as a negative one */
    const long n = got == sizeof header ? (long)(uint32_t)le32(header + 8) : 0;
    const char *why = "";
    const int width = got == sizeof header ? token_nbytes(le32(header), le32(header + 4), &why) : 0;
    const int S = d->seq_len;
    if (got != sizeof header)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: truncated: %ld bytes, shorter than the %ld-byte header", path, (long)got,
                      (long)sizeof header);
    else if (!width && !strcmp(why, "magic"))
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: wrong magic %ld (expected %d for uint16 tokens or %d for uint32): not an "
                      "llm.c token file%s (Megatron-LM's .bin/.idx and Hugging Face datasets are not read: tokenise "
                      "the text with scripts/prepare_data.py, docs/DATA.md)", path, (long)le32(header),
                      MOE_TOKEN_FILE_MAGIC, MOE_TOKEN_FILE_MAGIC_U32,
                      !memcmp(header, "MMIDIDX", 7) ? ": a Megatron-LM index (.idx)" : "");
    else if (!width)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: unsupported version %ld for magic %ld (expected %d)", path,
                      (long)le32(header + 4), (long)le32(header),
                      le32(header) == MOE_TOKEN_FILE_MAGIC ? MOE_TOKEN_FILE_VERSION : MOE_TOKEN_FILE_VERSION_U32);
    else if (n < 0 || file_nbytes != (long long)sizeof header + width * (long long)n)
        st = moe_fail(MOE_ERR_BAD_FILE,
                      "%s: the header announces %ld tokens but the file holds %lld bytes of %s tokens (truncated or "
                      "padded)", path, n, file_nbytes - (long long)sizeof header, width == 2 ? "uint16" : "uint32");
    /* a shard shorter than one sequence holds no window (prepare_data.py's last shard may be): taken, counted in the
     * data line; a data set of no window at all is refused below (before, such a shard was refused: a probe) */
    shard *s = &d->shards[d->num_shards];
    memset(s, 0, sizeof *s);
    if (st == MOE_OK && !(s->path = strdup(path))) st = MOE_ERR_OUT_OF_MEMORY;
    if (st != MOE_OK) return free(s->path), fclose(f), st;
    s->file = f;
    s->map_nbytes = (size_t)file_nbytes;
    s->map = mmap(NULL, s->map_nbytes, PROT_READ, MAP_SHARED, fileno(f), 0);
    if (s->map == MAP_FAILED) s->map = NULL; /* only advice is lost */
    /* n - 1 tokens to predict, in windows of S; none in an empty shard (whose (0 - 1) / 1 was -1 at --seq-len 1: the
     * fuzzer, 2026-12-07, a window count off by one for every shard after it) */
    s->info = (moe_token_shard){.path = s->path, .width = width, .num_tokens = n,
                                .num_windows = n > 0 ? (n - 1) / S : 0, .first_window = d->num_windows,
                                .hash = shard_hash(path, n), .content = content_hash(f, file_nbytes)};
    d->num_windows += s->info.num_windows;
    d->num_shards++;
    return MOE_OK;
}

static int compare_paths(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* One entry of the list: a path, or a pattern (it holds * ? or [ and names no file itself: "shards[1]/a.bin" that
 * exists is that file) expanded and sorted. */
static moe_status add_entry(moe_token_data *d, const char *entry) {
    if (!*entry) return moe_fail(MOE_ERR_BAD_FILE, "an empty entry in the list of data files (two commas, or one at "
                                 "an end)");
    struct stat sb;
    if (!strpbrk(entry, "*?[") || stat(entry, &sb) == 0) return add_shard(d, entry);
    glob_t g;
    const int rc = glob(entry, GLOB_NOSORT, NULL, &g);
    if (rc == GLOB_NOMATCH) return moe_fail(MOE_ERR_IO, "%s: no file matches this pattern", entry);
    if (rc != 0) return moe_fail(MOE_ERR_IO, "%s: cannot expand this pattern (%s)", entry,
                                 rc == GLOB_NOSPACE ? "out of memory" : "a directory could not be read");
    /* by name in bytes, not by the locale's collation: every node sorts alike */
    qsort(g.gl_pathv, g.gl_pathc, sizeof *g.gl_pathv, compare_paths);
    moe_status st = MOE_OK;
    for (size_t i = 0; i < g.gl_pathc && st == MOE_OK; i++) st = add_shard(d, g.gl_pathv[i]);
    globfree(&g);
    return st;
}

static int64_t total_tokens(const moe_token_data *d) {
    int64_t n = 0;
    for (int i = 0; i < d->num_shards; i++) n += d->shards[i].info.num_tokens;
    return n;
}

moe_status moe_token_data_open(const char *spec, int vocab_size, int seq_len, moe_token_data **out) {
    *out = NULL;
    moe_token_data *d = calloc(1, sizeof *d);
    char *list = strdup(spec);
    if (!d || !list) return free(d), free(list), MOE_ERR_OUT_OF_MEMORY;
    d->vocab_size = vocab_size, d->seq_len = seq_len;
    moe_status st = MOE_OK;
    for (char *entry = list, *comma; st == MOE_OK; entry = comma + 1) {
        comma = strchr(entry, ',');
        if (comma) *comma = 0;
        st = add_entry(d, entry);
        if (!comma) break;
    }
    free(list);
    if (st == MOE_OK && !d->num_shards) st = moe_fail(MOE_ERR_BAD_FILE, "no data file given");
    if (st == MOE_OK && !d->num_windows)
        st = moe_fail(MOE_ERR_BAD_FILE, "%s: only %lld tokens in %d file(s), fewer than one sequence of %d + 1 in each",
                      spec, (long long)total_tokens(d), d->num_shards, seq_len);
    if (st != MOE_OK) return moe_token_data_close(d), st;
    *out = d;
    return MOE_OK;
}

void moe_token_data_close(moe_token_data *d) {
    if (!d) return;
    for (int i = 0; i < d->num_shards; i++) {
        if (d->shards[i].map) munmap(d->shards[i].map, d->shards[i].map_nbytes);
        fclose(d->shards[i].file);
        free(d->shards[i].path);
    }
    free(d->shards);
    free(d);
}

int moe_token_data_num_shards(const moe_token_data *d) { return d->num_shards; }
int64_t moe_token_data_num_windows(const moe_token_data *d) { return d->num_windows; }
int moe_token_data_seq_len(const moe_token_data *d) { return d->seq_len; }
moe_token_shard moe_token_data_shard(const moe_token_data *d, int i) { return d->shards[i].info; }

uint64_t moe_token_data_identity(const moe_token_data *d) {
    uint64_t h = MOE_FNV1A_SEED;
    for (int i = 0; i < d->num_shards; i++) h = moe_fnv1a(h, &d->shards[i].info.hash, sizeof(uint64_t));
    const int64_t counts[2] = {d->num_shards, d->num_windows};
    return moe_data_mix64(moe_fnv1a(h, counts, sizeof counts));
}

void moe_token_data_locate(const moe_token_data *d, int64_t w, int *shard_index, int64_t *token_offset) {
    int lo = 0, hi = d->num_shards - 1; /* the last shard whose first window is <= w */
    while (lo < hi) {
        const int mid = lo + (hi - lo + 1) / 2;
        if (d->shards[mid].info.first_window <= w) lo = mid;
        else hi = mid - 1;
    }
    *shard_index = lo;
    *token_offset = (w - d->shards[lo].info.first_window) * d->seq_len;
}

/* One window's S+1 tokens into tokens[], through raw[(S+1) * 4]. */
static moe_status read_window(const moe_token_data *d, int64_t w, unsigned char *raw, int *tokens) {
    int i;
    int64_t at;
    moe_token_data_locate(d, w, &i, &at);
    const shard *s = &d->shards[i];
    const int width = s->info.width, count = d->seq_len + 1;
    const size_t nbytes = (size_t)count * width;
    const off_t offset = HEADER_NBYTES + (off_t)at * width;
    size_t done = 0;
    while (done < nbytes) {
        const ssize_t r = pread(fileno(s->file), raw + done, nbytes - done, offset + (off_t)done);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return moe_fail(MOE_ERR_IO, "%s: read error at token %lld: %s", s->path, (long long)at,
                                   strerror(errno));
        if (r == 0) {
            struct stat sb;
            const long long now = fstat(fileno(s->file), &sb) == 0 ? (long long)sb.st_size : -1;
            return moe_fail(MOE_ERR_BAD_FILE, "%s: the file ends at %lld bytes, before tokens %lld to %lld (it held "
                            "%lld tokens when the run opened it): truncated or replaced while the run reads it", s->path,
                            now, (long long)at, (long long)at + count - 1, (long long)s->info.num_tokens);
        }
        done += (size_t)r;
    }
    for (int k = 0; k < count; k++) {
        const unsigned char *b = raw + (size_t)k * width;
        const uint32_t token = width == 2 ? (uint32_t)(b[0] | b[1] << 8) : (uint32_t)le32(b);
        if (token >= (uint32_t)d->vocab_size)
            return moe_fail(MOE_ERR_BAD_FILE, "%s: token %lu at token offset %lld is outside the vocabulary (size %d): "
                            "check --vocab (a shard of another tokenizer?)", s->path, (unsigned long)token,
                            (long long)at + k, d->vocab_size);
        tokens[k] = (int)token;
    }
    return MOE_OK;
}

moe_status moe_token_data_sequences(moe_token_data *d, moe_data_order order, int64_t first_seq, int num_seqs,
                                    int *inputs, int *targets) {
    const int S = d->seq_len;
    unsigned char *raw = malloc((size_t)(S + 1) * 4);
    int *window = malloc((size_t)(S + 1) * sizeof(int));
    moe_status st = raw && window ? MOE_OK : MOE_ERR_OUT_OF_MEMORY;
    for (int s = 0; s < num_seqs && st == MOE_OK; s++) {
        const int64_t w = moe_data_window(order.shuffle, order.seed, d->num_windows, first_seq + s);
        st = read_window(d, w, raw, window);
        if (st != MOE_OK) break;
        memcpy(inputs + (size_t)s * S, window, (size_t)S * sizeof(int));
        memcpy(targets + (size_t)s * S, window + 1, (size_t)S * sizeof(int));
    }
    free(raw), free(window);
    return st;
}

void moe_token_data_advise(const moe_token_data *d, moe_data_order order, int64_t first_seq, int num_seqs) {
    const long page = sysconf(_SC_PAGESIZE);
    for (int s = 0; s < num_seqs; s++) {
        int i;
        int64_t at;
        moe_token_data_locate(d, moe_data_window(order.shuffle, order.seed, d->num_windows, first_seq + s), &i, &at);
        const shard *sh = &d->shards[i];
        if (!sh->map) continue;
        const size_t begin = HEADER_NBYTES + (size_t)at * sh->info.width, from = begin / page * page;
        const size_t end = begin + (size_t)(d->seq_len + 1) * sh->info.width;
        posix_madvise((char *)sh->map + from, end - from, POSIX_MADV_WILLNEED);
    }
}

/* tokens: width 2 (unsigned short) or 4 (uint32_t) bytes each, written little-endian after the header. */
static moe_status write_tokens(const char *path, const void *tokens, int width, long num_tokens) {
    if (num_tokens < 0 || (unsigned long)num_tokens > UINT32_MAX) /* the header's count, read as unsigned */
        return moe_fail(MOE_ERR_INVALID_ARG, "%s: %ld tokens, more than a token file's header counts (2^32 - 1): "
                        "write several files", path, num_tokens);
    unsigned char header[HEADER_NBYTES] = {0};
    const int32_t fields[3] = {width == 2 ? MOE_TOKEN_FILE_MAGIC : MOE_TOKEN_FILE_MAGIC_U32,
                               width == 2 ? MOE_TOKEN_FILE_VERSION : MOE_TOKEN_FILE_VERSION_U32, (int32_t)num_tokens};
    for (int i = 0; i < 3; i++)
        for (int b = 0; b < 4; b++) header[4 * i + b] = (unsigned char)((uint32_t)fields[i] >> (8 * b));
    FILE *f = fopen(path, "wb");
    if (!f) return moe_fail(MOE_ERR_IO, "%s: cannot create: %s", path, strerror(errno));
    int ok = fwrite(header, 1, sizeof header, f) == sizeof header;
    for (long i = 0; ok && i < num_tokens; i++) {
        const uint32_t t = width == 2 ? ((const unsigned short *)tokens)[i] : ((const uint32_t *)tokens)[i];
        const unsigned char b[4] = {(unsigned char)t, (unsigned char)(t >> 8), (unsigned char)(t >> 16),
                                    (unsigned char)(t >> 24)};
        ok = fwrite(b, 1, (size_t)width, f) == (size_t)width;
    }
    const int write_errno = ok ? 0 : errno;
    if (fclose(f) != 0 && ok) ok = 0;
    return ok ? MOE_OK : moe_fail(MOE_ERR_IO, "%s: write failed: %s", path, strerror(write_errno ? write_errno : errno));
}

moe_status moe_token_file_write(const char *path, const unsigned short *tokens, long num_tokens) {
    return write_tokens(path, tokens, 2, num_tokens);
}

moe_status moe_token_file_write_u32(const char *path, const uint32_t *tokens, long num_tokens) {
    return write_tokens(path, tokens, 4, num_tokens);
}
