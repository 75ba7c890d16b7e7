// What a second user could try against a shared lohand, one attack per
// command, for tests/multi_user_test.cc (run as another uid with setpriv).
// Each command prints one result line first (so BackgroundProcess sees it),
// and the holding ones then keep what they took until killed.
//
//   hostile_client fill-ssd SOCKET NAME BYTES   ACT_PUT BYTES at a time, then
//                                               less, until a block is
//                                               refused; hold
//   hostile_client flood-data SOCKET N          N idle data-plane connections;
//                                               hold
//   hostile_client flood-control SOCKET N       N idle control connections;
//                                               hold
//   hostile_client register-huge SOCKET LAYERS  RegisterModel of LAYERS
//                                               one-element layers
//   hostile_client create-many SOCKET N         CreateJob N times
//   hostile_client probe SOCKET JOB             attach, detach, delete, kill
//                                               JOB and a missing id
//   hostile_client raw-call SOCKET METHOD TEXT  METHOD with TEXT as its
//                                               serialized request
//   hostile_client idle SOCKET SECONDS          one control connection that
//                                               says nothing: when was it
//                                               closed?
//   hostile_client attach-hold SOCKET NAME POOL a job asking for POOL bytes,
//                                               attached without a data
//                                               plane; hold
//   hostile_client register-hold SOCKET NAME    a job with a one-layer model
//                                               registered (its data plane
//                                               open); hold
//   hostile_client register-await SOCKET NAME OUT [POOL]
//                                               as register-hold (its arena
//                                               POOL bytes, 16 MiB if not
//                                               given), asking
//                                               ITER_COMMITTED every 20 ms
//                                               until a request fails; writes
//                                               "CODE: message" to the file
//                                               OUT and exits 0
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "client/control_client.h"
#include "client/data_plane.h"
#include "tests/harness/raw_control.h"

namespace lohan::testing {
namespace {

constexpr absl::Duration kTimeout = absl::Seconds(60);

[[noreturn]] void Hold() {
  std::fflush(stdout);
  for (;;) pause();
}

std::string Describe(const absl::Status& status) {
  return absl::StrCat(absl::StatusCodeToString(status.code()), ": ",
                      status.message());
}

int Fail(const char* step, const absl::Status& status) {
  std::printf("%s failed: %s\n", step, Describe(status).c_str());
  return 1;
}

uint64_t Number(const char* text) {
  uint64_t value = 0;
  if (!absl::SimpleAtoi(text, &value)) {
    std::fprintf(stderr, "not a number: %s\n", text);
    std::exit(2);
  }
  return value;
}

// A job of the caller's, attached by this process.
absl::StatusOr<v1::Job> CreateAttached(ControlClient& client,
                                       const std::string& name,
                                       uint64_t pool_bytes) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.set_host_pool_bytes(pool_bytes);
  absl::StatusOr<v1::Job> job = client.CreateJob(spec);
  if (!job.ok()) return job.status();
  if (auto attached = client.AttachJob(job->id()); !attached.ok()) {
    return attached.status();
  }
  return job;
}

v1::RegisterModelRequest OneLayerModel(const std::string& job_id,
                                       uint64_t activation_bytes) {
  v1::RegisterModelRequest request;
  request.set_job_id(job_id);
  request.mutable_model()->add_layer_elements(1024);
  request.mutable_model()->set_dtype(v1::DTYPE_BF16);
  request.mutable_model()->mutable_adam()->set_lr(1e-3);
  request.mutable_model()->mutable_adam()->set_beta1(0.9);
  request.mutable_model()->mutable_adam()->set_beta2(0.999);
  request.mutable_model()->mutable_adam()->set_eps(1e-8);
  request.mutable_model()->set_activation_bytes(activation_bytes);
  return request;
}

int FillSsd(ControlClient& client, const std::string& name, uint64_t bytes) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, name, 16 << 20);
  if (!job.ok()) return Fail("create", job.status());
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) return Fail("data plane", plane.status());
  auto registered = client.RegisterModel(OneLayerModel(job->id(), bytes));
  if (!registered.ok()) return Fail("register", registered.status());
  (*plane)->SetErrorText(registered->error_text_offset(),
                         registered->error_text_bytes());
  // Smaller and smaller puts once refused, down to one block: the array is
  // then as full as the daemon lets anyone make it.
  uint64_t stored = 0;
  uint64_t length = bytes;
  for (uint64_t id = 1;; ++id) {
    SubmissionEntry put{};
    put.op = static_cast<uint16_t>(RingOp::kActPut);
    put.activation_id = id;
    put.slot_offset = registered->activation_offset();
    put.length = length;
    absl::StatusOr<CompletionEntry> done = (*plane)->Call(put, kTimeout);
    if (done.ok()) {
      stored += length;
    } else if (length > 4096) {
      length /= 2;
    } else {
      std::printf("stored %llu bytes, then %s\n",
                  static_cast<unsigned long long>(stored),
                  Describe(done.status()).c_str());
      Hold();
    }
  }
}

