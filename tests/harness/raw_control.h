#ifndef LOHAN_TESTS_HARNESS_RAW_CONTROL_H_
#define LOHAN_TESTS_HARNESS_RAW_CONTROL_H_

#include <string>

#include "absl/status/status.h"
#include "proto/lohan.pb.h"

namespace lohan::testing {

// RegisterModel straight over gRPC to the lohand at `socket`, past the
// checks liblohan_client's ControlClient runs on a spec before it sends
// it (spec/model_spec_checks.h): what lohand itself answers a client that
// skips them, as a hostile one would. The call waits up to a minute.
absl::Status RegisterModelPastTheClientChecks(
    const std::string& socket, const v1::RegisterModelRequest& request);

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_HARNESS_RAW_CONTROL_H_
