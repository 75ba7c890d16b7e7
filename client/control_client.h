#ifndef LOHAN_CLIENT_CONTROL_CLIENT_H_
#define LOHAN_CLIENT_CONTROL_CLIENT_H_

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/lohan.grpc.pb.h"

namespace lohan {

// The socket a client uses when none is given: $LOHAN_SOCKET, else the
// daemon's default /run/lohan/lohand.sock.
std::string DefaultSocketPath();

// A C++ client of lohand's control plane. Connecting says Hello, so a
// returned client has a daemon that answered and speaks our protocol.
// Thread-safe: calls may come from several threads at once. A ModelSpec
// leaves the process only if it passes the checks lohand runs on it
// (CheckModelSpec, spec/model_spec_checks.h): CreateJob with a model and
// RegisterModel return that refusal without calling lohand.
class ControlClient {
 public:
  struct Options {
    std::string socket_path;  // empty: DefaultSocketPath()
    std::string client_name = "liblohan_client";
    std::chrono::milliseconds timeout{10000};  // per call
  };

  // UNAVAILABLE naming the socket when no daemon answers there;
  // FAILED_PRECONDITION when it speaks another protocol.
  static absl::StatusOr<std::unique_ptr<ControlClient>> Connect(
      Options options);

  const v1::HelloResponse& hello() const { return hello_; }
  const std::string& socket_path() const { return options_.socket_path; }

  absl::StatusOr<v1::Job> CreateJob(const v1::JobSpec& spec);
  // The whole answer: with JobSpec.model, how the daemon sized the arena.
  absl::StatusOr<v1::CreateJobResponse> CreateJobReply(const v1::JobSpec& spec);
  absl::StatusOr<v1::Job> AttachJob(const std::string& job_id);
  absl::StatusOr<v1::Job> DetachJob(const std::string& job_id);
  // Drains (after the iteration in progress) or kills a job's training;
  // what the daemon did, in words.
  absl::StatusOr<std::string> StopJob(const std::string& job_id, bool drain);
  absl::Status DeleteJob(const std::string& job_id);
  // Pins (`keep`) or unpins a job: lohand never deletes a pinned job on
  // its own ([jobs] keep_ended). The job as the daemon lists it.
  absl::StatusOr<v1::Job> KeepJob(const std::string& job_id, bool keep);
  absl::StatusOr<std::vector<v1::Job>> ListJobs();
  absl::StatusOr<v1::GetStatusResponse> GetStatus();
  absl::StatusOr<v1::RegisterModelResponse> RegisterModel(
      const v1::RegisterModelRequest& request);
  // The activation plan for the caller's job (attached by this process,
  // its model registered), kept by the daemon with the job's session.
  absl::StatusOr<v1::JobPlan> PlanJob(const v1::PlanJobRequest& request);
  // The whole plan kept with a job's session (its owner or root).
  absl::StatusOr<v1::JobPlan> GetJobPlan(const std::string& job_id);

 private:
  ControlClient(Options options, std::unique_ptr<v1::Lohan::Stub> stub);
  // A context whose deadline is this client's timeout, or `at_least` when
  // that is longer.
  std::unique_ptr<grpc::ClientContext> NewContext(
      std::chrono::milliseconds at_least = std::chrono::milliseconds(0)) const;
  absl::Status FromGrpc(const grpc::Status& status) const;
  // One unary call with NewContext(at_least)'s deadline, status mapped.
  template <typename Request, typename Response>
  absl::Status Invoke(
      grpc::Status (v1::Lohan::Stub::*method)(grpc::ClientContext*,
                                              const Request&, Response*),
      const Request& request, Response* response,
      std::chrono::milliseconds at_least = std::chrono::milliseconds(0)) const;

  const Options options_;
  const std::unique_ptr<v1::Lohan::Stub> stub_;
  v1::HelloResponse hello_;
};

}  // namespace lohan

#endif  // LOHAN_CLIENT_CONTROL_CLIENT_H_