// A connected unix socket to `path`, or -1.
int ConnectTo(const std::string& path) {
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::snprintf(address.sun_path, sizeof(address.sun_path), "%s", path.c_str());
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&address),
                        sizeof(address)) != 0) {
    if (fd >= 0) close(fd);
    return -1;
  }
  return fd;
}

// Opens `count` connections to `path` and says nothing on them; after a
// moment, counts those the daemon answered or closed.
int Flood(const std::string& path, uint64_t count) {
  std::vector<int> fds;
  for (uint64_t i = 0; i < count; ++i) {
    const int fd = ConnectTo(path);
    if (fd >= 0) fds.push_back(fd);
  }
  usleep(500 * 1000);
  size_t answered = 0;
  for (int fd : fds) {
    pollfd ready{.fd = fd, .events = POLLIN};
    if (poll(&ready, 1, 0) > 0) ++answered;
  }
  std::printf("connected %zu, answered or closed %zu\n", fds.size(), answered);
  Hold();
}

// Connects to the control socket, says nothing, and reports when the daemon
// closed the connection (or that it did not within `seconds`).
int Idle(const std::string& path, uint64_t seconds) {
  const int fd = ConnectTo(path);
  if (fd < 0) return Fail("connect", absl::UnavailableError(path));
  const auto start = std::chrono::steady_clock::now();
  pollfd ready{.fd = fd, .events = POLLIN | POLLRDHUP};
  while (poll(&ready, 1, static_cast<int>(seconds * 1000)) > 0) {
    char byte[256];
    if (read(fd, byte, sizeof(byte)) <= 0) {
      std::printf("closed after %.1f s\n",
                  std::chrono::duration<double>(
                      std::chrono::steady_clock::now() - start)
                      .count());
      return 0;
    }
  }
  std::printf("still open after %llu s\n",
              static_cast<unsigned long long>(seconds));
  return 0;
}

// OneLayerModel's model as `layers` layers of one element each.
v1::RegisterModelRequest OneElementLayers(const std::string& job_id,
                                          uint64_t layers) {
  v1::RegisterModelRequest request = OneLayerModel(job_id, 0);
  request.mutable_model()->clear_layer_elements();
  for (uint64_t l = 0; l < layers; ++l) {
    request.mutable_model()->add_layer_elements(1);
  }
  return request;
}

int RegisterHuge(ControlClient& client, uint64_t layers) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, "huge", 16 << 20);
  if (!job.ok()) return Fail("create", job.status());
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) return Fail("data plane", plane.status());
  v1::RegisterModelRequest request = OneElementLayers(job->id(), layers);
  const auto start = std::chrono::steady_clock::now();
  // Past liblohan_client's own checks, as a hostile client sends it.
  absl::Status status =
      RegisterModelPastTheClientChecks(client.socket_path(), request);
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  std::printf("%s (%.0f ms)\n", Describe(status).c_str(), ms);
  return 0;
}

int CreateMany(ControlClient& client, uint64_t count) {
  uint64_t created = 0;
  for (uint64_t i = 0; i < count; ++i) {
    v1::JobSpec spec;
    spec.set_name(absl::StrCat("many-", i));
    absl::StatusOr<v1::Job> job = client.CreateJob(spec);
    if (!job.ok()) {
      std::printf("created %llu, then %s\n",
                  static_cast<unsigned long long>(created),
                  Describe(job.status()).c_str());
      return 0;
    }
    ++created;
  }
  std::printf("created %llu\n", static_cast<unsigned long long>(created));
  return 0;
}

