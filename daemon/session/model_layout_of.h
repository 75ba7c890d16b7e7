#ifndef LOHAN_DAEMON_SESSION_MODEL_LAYOUT_OF_H_
#define LOHAN_DAEMON_SESSION_MODEL_LAYOUT_OF_H_

#include "absl/status/statusor.h"
#include "layout/model_layout.h"
#include "proto/lohan.pb.h"

namespace lohan {

// The one translation of a client's model description into the daemon's
// layout: layers, dtypes (an fp32 model's 16-bit copy is bf16, never
// written), the chunk (0: kDefaultChunkElements), Adam's hyperparameters
// and moment dtype, and each param group as an element group named by
// ParamGroup.name (or "param_groups[i]"), checked by ValidateLayout.
// REQUIRES: CheckModelSpec(spec) is OK. INVALID_ARGUMENT naming the
// range or group for what ValidateLayout or AddElementGroup refuse.
absl::StatusOr<ModelLayout> ModelLayoutOf(const v1::ModelSpec& spec);

}  // namespace lohan

#endif  // LOHAN_DAEMON_SESSION_MODEL_LAYOUT_OF_H_
