/* fileio.h — opening and naming the files a user hands the trainer, so that a bad one gets a message and
 * never a hang or a cut-off path: data files, checkpoints, configs and routing traces all go through here. */
#ifndef MOE_MODELS_FILEIO_H
#define MOE_MODELS_FILEIO_H

#include <stdio.h>

#include "core/types.h"

/* Opens path for reading in binary mode when it is a regular file. A directory, a FIFO, a socket or a
 * device is refused with a message naming what it is (opening a FIFO would wait for a writer forever);
 * a missing or unreadable file is MOE_ERR_IO with the system's reason. */
moe_status moe_file_open_regular(const char *path, FILE **out);

/* 1 when a and b name one file: the same name, or the same device and inode where both exist. */
int moe_same_file(const char *a, const char *b);

/* The size of an open regular file in bytes, or -1. */
long long moe_file_size(FILE *f);

/* dir + "/" + name (or just name when dir is empty), malloc'ed, any length; NULL when out of memory. */
char *moe_path_join(const char *dir, const char *name);

/* A byte count as a user writes one: digits, then optionally a unit, KB MB GB TB (powers of 1000, as transformers'
 * max_shard_size) or KiB MiB GiB TiB (powers of 1024), e.g. "5GB", "500MiB", "1048576". 0 with *nbytes set
 * (at least 1, at most 2^62), or -1 for anything else. */
int moe_parse_nbytes(const char *text, long long *nbytes);

/* fsync of a file or a directory given by path: 0, or -1 with errno set. */
int moe_fsync_path(const char *path);

#endif
