#include "client/control_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "spec/model_spec_checks.h"
#include "wire/version.h"

namespace lohan {

std::string DefaultSocketPath() {
  const char* from_env = std::getenv("LOHAN_SOCKET");
  if (from_env != nullptr && from_env[0] != '\0') return from_env;
  return "/run/lohan/lohand.sock";
}

ControlClient::ControlClient(Options options,
                             std::unique_ptr<v1::Lohan::Stub> stub)
    : options_(std::move(options)), stub_(std::move(stub)) {}

std::unique_ptr<grpc::ClientContext> ControlClient::NewContext(
    std::chrono::milliseconds at_least) const {
  auto context = std::make_unique<grpc::ClientContext>();
  context->set_deadline(std::chrono::system_clock::now() +
                        std::max(options_.timeout, at_least));
  return context;
}

absl::Status ControlClient::FromGrpc(const grpc::Status& status) const {
  if (status.ok()) return absl::OkStatus();
  if (status.error_code() == grpc::StatusCode::UNAVAILABLE ||
      status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    const bool denied =
        status.error_message().find("Permission denied") != std::string::npos;
    return absl::UnavailableError(absl::StrCat(
        "no lohand answers at ", options_.socket_path, " (",
        status.error_message(), "); ",
        denied ? "you may not open that socket: is your user allowed to use "
                 "lohan (the socket's group, see deploy/)?"
               : "is it running? ('systemctl status lohand', or pass the "
                 "socket with --socket / LOHAN_SOCKET)"));
  }
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

namespace {
constexpr int kMaxReceiveBytes = 64 << 20;
}  // namespace

absl::StatusOr<std::unique_ptr<ControlClient>> ControlClient::Connect(
    Options options) {
  if (options.socket_path.empty()) options.socket_path = DefaultSocketPath();
  grpc::ChannelArguments arguments;
  // GetStatus has a fixed bound far below this; ListJobs grows with the
  // jobs the caller may see (root: every user's), a few hundred bytes each.
  arguments.SetMaxReceiveMessageSize(kMaxReceiveBytes);
  // Unix sockets need no reconnect back-off; fail fast and say so.
  arguments.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  arguments.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  // lohand closes a control connection that stayed idle (its
  // control_idle_timeout); the first call after that finds the connection
  // gone before its request went out. One more attempt on a fresh
  // connection makes that invisible; a daemon that is really gone still
  // fails (UNAVAILABLE) after it.
  arguments.SetServiceConfigJSON(R"({"methodConfig": [{
      "name": [{"service": "lohan.v1.Lohan"}],
      "retryPolicy": {"maxAttempts": 2, "initialBackoff": "0.05s",
                      "maxBackoff": "0.05s", "backoffMultiplier": 1,
                      "retryableStatusCodes": ["UNAVAILABLE"]}}]})");
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("unix:", options.socket_path),
                                grpc::InsecureChannelCredentials(), arguments);
  std::unique_ptr<ControlClient> client(
      new ControlClient(std::move(options), v1::Lohan::NewStub(channel)));

  v1::HelloRequest request;
  request.mutable_client_protocol()->set_major(kProtocolMajor);
  request.mutable_client_protocol()->set_minor(kProtocolMinor);
  request.set_client_name(client->options_.client_name);
  if (absl::Status status =
          client->Invoke(&v1::Lohan::Stub::Hello, request, &client->hello_);
      !status.ok()) {
    return status;
  }
  return client;
}

template <typename Request, typename Response>
absl::Status ControlClient::Invoke(
    grpc::Status (v1::Lohan::Stub::*method)(grpc::ClientContext*,
                                            const Request&, Response*),
    const Request& request, Response* response,
    std::chrono::milliseconds at_least) const {
  auto context = NewContext(at_least);
  return FromGrpc((stub_.get()->*method)(context.get(), request, response));
}

absl::StatusOr<v1::Job> ControlClient::CreateJob(const v1::JobSpec& spec) {
  absl::StatusOr<v1::CreateJobResponse> response = CreateJobReply(spec);
  if (!response.ok()) return response.status();
  return response->job();
}

