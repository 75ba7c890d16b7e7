/*
 * lohan_checkpoint.h: checkpoints of a job's states in liblohan_client, with
 * lohan_client.h's conventions (int status, lohan_last_error, opaque
 * handles with a destroy that accepts NULL, no exceptions or aborts).
 *
 * A checkpoint is a directory: model.safetensors (the fp32 master weights by
 * parameter name), optionally optimizer.safetensors (<moment>/<name>), and
 * lohan.json (the job, its step, each layer's parameter names, the plugin's
 * fields, the optimizer parts present, and the manifest: the save's id, in
 * each file's metadata too, and each file's size and CRC-32). Data-parallel
 * ranks write one shard-<r>-of-<W>.safetensors each instead, and lohan.json's
 * "sharding" says how they cut every layer.
 *
 * Saving (all or nothing: the files go into a hidden sibling directory that
 * one rename exchange puts in place; an interrupted save leaves the previous
 * checkpoint whole):
 *   lohan_checkpoint_save_begin(dir)         one process, or rank 0
 *   lohan_checkpoint_save_join(staging, id)  the other ranks (told by rank 0)
 *   lohan_checkpoint_save_open(contents)     a CheckpointContents (JSON)
 *   lohan_checkpoint_save_layer(model, l)    each layer in order, read from
 *     the job through its model (or lohan_checkpoint_save_write with data)
 *   lohan_checkpoint_save_close_files        this process's file entries
 *   lohan_checkpoint_save_commit(meta, files) one process, or rank 0 with
 *     every rank's entries
 * Reading: lohan_checkpoint_open, then tensors by name and part. It also
 * reads the weights of a Hugging Face checkpoint (model.safetensors, or
 * shards named by model.safetensors.index.json; F32, BF16 or F16).
 */
#ifndef LOHAN_CHECKPOINT_H_
#define LOHAN_CHECKPOINT_H_

#include "lohan/lohan_client.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A checkpoint opened for reading. */
typedef struct lohan_checkpoint lohan_checkpoint;
/* A save in progress. */
typedef struct lohan_checkpoint_save lohan_checkpoint_save;

/* `path`: a lohan checkpoint directory (either format); a Hugging Face
   checkpoint directory (no lohan.json: model.safetensors, or
   model.safetensors.index.json and the shard files it names); or a bare
   safetensors file. Tensors may be stored as F32, BF16 or F16 and are read
   as fp32 (exactly); one of another dtype is refused when read. A Hugging
   Face directory or a bare file holds weights only: iteration 0, no
   optimizer parts, meta "{}", every parameter by its tensor name.
   Opening reads only the files' headers and checks lohan.json's manifest
   (every file present, of its size, from one save; LOHAN_DATA_LOSS naming
   a missing, torn or mixed file); with LOHAN_CHECKPOINT_VERIFY also every
   file's CRC-32 (a read of every byte). A Hugging Face index is checked
   against its shards (LOHAN_DATA_LOSS naming the index and a missing file
   or a tensor its file lacks); a damaged header or a file cut short is
   LOHAN_DATA_LOSS naming the file. LOHAN_NOT_FOUND for what is no
   checkpoint, naming the previous checkpoint an interrupted save set
   aside. */
#define LOHAN_CHECKPOINT_VERIFY 1u
LOHAN_CLIENT_API int lohan_checkpoint_open(const char* path, uint32_t flags,
                                           lohan_checkpoint** out);
LOHAN_CLIENT_API void lohan_checkpoint_destroy(lohan_checkpoint* checkpoint);
/* lohan.json's text ("{}" for a Hugging Face checkpoint or a bare file). */
LOHAN_CLIENT_API const char* lohan_checkpoint_meta_json(
    const lohan_checkpoint* checkpoint);
/* The Adam steps the checkpoint's job had taken (lohan.json's iteration;
   0 for a Hugging Face checkpoint or a bare file). */
LOHAN_CLIENT_API uint64_t
lohan_checkpoint_iteration(const lohan_checkpoint* checkpoint);
/* 1 when it holds optimizer part `part` ("exp_avg", "exp_avg_sq",
   "max_exp_avg_sq") of every parameter, else 0. */
LOHAN_CLIENT_API int lohan_checkpoint_has_part(
    const lohan_checkpoint* checkpoint, const char* part);
/* Every parameter stored, in order, as JSON: [{"name": ..., "shape": [...],
   "dtype": ...}, ...], "dtype" the safetensors dtype its weights are stored
   in ("F32", "BF16", "F16"; another, e.g. "I64", is one
   lohan_checkpoint_read refuses); free with lohan_string_free. */
LOHAN_CLIENT_API int lohan_checkpoint_parameters_json(
    const lohan_checkpoint* checkpoint, char** json_out);
/* The shape of `part` ("weights", "exp_avg", "exp_avg_sq",
   "max_exp_avg_sq") of parameter `name`: LOHAN_NOT_FOUND when the
   checkpoint lacks it; LOHAN_OUT_OF_RANGE when it has more than `capacity`
   dimensions (*ndims_out says how many). */
