/* safetensors_shards.h — a model's tensors in one safetensors file, or split over shards with an index, the way
 * Hugging Face transformers writes them (save_pretrained(max_shard_size=...)):
 *   DIR/STEM.safetensors                                                       one file; or
 *   DIR/STEM-00001-of-0000N.safetensors .. DIR/STEM-0000N-of-0000N.safetensors  the shards, and
 *   DIR/STEM.safetensors.index.json   {"metadata": {"total_size": DATA BYTES}, "weight_map": {"TENSOR": "SHARD", ...}}
 *
 * Reading is strict where a wrong file would load wrong weights: a directory holding both forms is refused (which
 * one is meant?), every shard the index names must exist and be a safetensors file, every tensor the index names
 * must be in the shard it names, and every tensor of a shard must be named by the index for that shard (so no
 * tensor is in two shards); a weight_map value must be a plain file name ending in .safetensors (no '/': an index
 * never reaches outside DIR). Duplicate keys in the index are refused. Every problem is a sentence naming the file.
 *
 * Writing splits the tensors in the order given, greedily: a shard takes tensors while its data stays within
 * max_shard_nbytes (a tensor larger than that gets a shard of its own); one shard is written as STEM.safetensors
 * without an index, as transformers does. Files are written and fsynced one by one, not atomically: the caller
 * writes into a temporary directory and publishes it whole (checkpoint/dir.c). */
#ifndef MOE_CHECKPOINT_SAFETENSORS_SHARDS_H
#define MOE_CHECKPOINT_SAFETENSORS_SHARDS_H

#include "checkpoint/safetensors.h"

/* ---- the index --------------------------------------------------------------------------------- */

typedef struct {
    void *weight_map;  /* json_t *: tensor name -> shard file name */
    char **shards;     /* the distinct shard file names, in the order the index first names them */
    int num_shards;
} moe_safetensors_index;

/* Parses the bytes of an index file (path names it in messages). */
moe_status moe_safetensors_index_parse(const char *path, const char *text, size_t nbytes, moe_safetensors_index *out);
void moe_safetensors_index_free(moe_safetensors_index *idx);
/* The shard file name of tensor `name`, or NULL. */
const char *moe_safetensors_index_shard(const moe_safetensors_index *idx, const char *name);

/* ---- a set of files ---------------------------------------------------------------------------- */

typedef struct {
    moe_safetensors_file *files; /* [num_files]: one, or the shards in the index's order */
    char **names;                /* their file names within the directory */
    int num_files;
    moe_safetensors_index index; /* num_shards 0: a single file */
} moe_safetensors_set;

/* Opens DIR/STEM.safetensors, or the index and every shard it names (the rules above). */
moe_status moe_safetensors_set_open(const char *dir, const char *stem, moe_safetensors_set *s);
void moe_safetensors_set_close(moe_safetensors_set *s);
/* The file that holds tensor `name`, or NULL when no file does. */
moe_safetensors_file *moe_safetensors_set_file(const moe_safetensors_set *s, const char *name);

/* Writes the entries into DIR as STEM.safetensors (max_shard_nbytes 0, or everything fits in one shard) or as
 * shards and an index; each file gets the metadata. *num_files (may be NULL): the files written, the index
 * included. The pieces, for writers that store the files' tensors from several processes (checkpoint/write.c):
 * the split (first[s]: shard s's first entry, first[shards] = num_entries; first holds num_entries + 2 ints; returns
 * the shards, 1 for no entries), a shard's file name, and the index of a split into more than one shard. */
int moe_safetensors_shard_split(const moe_safetensors_entry *entries, int num_entries, size_t max_shard_nbytes,
                                int *first);
void moe_safetensors_shard_name(const char *stem, int s, int shards, char *out, size_t nbytes);
/* Whether this process may open count shards at once (a load keeps every shard of a set open), with files to spare
 * for what it holds beside them; else a message, prefixed by what (a directory loaded, or a save), naming both
 * numbers. The limit is the process's: moe-train raises its soft one to the hard one at start. moe_checkpoint_prepare
 * checks a run's saves by it before training, so that none writes a checkpoint its machines could not load. */
moe_status moe_safetensors_room_for_shards(int count, const char *what);
moe_status moe_safetensors_write_index(const char *dir, const char *stem, const moe_safetensors_entry *entries,
                                       int num_entries, const int *first, int shards);
moe_status moe_safetensors_write_shards(const char *dir, const char *stem, const moe_safetensors_entry *entries,
                                        int num_entries, const moe_safetensors_meta *meta, int num_meta,
                                        size_t max_shard_nbytes, int *num_files);

#endif