int Probe(ControlClient& client, const std::string& job_id) {
  for (const std::string& id : {job_id, std::string("j-999999")}) {
    std::printf("attach %s\n", Describe(client.AttachJob(id).status()).c_str());
    std::printf("detach %s\n", Describe(client.DetachJob(id).status()).c_str());
    std::printf("delete %s\n", Describe(client.DeleteJob(id)).c_str());
    std::printf("kill %s\n",
                Describe(client.StopJob(id, /*drain=*/false).status()).c_str());
  }
  return 0;
}

int RawCall(const std::string& socket, const std::string& method,
            const std::string& bytes) {
  auto channel =
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(30));
  grpc::Slice slice(bytes);
  grpc::ByteBuffer request(&slice, 1);
  grpc::ByteBuffer response;
  grpc::Status status;
  bool done = false;
  absl::Mutex mu;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &response,
                 [&](grpc::Status s) {
                   absl::MutexLock lock(&mu);
                   status = std::move(s);
                   done = true;
                 });
  absl::MutexLock lock(&mu);
  mu.Await(absl::Condition(&done));
  std::printf("%s: %s\n",
              absl::StatusCodeToString(
                  static_cast<absl::StatusCode>(status.error_code()))
                  .c_str(),
              status.error_message().c_str());
  return 0;
}

int AttachHold(ControlClient& client, const std::string& name,
               uint64_t pool_bytes) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, name, pool_bytes);
  if (!job.ok()) return Fail("create", job.status());
  std::printf("attached %s\n", job->id().c_str());
  Hold();
}

int RegisterHold(ControlClient& client, const std::string& name) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, name, 16 << 20);
  if (!job.ok()) return Fail("create", job.status());
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) return Fail("data plane", plane.status());
  auto registered = client.RegisterModel(OneLayerModel(job->id(), 0));
  if (!registered.ok()) return Fail("register", registered.status());
  std::printf("registered %s\n", job->id().c_str());
  Hold();
}

// register-hold whose process keeps using its plane until lohand closes it,
// then writes the failure its next request got to `out`.
int RegisterAwait(ControlClient& client, const std::string& name,
                  const std::string& out, uint64_t pool_bytes) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, name, pool_bytes);
  if (!job.ok()) return Fail("create", job.status());
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) return Fail("data plane", plane.status());
  auto registered = client.RegisterModel(OneLayerModel(job->id(), 0));
  if (!registered.ok()) return Fail("register", registered.status());
  std::printf("registered %s\n", job->id().c_str());
  std::fflush(stdout);
  SubmissionEntry committed{};
  committed.op = static_cast<uint16_t>(RingOp::kIterCommitted);
  absl::Status status;
  while (status.ok()) {
    usleep(20 * 1000);
    status = (*plane)->Call(committed, kTimeout).status();
  }
  // Whole or not at all: the test reads the file once it is there.
  const std::string partial = out + ".part";
  FILE* file = std::fopen(partial.c_str(), "w");
  if (file == nullptr) return 1;
  std::fprintf(file, "%s\n", Describe(status).c_str());
  if (std::fclose(file) != 0) return 1;
  return std::rename(partial.c_str(), out.c_str()) == 0 ? 0 : 1;
}

// A job of its own (`pool_bytes` of arena) with its model registered,
// which begins an iteration and holds it open (its plane is training);
// prints "began <job>" and holds until killed.
int BeginHold(ControlClient& client, const std::string& name,
              uint64_t pool_bytes) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, name, pool_bytes);
  if (!job.ok()) return Fail("create", job.status());
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) return Fail("data plane", plane.status());
  auto registered = client.RegisterModel(OneLayerModel(job->id(), 0));
  if (!registered.ok()) return Fail("register", registered.status());
  (*plane)->SetErrorText(registered->error_text_offset(),
                         registered->error_text_bytes());
  SubmissionEntry init{};  // its first weights: the staging slot's zeros
  init.op = static_cast<uint16_t>(RingOp::kInitWeights);
  init.slot_offset = registered->staging_offset();
  init.length = 1024 * 4;
  if (absl::Status done = (*plane)->Call(init, kTimeout).status(); !done.ok()) {
    return Fail("INIT_WEIGHTS", done);
  }
  SubmissionEntry begin{};
  begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
  if (absl::Status began = (*plane)->Call(begin, kTimeout).status();
      !began.ok()) {
    return Fail("ITER_BEGIN", began);
  }
  std::printf("began %s\n", job->id().c_str());
  Hold();
}

