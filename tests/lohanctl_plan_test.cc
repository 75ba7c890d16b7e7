// `lohanctl plan` as a user runs it: presets and config.json files, text,
// JSON and the plot, and the refusals. It needs no daemon.
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/control_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layout/byte_size.h"
#include "tests/harness/daemon_process.h"
#include "tests/harness/subprocess.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;

// The RTX 4090 server of the LoHan paper, 256 GB and 3 SSDs.
const std::vector<std::string> kMachine = {
    "--device-memory", "24GiB",  "--device-tflops",  "165",
    "--h2d-gbps",      "25",     "--d2h-gbps",       "25",
    "--host-memory",   "256GiB", "--ssds",           "3",
    "--ssd-read-gbps", "6.5",    "--ssd-write-gbps", "3.4"};

RunResult Plan(std::vector<std::string> args, bool machine = true) {
  std::vector<std::string> argv = {Runfile("client/ctl/lohanctl"), "plan"};
  argv.insert(argv.end(), args.begin(), args.end());
  if (machine) argv.insert(argv.end(), kMachine.begin(), kMachine.end());
  return RunCommand(argv);
}

TEST(LohanctlPlan, APresetOnADescribedMachine) {
  RunResult result = Plan({"--model", "gpt-13b", "--batch", "8,16"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("model gpt-13b: 12.85 B parameters, 40 "
                                    "blocks x 5120 wide, sequence 1024"));
  EXPECT_THAT(result.out, HasSubstr("largest batch that fits at sequence"));
  EXPECT_THAT(result.out, HasSubstr("batch 8: "));
  EXPECT_THAT(result.out, HasSubstr("batch 16: "));
  EXPECT_THAT(result.out, HasSubstr("<- binds"));
  EXPECT_THAT(result.out, HasSubstr("mlp_up"));
}

TEST(LohanctlPlan, PerBlockPlansAreWhatThePluginTakes) {
  // The paper's 768 GB, 12-SSD server: a minimum inside, some blocks swapped.
  std::vector<std::string> args = {"--model", "gpt-13b", "--batch", "16",
                                   "--per-block"};
  for (size_t i = 0; i < kMachine.size(); i += 2) {
    const bool host = kMachine[i] == "--host-memory";
    const bool ssds = kMachine[i] == "--ssds";
    args.push_back(kMachine[i]);
    args.push_back(host ? "768GiB" : ssds ? "12" : kMachine[i + 1]);
  }
  RunResult result = Plan(args, /*machine=*/false);
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("by block: activations=[\"offload\"] * "));
  EXPECT_THAT(result.out, HasSubstr("[\"swap\"] * "));
  RunResult json =
      Plan({"--model", "gpt-13b", "--batch", "16", "--per-block", "--json"});
  ASSERT_EQ(json.exit_code, 0) << json.err;
  google::protobuf::Struct parsed;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(json.out, &parsed).ok());
  const auto& plan =
      parsed.fields().at("plans").list_value().values(0).struct_value();
  EXPECT_EQ(plan.fields().at("block_modes").list_value().values_size(), 40);
  // One point per block, and the first (nothing but inputs offloaded).
  EXPECT_EQ(plan.fields().at("curve").list_value().values_size(), 41);
}

