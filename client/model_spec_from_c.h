#ifndef LOHAN_CLIENT_MODEL_SPEC_FROM_C_H_
#define LOHAN_CLIENT_MODEL_SPEC_FROM_C_H_

#include "absl/status/status.h"
#include "client/include/lohan/lohan_client.h"
#include "proto/lohan.pb.h"

namespace lohan {

// The C ABI's lohan_model_spec as the ModelSpec the daemon takes. A caller
// built against an older header passes the smaller struct it knows
// (spec->struct_size): only the fields it has are read, the others take
// their defaults. INVALID_ARGUMENT (texts naming lohan_model_register) for
// what the struct cannot mean: a size smaller than any version, no layers,
// NULL arrays with counts, a range's layer beyond 32 bits. The values are
// CheckModelSpec's (spec/model_spec_checks.h), before the spec is sent
// and again in lohand.
absl::Status SpecFromC(const lohan_model_spec& spec, v1::ModelSpec* model_spec);

// The scalars of `spec` alone (no layers, places or groups: its arrays are
// not read), for checking a binding's settings before there is a model
// (lohan_model_spec_check_settings). INVALID_ARGUMENT for a struct_size
// smaller than any version.
absl::Status SettingsFromC(const lohan_model_spec& spec,
                           v1::ModelSpec* model_spec);

}  // namespace lohan

#endif  // LOHAN_CLIENT_MODEL_SPEC_FROM_C_H_