// A job of its own with the largest plan PlanJob makes (65536 blocks of 4
// saved tensors: 262144 decisions), kept with its session; prints
// "planned <blocks>" and holds it until killed.
v1::PlanJobRequest MaximalPlanRequest(const std::string& job_id) {
  v1::PlanJobRequest request;
  request.set_job_id(job_id);
  request.set_activation_host_bytes(1 << 20);
  v1::ClientProfile* profile = request.mutable_profile();
  profile->set_device_bytes(uint64_t{1} << 40);
  profile->set_device_flops(1e12);
  profile->set_host_to_device_bytes_per_second(1e10);
  profile->set_device_to_host_bytes_per_second(1e10);
  profile->set_blocks(65536);
  profile->set_parameters(1024);
  profile->set_block_parameters(1);
  profile->set_largest_layer_parameters(1024);
  profile->set_head_parameters(1);
  profile->set_first_layer_parameters(1);
  profile->set_forward_flops(1e9);
  profile->set_block_forward_flops(1e4);
  profile->set_batch(1);
  profile->set_seq(16);
  for (int t = 0; t < 4; ++t) {
    v1::MeasuredTensor* tensor = profile->add_block_tensors();
    tensor->set_name(std::string(64, 'n'));
    tensor->set_bytes(4096);
    tensor->set_recompute_flops(t % 2 == 0 ? 1e3 : 1e12);
  }
  return request;
}

// PlanJob, asked again while lohand is still measuring its machine.
absl::StatusOr<v1::JobPlan> PlanWhenReady(ControlClient& client,
                                          const v1::PlanJobRequest& request) {
  absl::StatusOr<v1::JobPlan> plan = client.PlanJob(request);
  for (int tries = 0; absl::IsUnavailable(plan.status()) && tries < 2400;
       ++tries) {
    usleep(50 * 1000);
    plan = client.PlanJob(request);
  }
  return plan;
}

// A job of its own, attached, its data plane open and a small model
// registered; the plane is returned through `plane` (kept open).
absl::StatusOr<v1::Job> RegisteredJob(ControlClient& client,
                                      const std::string& name,
                                      std::unique_ptr<DataPlane>* plane) {
  absl::StatusOr<v1::Job> job = CreateAttached(client, name, 1 << 20);
  if (!job.ok()) return job.status();
  auto opened = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!opened.ok()) return opened.status();
  *plane = *std::move(opened);
  auto registered = client.RegisterModel(OneLayerModel(job->id(), 0));
  if (!registered.ok()) return registered.status();
  return job;
}

int PlanHold(ControlClient& client, const std::string& name) {
  std::unique_ptr<DataPlane> plane;
  absl::StatusOr<v1::Job> job = RegisteredJob(client, name, &plane);
  if (!job.ok()) return Fail("job", job.status());
  absl::StatusOr<v1::JobPlan> plan =
      PlanWhenReady(client, MaximalPlanRequest(job->id()));
  if (!plan.ok()) return Fail("plan", plan.status());
  std::printf("planned %d blocks, %zu bytes\n", plan->block_modes_size(),
              plan->ByteSizeLong());
  Hold();
}

// `count` maximal PlanJobs of one job, each replacing the last one kept,
// then one PlanJob lohand refuses (a profile of no blocks: what lohand
// holds then is only what it keeps, every reply before it freed); prints
// "planned <count> times" and holds the job until killed.
int PlanLoop(ControlClient& client, uint64_t count) {
  std::unique_ptr<DataPlane> plane;
  absl::StatusOr<v1::Job> job =
      RegisteredJob(client, absl::StrCat("plan-loop-", getpid()), &plane);
  if (!job.ok()) return Fail("job", job.status());
  v1::PlanJobRequest request = MaximalPlanRequest(job->id());
  for (uint64_t i = 0; i < count; ++i) {
    absl::StatusOr<v1::JobPlan> plan = PlanWhenReady(client, request);
    if (!plan.ok()) return Fail("plan", plan.status());
  }
  request.mutable_profile()->set_blocks(0);
  if (absl::Status refused = client.PlanJob(request).status();
      !absl::IsInvalidArgument(refused)) {
    return Fail("a plan of no blocks", refused);
  }
  std::printf("planned %llu times\n", static_cast<unsigned long long>(count));
  Hold();
}