TEST(LohanctlPlan, JsonHasEveryTensorAndTheCurve) {
  RunResult result = Plan({"--model", "llama-7b", "--batch", "4", "--json"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  google::protobuf::Struct json;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(result.out, &json).ok())
      << result.out;
  EXPECT_EQ(json.fields().at("parameters").number_value(), 6738415616.0);
  const auto& plans = json.fields().at("plans").list_value();
  ASSERT_EQ(plans.values_size(), 1);
  const auto& plan = plans.values(0).struct_value().fields();
  // 32 blocks x 8 saved tensors (fused attention: no scores).
  EXPECT_EQ(plan.at("tensors").list_value().values_size(), 32 * 8);
  EXPECT_GE(plan.at("curve").list_value().values_size(), 1);
  EXPECT_GT(plan.at("iteration_seconds").number_value(), 0);
  // lohan's layout, part by part: the embeddings, the final norm with the
  // head, then the blocks; the arena and the daemon's chunk buffers; what
  // registering sets aside on the SSDs and a step's streamed gradients.
  const auto& layers = json.fields().at("layer_elements").list_value();
  ASSERT_EQ(layers.values_size(), 2 + 32);
  double sum = 0;
  for (const auto& layer : layers.values()) sum += layer.number_value();
  EXPECT_EQ(sum, 6738415616.0);
  auto number = [&](const char* field) {
    return plan.at(field).number_value();
  };
  EXPECT_GT(number("arena_bytes"), 0);
  EXPECT_GT(number("update_buffer_bytes"), 0);
  EXPECT_EQ(number("host_fixed_bytes"),
            number("arena_bytes") + number("update_buffer_bytes"));
  EXPECT_GT(number("ssd_set_aside_bytes"), 2 * number("ssd_state_bytes"));
  EXPECT_GE(number("ssd_state_bytes"), number("ssd_state_tensor_bytes"));
  EXPECT_EQ(number("ssd_fixed_bytes"),
            number("ssd_set_aside_bytes") + number("ssd_scratch_bytes"));
}

// The issue's case: a 13B model on a 256 GiB host. The plan divides the
// host memory between lohand's pool and its state tier: every state in
// RAM, on the SSDs only the durable commits' writes.
TEST(LohanctlPlan, The13BStatesStayInRamOnA256GiBHost) {
  auto plan_of = [](const std::vector<std::string>& more) {
    std::vector<std::string> args = {"--model", "gpt-13b", "--batch", "8",
                                     "--json"};
    args.insert(args.end(), more.begin(), more.end());
    RunResult result = Plan(args);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    google::protobuf::Struct json;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(result.out, &json).ok())
        << result.out;
    const double parameters = json.fields().at("parameters").number_value();
    google::protobuf::Struct plan =
        json.fields().at("plans").list_value().values(0).struct_value();
    return std::make_pair(plan, parameters);
  };
  auto [split, p] = plan_of({"--commit-interval", "4"});
  auto number = [](const google::protobuf::Struct& plan, const char* field) {
    return plan.fields().at(field).number_value();
  };
  EXPECT_EQ(number(split, "resident_state_bytes"), 12 * p);
  EXPECT_EQ(number(split, "state_ssd_read_bytes"), 0);
  EXPECT_EQ(number(split, "state_ssd_write_bytes"), 3 * p);
  EXPECT_EQ(number(split, "pool_bytes") + number(split, "state_tier_bytes"),
            256.0 * (uint64_t{1} << 30));
  auto [none, unused] = plan_of({"--state-tier", "0"});
  EXPECT_EQ(number(none, "resident_state_bytes"), 0);
  EXPECT_EQ(number(none, "state_ssd_read_bytes"), 12 * p);
  EXPECT_EQ(number(none, "state_ssd_write_bytes"), 12 * p);
  EXPECT_LT(number(split, "iteration_seconds"),
            number(none, "iteration_seconds") / 2);
  RunResult text = Plan({"--model", "gpt-13b", "--batch", "8"});
  EXPECT_THAT(text.out, HasSubstr("host memory 256.0 GiB (divided between "
                                  "lohand's pool and its state tier"));
  EXPECT_THAT(text.out, HasSubstr("154.2 GB of 154.2 GB in RAM (pool "));
}

