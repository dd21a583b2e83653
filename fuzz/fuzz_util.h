/* fuzz_util.h — what the fuzz targets (fuzz/fuzz_*.c) share: a private temporary directory to hand the
 * parsers their input as a real file (they take paths and refuse anything but regular files), the checks that
 * turn a wrongly accepted input or a failure without a message into a crash, and the tiny models the seed
 * corpus was made with (fuzz/make_corpus.sh). */
#ifndef MOE_FUZZ_UTIL_H
#define MOE_FUZZ_UTIL_H

#include <stddef.h>
#include <stdint.h>

#include "checkpoint/safetensors.h"
#include "train/options.h"

/* $TMPDIR/NAME (default /tmp) inside a directory of this process, made on first use and removed at exit;
 * the same string for the same name, valid until exit. */
const char *fuzz_temp_path(const char *name);
/* The process's temporary directory (fuzz_temp_path's). */
const char *fuzz_temp_dir(void);
/* Writes data to path (truncating); aborts when it cannot. */
void fuzz_write_file(const char *path, const uint8_t *data, size_t nbytes);

/* Prints "fuzz: accepted invalid input: <message>" and aborts: a parser took bytes it must refuse, or broke a
 * promise of its header. */
void fuzz_invalid(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/* After a failed call: the failure's message must name `what` (the file), as every parser promises; a failure
 * that recorded no message, or one without the name, aborts. Out of memory is exempt. */
void fuzz_check_failure(int status, const char *what);

/* The runs of fuzz/make_corpus.sh, as moe-train parsed their flags on one rank: 0 = one layer, 2 experts, top-1;
 * 1 = two layers (the second MoE), 4 experts, top-2, sigmoid scores, tied embeddings. */
enum { FUZZ_TINY_RUNS = 2 };
const moe_train_options *fuzz_tiny_run(int which);

/* Parses text (NULL: missing) as the saved step of the training state in path (moe__checkpoint_parse_step) and
 * checks the verdict against the rule written out again: one or more decimal digits, value at most INT_MAX. */
void fuzz_check_step(const char *text, const char *path);

/* Opens path (whose bytes are data) as safetensors and checks what a successful open promises: every tensor's
 * bytes inside the file and no two tensors sharing a byte; then reads every F32 tensor with its own shape (the
 * values must be the file's bytes), and refuses a wrong shape and a missing name. *opened: 1 with f open
 * (close it), or 0 when the open failed (its failure checked by fuzz_check_failure). */
void fuzz_open_safetensors(const char *path, const uint8_t *data, size_t nbytes, moe_safetensors_file *f, int *opened);

#endif