LOHAN_CLIENT_API int lohan_checkpoint_shape(const lohan_checkpoint* checkpoint,
                                            const char* name, const char* part,
                                            int64_t* dims, size_t capacity,
                                            size_t* ndims_out);
/* Its values as fp32 into `out` (`elements` floats, the shape's count);
   LOHAN_INVALID_ARGUMENT naming the file, the tensor and its dtype for one
   stored in a dtype other than F32, BF16 or F16. */
LOHAN_CLIENT_API int lohan_checkpoint_read(const lohan_checkpoint* checkpoint,
                                           const char* name, const char* part,
                                           float* out, uint64_t elements);
/* Restores one layer of a new job from the checkpoint, through `model`'s
   staging buffer: `request_json` is a CheckpointRestore
   (proto/checkpoint.proto) in protobuf JSON: the layer's parameters (names,
   aliases, shapes, offsets), the job's layer index, the parts ("weights":
   INIT_WEIGHTS; moments: INIT_STATE) and, for data-parallel ranks, this
   rank's shard. Each part is staged (found by name or alias; NOT_FOUND
   for a parameter the checkpoint lacks, INVALID_ARGUMENT for another
   shape) and then initialized; after "weights" the staging buffer holds
   the layer's fp32 values. */
LOHAN_CLIENT_API int lohan_checkpoint_restore_layer(
    const lohan_checkpoint* checkpoint, lohan_model* model,
    const char* request_json);
/* Reads every file of the checkpoint in `directory` against its manifest
   (sizes, save id, CRC-32). */
LOHAN_CLIENT_API int lohan_checkpoint_verify(const char* directory);

/* A save into `directory` (made if missing; LOHAN_FAILED_PRECONDITION when
   it is a file). Destroying it before its commit removes what it wrote. */
LOHAN_CLIENT_API int lohan_checkpoint_save_begin(const char* directory,
                                                 lohan_checkpoint_save** out);
/* Another data-parallel rank's part of a save rank 0 began: its staging
   directory and save id. It writes its shard file there, never commits. */
LOHAN_CLIENT_API int lohan_checkpoint_save_join(const char* staging,
                                                const char* save_id,
                                                lohan_checkpoint_save** out);
LOHAN_CLIENT_API void lohan_checkpoint_save_destroy(
    lohan_checkpoint_save* save);
LOHAN_CLIENT_API const char* lohan_checkpoint_save_staging(
    const lohan_checkpoint_save* save);
LOHAN_CLIENT_API const char* lohan_checkpoint_save_id(
    const lohan_checkpoint_save* save);
/* This process's files, for `contents_json`: a lohan.v1.CheckpointContents
   (proto/checkpoint.proto) in protobuf JSON. */
LOHAN_CLIENT_API int lohan_checkpoint_save_open(lohan_checkpoint_save* save,
                                                const char* contents_json);
/* The elements lohan_checkpoint_save_write takes for `layer` (its shard's
   with data-parallel ranks); 0 before open or past the last layer. */
LOHAN_CLIENT_API uint64_t lohan_checkpoint_save_layer_elements(
    const lohan_checkpoint_save* save, uint32_t layer);
/* Layer `layer`'s `part`, flat fp32: layers in order, each layer's parts in
   the contents' order. */
LOHAN_CLIENT_API int lohan_checkpoint_save_write(lohan_checkpoint_save* save,
                                                 uint32_t layer,
                                                 const char* part,
                                                 const float* data,
                                                 uint64_t elements);
/* Every part of layer `layer`, read from the job through `model`'s staging
   buffer (lohan_model_read_weights / read_state; between steps): the
   contents' layers are the job's, in its layer order. */
LOHAN_CLIENT_API int lohan_checkpoint_save_layer(lohan_checkpoint_save* save,
                                                 lohan_model* model,
                                                 uint32_t layer);
/* Syncs this process's files; their manifest entries as JSON,
   {"<file>": {"bytes": N, "crc32": N}, ...} (lohan_string_free). */
LOHAN_CLIENT_API int lohan_checkpoint_save_close_files(
    lohan_checkpoint_save* save, char** files_json_out);
/* Writes lohan.json and switches the checkpoint in. lohan.json holds the
   contents' job_name, iteration and layers (each layer's parameter names, a
   list per layer), `meta_json` (a JSON object of the plugin's own fields:
   the job's id, dtype, optimizer settings; a key named above or below is
   replaced), the parts, the save id and `files_json` (every rank's entries
   merged; NULL: this process's). */
LOHAN_CLIENT_API int lohan_checkpoint_save_commit(lohan_checkpoint_save* save,
                                                  const char* meta_json,
                                                  const char* files_json);

#ifdef __cplusplus
}
#endif

#endif /* LOHAN_CHECKPOINT_H_ */