// What the training process holds in host memory besides lohand: the
// activations the plan puts on the host, the largest one it reads back
// from the SSDs, a save_pretrained's largest parameter in 16 bits; the
// line and the JSON say the same, and the number moves with the batch and
// the host memory (the room for activations).
TEST(LohanctlPlan, WhatTheTrainerHoldsMovesWithItsActivations) {
  auto plan_of = [](const std::string& batch, const std::string& host) {
    std::vector<std::string> args = {"--model", "llama-7b",     "--batch",
                                     batch,     "--state-tier", "0"};
    for (size_t i = 0; i < kMachine.size(); i += 2) {
      args.push_back(kMachine[i]);
      args.push_back(kMachine[i] == "--host-memory" ? host : kMachine[i + 1]);
    }
    RunResult text = Plan(args, /*machine=*/false);
    EXPECT_EQ(text.exit_code, 0) << text.err;
    args.push_back("--json");
    RunResult result = Plan(args, /*machine=*/false);
    EXPECT_EQ(result.exit_code, 0) << result.err;
    google::protobuf::Struct json;
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(result.out, &json).ok())
        << result.out;
    google::protobuf::Struct plan =
        json.fields().at("plans").list_value().values(0).struct_value();
    const double total = plan.fields().at("trainer_host_bytes").number_value();
    // The printed line carries the JSON's number.
    EXPECT_THAT(text.out, HasSubstr(absl::StrFormat(
                              "trainer: %.1f GB host at its peak besides "
                              "lohand (activations offloaded to host ",
                              total / 1e9)));
    return plan;
  };
  auto number = [](const google::protobuf::Struct& plan, const char* field) {
    return plan.fields().at(field).number_value();
  };
  auto part = [](const google::protobuf::Struct& plan, const char* field) {
    return plan.fields()
        .at("trainer_host")
        .struct_value()
        .fields()
        .at(field)
        .number_value();
  };
  auto check_parts = [&](const google::protobuf::Struct& plan) {
    EXPECT_EQ(part(plan, "activations"), number(plan, "host_activation_bytes"));
    EXPECT_EQ(part(plan, "checkpoint_load"), 0);  // ranged reads
    EXPECT_EQ(part(plan, "checkpoint_save"), 2.0 * 32000 * 4096);
    EXPECT_EQ(part(plan, "arena_mapped"), number(plan, "arena_bytes"));
    EXPECT_EQ(number(plan, "trainer_host_bytes"),
              part(plan, "activations") + part(plan, "activation_read") +
                  part(plan, "frozen_weights") + part(plan, "checkpoint_save") +
                  part(plan, "device"));
  };
  // A larger batch puts more activations on the host.
  const google::protobuf::Struct small = plan_of("16", "256GiB");
  const google::protobuf::Struct large = plan_of("64", "256GiB");
  check_parts(small);
  check_parts(large);
  EXPECT_GT(number(large, "host_activation_bytes"),
            number(small, "host_activation_bytes"));
  EXPECT_EQ(
      number(large, "trainer_host_bytes") - number(small, "trainer_host_bytes"),
      number(large, "host_activation_bytes") -
          number(small, "host_activation_bytes"));
  // Less host memory: fewer on the host, the rest on the SSDs, one of them
  // read back at a time.
  const google::protobuf::Struct tight = plan_of("64", "64GiB");
  check_parts(tight);
  EXPECT_GT(number(tight, "ssd_activation_bytes"), 0);
  EXPECT_GT(part(tight, "activation_read"), 0);
  EXPECT_LT(number(tight, "trainer_host_bytes"),
            number(large, "trainer_host_bytes"));
}

TEST(LohanctlPlan, AConfigJsonAndAPlot) {
  PublicTempDir dir;
  const std::string config = dir.path() + "/my-gpt2/config.json";
  ASSERT_EQ(RunCommand({"/bin/mkdir", "-p", dir.path() + "/my-gpt2"}).exit_code,
            0);
  std::ofstream(config) << R"({"model_type": "gpt2", "n_embd": 768,
      "n_head": 12, "n_layer": 12, "n_positions": 1024,
      "vocab_size": 50257})";
  const std::string plot = dir.path() + "/plan.svg";
  RunResult result = Plan({"--model", config, "--batch", "8,32", "--plot", plot,
                           "--eager-attention", "--tensors"});
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_THAT(result.out, HasSubstr("model my-gpt2: 0.12 B parameters"));
  EXPECT_THAT(result.out, HasSubstr("eager (scores saved) attention"));
  EXPECT_THAT(result.out, HasSubstr("block  11  "));
  std::ifstream in(plot);
  std::stringstream svg;
  svg << in.rdbuf();
  EXPECT_THAT(svg.str(), HasSubstr("<svg"));
  EXPECT_THAT(svg.str(), HasSubstr("batch 32"));
  EXPECT_THAT(svg.str(), HasSubstr("<polyline"));
}

TEST(LohanctlPlan, WhatDoesNotFitIsSaidAndTheExitCodeIsOne) {
  RunResult result = Plan({"--model", "gpt-175b", "--batch", "8,256"});
  EXPECT_EQ(result.exit_code, 1) << result.err;
  EXPECT_THAT(result.out, HasSubstr("   256  does not fit: The device's "
                                    "working set"));
  EXPECT_THAT(result.out, HasSubstr("batch 8: "));
}

