#ifndef LOHAN_CLIENT_MODEL_CUT_H_
#define LOHAN_CLIENT_MODEL_CUT_H_

#include "absl/status/statusor.h"
#include "proto/model_cut.pb.h"

namespace lohan {

// Cuts a plugin's model into lohand's layers and makes the job's spec,
// for every plugin (proto/model_cut.proto says what goes in and out):
//
// Layers: the trained parameters outside the blocks of modules before the
// last block (embeddings) form layer 0, those of modules after it (final
// norm, head) layer 1, each absent when empty, then per block with
// trained parameters, in block order, its own layer and one per unit (a
// part of the block whose weights stream on their own: parameters below
// the block), each absent when empty; parameters in the model's
// order, flattened back to back. The rest layers come first because the
// daemon runs what is left of an iteration's updates in layer order while
// the next forward starts: the embeddings and the head are brought up to
// date at the step's end, the blocks as they run. The spec says where each
// layer lies (layer_places: its block, -1 for a rest layer, and unit),
// which lohand's planner reads the weight unit from.
//
// Groups: a "no_weight_decay" group (lr_scale 1, weight decay 0) of the
// parameters the rule picks but for grouped ones, then "param_groups[n]"
// per request (lr_scale = the group's lr / the job's; 1 when both are 0),
// each as element ranges, adjacent ones merged; with data-parallel ranks
// as ranges of this rank's shards.
//
// A description with a spec: its settings and the spec made are checked by
// the rules lohand runs (spec/model_spec_checks.h: CheckSpecSettings first,
// CheckModelShape last; their refusals carry the field, RefusedField). One
// without asks for the layers alone.
//
// INVALID_ARGUMENT naming what is wrong: no trained parameters, a block
// index out of range, a unit index over 4096, a negative dimension; a group or
// rule naming a parameter the model does not have, a group naming an untrained
// one, a parameter in two groups, a group lr or weight decay that is not finite
// and >= 0, a group lr other than 0 when the job's is 0.
absl::StatusOr<v1::ModelCut> CutModel(const v1::ModelDescription& model);

}  // namespace lohan

#endif  // LOHAN_CLIENT_MODEL_CUT_H_
