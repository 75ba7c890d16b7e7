/*
 * lohan_model_cut.h: how liblohan_client cuts a plugin's model into lohand's
 * layers and makes the job's ModelSpec, with lohan_client.h's conventions.
 * The plugin describes what it found (a ModelDescription,
 * proto/model_cut.proto, in protobuf JSON: the trained parameters with
 * their names, shapes and blocks, the groups its user asked for, the spec's
 * other fields, a data-parallel rank); the cut gives each layer's
 * parameters and offsets and the complete spec (layer elements, the
 * "no_weight_decay" and "param_groups[n]" groups as element ranges).
 */
#ifndef LOHAN_MODEL_CUT_H_
#define LOHAN_MODEL_CUT_H_

#include "lohan/lohan_client.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lohan_model_cut lohan_model_cut;

/* LOHAN_INVALID_ARGUMENT naming what is wrong (a JSON that does not parse;
   no trained parameters; a group or rule naming a parameter the model does
   not have, or an untrained one; a parameter in two groups; a group's lr
   or weight decay out of range). */
LOHAN_CLIENT_API int lohan_model_cut_create(const char* description_json,
                                            lohan_model_cut** out);
LOHAN_CLIENT_API void lohan_model_cut_destroy(lohan_model_cut* cut);
/* The ModelCut in protobuf JSON with the proto's field names, and its
   ModelSpec alone (what lohan_job_open and lohan_model_register_json
   take); valid while the cut lives. */
LOHAN_CLIENT_API const char* lohan_model_cut_json(const lohan_model_cut* cut);
LOHAN_CLIENT_API const char* lohan_model_cut_spec_json(
    const lohan_model_cut* cut);
/* Layers, and a layer's block (-1: a rest layer, or no such layer) and
   number of parameters (0: no such layer). */
LOHAN_CLIENT_API uint32_t lohan_model_cut_layers(const lohan_model_cut* cut);
LOHAN_CLIENT_API int32_t lohan_model_cut_layer_block(const lohan_model_cut* cut,
                                                     uint32_t layer);
LOHAN_CLIENT_API uint32_t lohan_model_cut_layer_size(const lohan_model_cut* cut,
                                                     uint32_t layer);
/* The layer's `position`-th parameter: its index in the description and
   its element offset in the layer. LOHAN_OUT_OF_RANGE past the end. */
LOHAN_CLIENT_API int lohan_model_cut_layer_parameter(const lohan_model_cut* cut,
                                                     uint32_t layer,
                                                     uint32_t position,
                                                     uint32_t* parameter,
                                                     uint64_t* offset);

#ifdef __cplusplus
}
#endif

#endif /* LOHAN_MODEL_CUT_H_ */