TEST(LohanctlPlan, BadInputIsRefusedWithTheWayOut) {
  RunResult unknown = Plan({"--model", "gpt-9000b", "--batch", "8"});
  EXPECT_EQ(unknown.exit_code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("no preset model 'gpt-9000b'; presets: "));
  RunResult missing =
      Plan({"--model", "gpt-13b", "--batch", "8", "--device-memory", "24GiB"},
           /*machine=*/false);
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_THAT(missing.err,
              HasSubstr("describe the machine: --device-tflops, --h2d-gbps"));
  RunResult no_file =
      Plan({"--model", "/nonexistent/config.json", "--batch", "8"});
  EXPECT_EQ(no_file.exit_code, 2);
  EXPECT_THAT(no_file.err, HasSubstr("cannot read /nonexistent/config.json"));
  RunResult bad_size =
      Plan({"--model", "gpt-13b", "--batch", "8", "--device-memory", "lots",
            "--host-memory", "1GiB"},
           /*machine=*/false);
  EXPECT_EQ(bad_size.exit_code, 2);
  EXPECT_THAT(bad_size.err, HasSubstr("--device-memory"));
  for (const char* interval : {"0", "-1", "9999999"}) {
    RunResult bad_interval = Plan(
        {"--model", "gpt-13b", "--batch", "8", "--commit-interval", interval});
    EXPECT_EQ(bad_interval.exit_code, 2) << interval;
    EXPECT_THAT(bad_interval.err,
                HasSubstr("--commit-interval must be from 1 (every "
                          "iteration durable)"))
        << interval;
  }
  RunResult bad_tier =
      Plan({"--model", "gpt-13b", "--batch", "8", "--state-tier", "most"});
  EXPECT_EQ(bad_tier.exit_code, 2);
  EXPECT_THAT(bad_tier.err, HasSubstr("--state-tier: "));
  EXPECT_THAT(bad_tier.err, HasSubstr("(or \"split\")"));
  RunResult zero_batch = Plan({"--model", "gpt-13b", "--batch", "0"});
  EXPECT_NE(zero_batch.exit_code, 0);
  RunResult unwritable = Plan({"--model", "gpt-13b", "--batch", "8", "--plot",
                               "/nonexistent/dir/plan.svg"});
  EXPECT_EQ(unwritable.exit_code, 2);
  EXPECT_THAT(unwritable.err, HasSubstr("cannot write /nonexistent/dir"));
  std::vector<std::string> argv = {Runfile("client/ctl/lohanctl"),
                                   "--socket",
                                   "/nonexistent/lohand.sock",
                                   "plan",
                                   "--this-machine",
                                   "--model",
                                   "gpt-13b",
                                   "--batch",
                                   "8"};
  RunResult no_daemon = RunCommand(argv);
  EXPECT_EQ(no_daemon.exit_code, 2);
  EXPECT_THAT(no_daemon.err, HasSubstr("/nonexistent/lohand.sock"));
}