absl::StatusOr<v1::CreateJobResponse> ControlClient::CreateJobReply(
    const v1::JobSpec& spec) {
  if (spec.has_model()) {
    if (absl::Status checked = CheckModelSpec(spec.model()); !checked.ok()) {
      return checked;
    }
  }
  v1::CreateJobRequest request;
  *request.mutable_spec() = spec;
  v1::CreateJobResponse response;
  absl::Status status = Invoke(&v1::Lohan::Stub::CreateJob, request, &response);
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::Job> ControlClient::AttachJob(const std::string& job_id) {
  v1::AttachJobRequest request;
  request.set_job_id(job_id);
  v1::AttachJobResponse response;
  absl::Status status = Invoke(&v1::Lohan::Stub::AttachJob, request, &response);
  if (!status.ok()) return status;
  return response.job();
}

absl::StatusOr<std::string> ControlClient::StopJob(const std::string& job_id,
                                                   bool drain) {
  v1::StopJobRequest request;
  request.set_job_id(job_id);
  request.set_drain(drain);
  v1::StopJobResponse response;
  absl::Status status = Invoke(&v1::Lohan::Stub::StopJob, request, &response);
  if (!status.ok()) return status;
  return response.outcome();
}

absl::StatusOr<v1::Job> ControlClient::DetachJob(const std::string& job_id) {
  v1::DetachJobRequest request;
  request.set_job_id(job_id);
  v1::DetachJobResponse response;
  absl::Status status = Invoke(&v1::Lohan::Stub::DetachJob, request, &response);
  if (!status.ok()) return status;
  return response.job();
}

absl::Status ControlClient::DeleteJob(const std::string& job_id) {
  v1::DeleteJobRequest request;
  request.set_job_id(job_id);
  v1::DeleteJobResponse response;
  return Invoke(&v1::Lohan::Stub::DeleteJob, request, &response);
}

absl::StatusOr<v1::Job> ControlClient::KeepJob(const std::string& job_id,
                                               bool keep) {
  v1::KeepJobRequest request;
  request.set_job_id(job_id);
  request.set_keep(keep);
  v1::KeepJobResponse response;
  absl::Status status = Invoke(&v1::Lohan::Stub::KeepJob, request, &response);
  if (!status.ok()) return status;
  return response.job();
}

absl::StatusOr<std::vector<v1::Job>> ControlClient::ListJobs() {
  v1::ListJobsResponse response;
  absl::Status status =
      Invoke(&v1::Lohan::Stub::ListJobs, v1::ListJobsRequest(), &response);
  if (!status.ok()) return status;
  return std::vector<v1::Job>(response.jobs().begin(), response.jobs().end());
}

absl::StatusOr<v1::GetStatusResponse> ControlClient::GetStatus() {
  v1::GetStatusResponse response;
  absl::Status status =
      Invoke(&v1::Lohan::Stub::GetStatus, v1::GetStatusRequest(), &response);
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::RegisterModelResponse> ControlClient::RegisterModel(
    const v1::RegisterModelRequest& request) {
  if (absl::Status checked = CheckModelSpec(request.model()); !checked.ok()) {
    return checked;
  }
  v1::RegisterModelResponse response;
  // Opening a large model's states takes a while, and lohand may wait up
  // to a minute for SSD space other users give back (docs/security.md).
  constexpr std::chrono::minutes kRegisterTime(3);
  absl::Status status = Invoke(&v1::Lohan::Stub::RegisterModel, request,
                               &response, kRegisterTime);
  if (!status.ok()) return status;
  return response;
}

absl::StatusOr<v1::JobPlan> ControlClient::GetJobPlan(
    const std::string& job_id) {
  v1::GetJobPlanRequest request;
  request.set_job_id(job_id);
  v1::PlanJobResponse response;
  absl::Status status =
      Invoke(&v1::Lohan::Stub::GetJobPlan, request, &response);
  if (!status.ok()) return status;
  return response.plan();
}

absl::StatusOr<v1::JobPlan> ControlClient::PlanJob(
    const v1::PlanJobRequest& request) {
  v1::PlanJobResponse response;
  absl::Status status = Invoke(&v1::Lohan::Stub::PlanJob, request, &response);
  if (!status.ok()) return status;
  return response.plan();
}

}  // namespace lohan