// `count` RegisterModels of a model of `layers` one-element layers on one
// job's data plane (each refused, or the first accepted and the rest
// refused as a second registration); prints "registered <n>, refused <m>
// (<last refusal>)".
int RegisterLoop(ControlClient& client, uint64_t layers, uint64_t count) {
  absl::StatusOr<v1::Job> job = CreateAttached(
      client, absl::StrCat("register-loop-", getpid()), 16 << 20);
  if (!job.ok()) return Fail("create", job.status());
  auto plane = DataPlane::Open(client.hello().data_socket_path(), job->id());
  if (!plane.ok()) return Fail("data plane", plane.status());
  v1::RegisterModelRequest request = OneElementLayers(job->id(), layers);
  // Two shared buffers of each kind: the arena holds any model, so what
  // refuses it is the SSD space its states need.
  request.mutable_model()->set_grad_slots(2);
  request.mutable_model()->set_weight_slots(2);
  uint64_t registered = 0, refused = 0;
  absl::Status last;
  for (uint64_t i = 0; i < count; ++i) {
    last = client.RegisterModel(request).status();
    ++(last.ok() ? registered : refused);
  }
  std::printf("registered %llu, refused %llu (%s)\n",
              static_cast<unsigned long long>(registered),
              static_cast<unsigned long long>(refused), Describe(last).c_str());
  return 0;
}

// A job of its own with its model registered, which sends a request, then
// breaks its submission ring (the producer's head far past anything the
// ring can hold); prints "corrupted <job>" and holds until killed.
int CorruptRing(ControlClient& client, const std::string& name) {
  std::unique_ptr<DataPlane> plane;
  absl::StatusOr<v1::Job> job = RegisteredJob(client, name, &plane);
  if (!job.ok()) return Fail("job", job.status());
  SubmissionEntry begin{};
  begin.op = static_cast<uint16_t>(RingOp::kIterBegin);
  (void)plane->Call(begin, absl::Seconds(5));
  // After our last push (the client's producer writes the head it keeps):
  // lohand finds it when it next looks at the ring.
  auto* header = reinterpret_cast<RingHeader*>(
      plane->arena() + plane->grant().submission_offset);
  header->head.store(header->tail.load() + (uint64_t{1} << 40));
  std::printf("corrupted %s\n", job->id().c_str());
  Hold();
}

int Main(int argc, char** argv) {
  if (argc < 4) {
    std::fprintf(stderr, "usage: %s COMMAND SOCKET ARG...\n", argv[0]);
    return 2;
  }
  const std::string command = argv[1];
  const std::string socket = argv[2];
  if (command == "flood-data") return Flood(socket + ".data", Number(argv[3]));
  if (command == "flood-control") return Flood(socket, Number(argv[3]));
  if (command == "idle") return Idle(socket, Number(argv[3]));
  if (command == "raw-call" && argc == 5) {
    return RawCall(socket, argv[3], argv[4]);
  }
  auto client = ControlClient::Connect({.socket_path = socket});
  if (!client.ok()) return Fail("connect", client.status());
  if (command == "fill-ssd" && argc == 5) {
    return FillSsd(**client, argv[3], Number(argv[4]));
  }
  if (command == "register-huge") {
    return RegisterHuge(**client, Number(argv[3]));
  }
  if (command == "create-many") return CreateMany(**client, Number(argv[3]));
  if (command == "probe") return Probe(**client, argv[3]);
  if (command == "attach-hold" && argc == 5) {
    return AttachHold(**client, argv[3], Number(argv[4]));
  }
  if (command == "register-hold") return RegisterHold(**client, argv[3]);
  if (command == "register-await" && (argc == 5 || argc == 6)) {
    return RegisterAwait(**client, argv[3], argv[4],
                         argc == 6 ? Number(argv[5]) : 16 << 20);
  }
  if (command == "begin-hold" && argc == 5) {
    return BeginHold(**client, argv[3], Number(argv[4]));
  }
  if (command == "plan-hold") return PlanHold(**client, argv[3]);
  if (command == "corrupt-ring") return CorruptRing(**client, argv[3]);
  if (command == "plan-loop") return PlanLoop(**client, Number(argv[3]));
  if (command == "register-loop" && argc == 5) {
    return RegisterLoop(**client, Number(argv[3]), Number(argv[4]));
  }
  std::fprintf(stderr, "unknown command or arguments: %s\n", command.c_str());
  return 2;
}

}  // namespace
}  // namespace lohan::testing

int main(int argc, char** argv) { return lohan::testing::Main(argc, argv); }