// --this-machine: host memory, SSDs and optimizer from a real lohand's
// pool and its measured profile; the device from the flags.
TEST(LohanctlPlan, ThisMachineTakesWhatLohandMeasured) {
  PublicTempDir dir;
  auto daemon = DaemonProcess::Start(dir.path());
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = ControlClient::Connect({.socket_path = (*daemon)->socket()});
  ASSERT_TRUE(client.ok()) << client.status();
  // Measured beside the serving: there within moments.
  absl::StatusOr<v1::GetStatusResponse> status;
  for (int i = 0; i < 3000; ++i) {
    status = (*client)->GetStatus();
    ASSERT_TRUE(status.ok()) << status.status();
    if (status->has_profile()) break;
    usleep(10 * 1000);
  }
  ASSERT_TRUE(status->has_profile()) << (*daemon)->Log();
  const v1::HostProfile& profile = status->profile();
  ASSERT_EQ(profile.ssds_size(), 1);
  EXPECT_GT(profile.ssds(0).read_bytes_per_second(), 0);
  EXPECT_GT(profile.ssds(0).write_bytes_per_second(), 0);
  EXPECT_GT(profile.optimizer_parameters_per_second_per_thread(), 0);
  EXPECT_EQ(profile.probe_bytes(), uint64_t{4} << 20);
  const std::vector<std::string> lohanctl = {Runfile("client/ctl/lohanctl"),
                                             "--socket", (*daemon)->socket()};
  auto run = [&](std::vector<std::string> args) {
    std::vector<std::string> argv = lohanctl;
    argv.insert(argv.end(), args.begin(), args.end());
    return RunCommand(argv);
  };
  RunResult shown = run({"status"});
  EXPECT_THAT(shown.out, HasSubstr("  measured     SSDs "));
  // The state tier lohand has for jobs (its "auto" size here), beside the
  // pool, and its default durability (by time: planned as a durable write
  // now and then, not each iteration's).
  const uint64_t tier = status->pool().state_tier_bytes();
  EXPECT_EQ(status->pool().commit_interval(), 0u);
  const std::string tier_text =
      tier == 0 ? " (no state tier: states on the SSDs); 1 SSDs x"
                : absl::StrCat(" + a state tier of ", FormatByteSize(tier),
                               ", durable by time; 1 SSDs x");
  // The test daemon's 64 MiB pool is too small for gpt-13b's buffers: the
  // refusal says so, from this machine's numbers.
  RunResult small =
      run({"plan", "--this-machine", "--model", "gpt-13b", "--batch", "1",
           "--device-memory", "24GiB", "--device-tflops", "165", "--h2d-gbps",
           "25", "--d2h-gbps", "25"});
  EXPECT_EQ(small.exit_code, 1) << small.err;
  EXPECT_THAT(small.out, HasSubstr("host memory 64.0 MiB" + tier_text));
  EXPECT_THAT(small.out, HasSubstr("give lohand a larger host pool"));
  // Flags override what lohand said: with more host memory and SSD space
  // than the test daemon's, the same question fits.
  RunResult bigger = run(
      {"plan", "--this-machine", "--model", "gpt-13b", "--batch", "1",
       "--device-memory", "24GiB", "--device-tflops", "165", "--h2d-gbps", "25",
       "--d2h-gbps", "25", "--host-memory", "64GiB", "--ssd-capacity", "1TiB"});
  EXPECT_EQ(bigger.exit_code, 0) << bigger.err << bigger.out;
  EXPECT_THAT(bigger.out, HasSubstr("host memory 64.0 GiB" + tier_text));
  EXPECT_THAT(bigger.out,
              HasSubstr(absl::StrCat("state tier ", FormatByteSize(tier),
                                     "); on the SSDs per iteration")));
  // A flag overrides the tier and the interval too.
  RunResult no_tier = run({"plan",
                           "--this-machine",
                           "--model",
                           "gpt-13b",
                           "--batch",
                           "1",
                           "--device-memory",
                           "24GiB",
                           "--device-tflops",
                           "165",
                           "--h2d-gbps",
                           "25",
                           "--d2h-gbps",
                           "25",
                           "--host-memory",
                           "64GiB",
                           "--ssd-capacity",
                           "1TiB",
                           "--state-tier",
                           "0",
                           "--commit-interval",
                           "4"});
  EXPECT_EQ(no_tier.exit_code, 0) << no_tier.err << no_tier.out;
  EXPECT_THAT(no_tier.out,
              HasSubstr("host memory 64.0 GiB (no state tier: states on the "
                        "SSDs); 1 SSDs x"));
  EXPECT_THAT(no_tier.out, HasSubstr("0.0 GB of 154.2 GB in RAM (pool 64.0 "
                                     "GiB, state tier 0 B); on the SSDs per "
                                     "iteration 12.00 B/param read, 12.00 "
                                     "written"));
  // The device is not lohand's to know.
  RunResult no_device =
      run({"plan", "--this-machine", "--model", "gpt-13b", "--batch", "1"});
  EXPECT_EQ(no_device.exit_code, 2);
  EXPECT_THAT(no_device.err,
              HasSubstr("describe the machine: --device-memory, "
                        "--device-tflops, --h2d-gbps, --d2h-gbps ("));
}

}  // namespace
}  // namespace lohan::testing
