// The corruption sweep at the level a user sees: two jobs trained for real
// (AdamW through JobPipeline on a real store: one with resident 16-bit
// copies, one a data-parallel rank's with streamed 16-bit copies and kept
// commits), the store reopened in between so that the catalog begins with
// a snapshot of trained states and goes on with appended iterations. The
// truth is kept per job and iteration: every committed tensor's bytes.
// Then the catalog is cut at every record boundary and inside every
// record, each record is flipped, each block zeroed, and each block of the
// SSD data files flipped; each case opens the store and both jobs as lohand
// would and must end one of these ways:
//   - the store refuses the catalog, naming it (DATA_LOSS);
//   - a job refuses its states, naming the job (DATA_LOSS);
//   - a read of a version whose space was reused refuses it by its
//     checksum, naming the tensor (DATA_LOSS) - dead data;
//   - each job resumes at an iteration k it reports, and every tensor it
//     holds equals what training had at k.
// A job resuming with other bytes than those of the iteration it reports,
// or as a new job on a catalog that held its states, fails the test.
// Refused damage is salvaged (`lohand --salvage`) and opened again, under
// the same rule.

#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "daemon/optim/adam.h"
#include "daemon/sched/clip_test_util.h"
#include "daemon/sched/job_pipeline.h"
#include "daemon/store/catalog_record.h"
#include "daemon/store/record_log.h"
#include "daemon/store/tensor_store.h"
#include "daemon/store/test_util.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "layout/job_meta.h"

namespace lohan {
namespace {

using clip_test::Layout;
using clip_test::MakeGradients;
using testing::HasSubstr;
using testing_util::ReadWholeFile;
using testing_util::TempDir;
using testing_util::WriteWholeFile;

// A job's committed tensors: name -> bytes.
using Tensors = std::map<std::string, std::string>;

struct JobSetup {
  std::string name;
  bool stream_weight16;
  bool keep_previous_commit;
};
const JobSetup kJobs[] = {{"plain", false, false}, {"rank", true, true}};
constexpr int kFirstRun = 3;   // Iterations before the store is reopened.
constexpr int kSecondRun = 3;  // Iterations appended after its snapshot.

enum class Outcome {
  kCatalogRefused,
  kJobRefused,
  kDeadData,
  kExact,
  kWrong,
};

const char* Name(Outcome o) {
  switch (o) {
    case Outcome::kCatalogRefused:
      return "catalog refused";
    case Outcome::kJobRefused:
      return "job refused";
    case Outcome::kDeadData:
      return "dead data refused by checksum";
    case Outcome::kExact:
      return "resumed exactly";
    case Outcome::kWrong:
      return "WRONG";
  }
  return "?";
}

class CatalogSweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto updater = AdamUpdater::Create(nullptr, std::nullopt);
    ASSERT_TRUE(updater.ok()) << updater.status();
    updater_.emplace(*updater);
    layout_ = Layout(DType::kBFloat16);
    options_ = Options(dir_.path() + "/state");
    {
      auto store = TensorStore::Open(options_);
      ASSERT_TRUE(store.ok()) << store.status();
      Train(**store, /*from=*/0, kFirstRun, /*initialize=*/true);
    }
    {
      // The reopen compacts the catalog into a snapshot of trained states.
      auto store = TensorStore::Open(options_);
      ASSERT_TRUE(store.ok()) << store.status();
      Train(**store, kFirstRun, kSecondRun, /*initialize=*/false);
    }
    catalog_ = ReadWholeFile(CatalogPath(options_.state_dir));
    for (const std::string& ssd : options_.ssd_paths) {
      data_.push_back(ReadWholeFile(ssd + "/lohan.data"));
    }
    absl::StatusOr<RecordLog::Scan> scan =
        RecordLog::ScanFile(CatalogPath(options_.state_dir));
    ASSERT_TRUE(scan.ok());
    ASSERT_FALSE(scan->prefix.torn_tail);
    uint64_t at = 0;
    for (const std::string& record : scan->prefix.records) {
      starts_.push_back(at);
      at += RecordLog::FramedBytes(record.size());
    }
    starts_.push_back(at);
    absl::StatusOr<CatalogRecord> info =
        CatalogRecord::Decode(scan->prefix.records[0]);
    ASSERT_TRUE(info.ok());
    ASSERT_TRUE(info->has_snapshot_size);
    snapshot_end_ = starts_[info->snapshot_records + 1];
  }

  StoreOptions Options(const std::string& state_dir) {
    StoreOptions o;
    o.ssd_paths = {dir_.Subdir("ssd0"), dir_.Subdir("ssd1")};
    o.state_dir = state_dir;
    o.stripe_unit = 64 << 10;
    o.queue_depth = 8;
    o.device_capacity_bytes = 1 << 20;
    return o;
  }
  static std::string CatalogPath(const std::string& state_dir) {
    return state_dir + "/catalog.log";
  }

  // `reopen`: the job is known to have states (as lohand's registry
  // knows it), so a store without them is refused, not a new job.
  absl::StatusOr<std::unique_ptr<JobPipeline>> OpenJob(TensorStore& store,
                                                       const JobSetup& job,
                                                       bool reopen = true) {
    PipelineOptions options;
    options.expect_stored_states = reopen;
    options.buffers = 3;
    options.stream_weight16 = job.stream_weight16;
    options.keep_previous_commit = job.keep_previous_commit;
    return JobPipeline::Open(&store, *updater_, job.name, layout_, options);
  }

  // Trains both jobs, interleaved, for `iterations` from `from`, keeping
  // the truth after each commit (and at `from` itself).
  void Train(TensorStore& store, int from, int iterations, bool initialize) {
    std::vector<std::unique_ptr<JobPipeline>> pipelines;
    std::vector<std::vector<std::vector<uint8_t>>> copies;
    for (const JobSetup& job : kJobs) {
      auto pipeline = OpenJob(store, job, /*reopen=*/!initialize);
      ASSERT_TRUE(pipeline.ok()) << pipeline.status();
      ASSERT_EQ((*pipeline)->iteration(), static_cast<uint64_t>(from));
      copies.emplace_back(layout_.layer_elements.size());
      for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
        copies.back()[l].assign(layout_.layer_elements[l] * 2, 0);
      }
      if (initialize) {
        std::mt19937 rng(job.name.size());
        std::normal_distribution<float> dist(0.0f, 0.5f);
        for (size_t l = 0; l < layout_.layer_elements.size(); ++l) {
          std::vector<float> weights(layout_.layer_elements[l]);
          for (float& x : weights) x = dist(rng);
          ASSERT_TRUE((*pipeline)->InitializeWeights(l, weights.data()).ok());
        }
      }
      truth_[job.name][from] = Committed(store, job.name);
      pipelines.push_back(*std::move(pipeline));
    }
    for (int i = 1; i <= iterations; ++i) {
      for (size_t j = 0; j < pipelines.size(); ++j) {
        JobPipeline& p = *pipelines[j];
        const auto grads = MakeGradients(layout_, 100 * j + from + i, 1.0f, -1);
        ASSERT_TRUE(p.BeginIteration().ok());
        for (size_t l = layout_.layer_elements.size(); l-- > 0;) {
          void* out = kJobs[j].stream_weight16 ? nullptr : copies[j][l].data();
          ASSERT_TRUE(p.SubmitGradients(l, grads.bytes[l].data(), out).ok());
        }
        auto report = p.EndIteration();
        ASSERT_TRUE(report.ok()) << report.status();
        ASSERT_EQ(p.iteration(), static_cast<uint64_t>(from + i));
        truth_[kJobs[j].name][from + i] = Committed(store, kJobs[j].name);
      }
    }
  }

  // Every committed tensor of `job` (scratch aside); a read refused by a
  // checksum is returned as that error.
  static absl::StatusOr<Tensors> ReadCommitted(TensorStore& store,
                                               const std::string& job) {
    Tensors out;
    for (const std::string& name : store.List(job)) {
      absl::StatusOr<TensorInfo> info = store.Stat(job, name);
      if (!info.ok()) return info.status();
      if (info->committed_version == 0) continue;
      std::string data(info->bytes, '\0');
      absl::StatusOr<uint64_t> read = store.Read(
          job, name,
          absl::MakeSpan(reinterpret_cast<uint8_t*>(data.data()), data.size()));
      if (!read.ok()) return read.status();
      out[name] = std::move(data);
    }
    return out;
  }
  Tensors Committed(TensorStore& store, const std::string& job) {
    absl::StatusOr<Tensors> tensors = ReadCommitted(store, job);
    EXPECT_TRUE(tensors.ok()) << tensors.status();
    return tensors.ok() ? *tensors : Tensors();
  }

  static bool IsChecksumRefusal(const absl::Status& s) {
    return s.code() == absl::StatusCode::kDataLoss &&
           absl::StrContains(s.message(), "checksum");
  }

  // Opens the store in `state` and every job on it, as lohand would, and
  // classifies what it finds. `label` describes the case for failures.
  Outcome OpenAndJudge(const std::string& state, const std::string& label,
                       std::map<std::string, uint64_t>* resumed_at = nullptr) {
    StoreOptions o = options_;
    o.state_dir = state;
    auto store = TensorStore::Open(o);
    if (!store.ok()) {
      EXPECT_EQ(store.status().code(), absl::StatusCode::kDataLoss)
          << label << ": " << store.status();
      EXPECT_THAT(std::string(store.status().message()),
                  HasSubstr(CatalogPath(state)))
          << label;
      return Outcome::kCatalogRefused;
    }
    bool refused = false, dead = false;
    for (const JobSetup& job : kJobs) {
      auto pipeline = OpenJob(**store, job);
      if (!pipeline.ok()) {
        if (IsChecksumRefusal(pipeline.status())) {
          dead = true;
          continue;
        }
        EXPECT_EQ(pipeline.status().code(), absl::StatusCode::kDataLoss)
            << label << ": " << pipeline.status();
        EXPECT_THAT(std::string(pipeline.status().message()),
                    HasSubstr(absl::StrCat("job '", job.name, "'")))
            << label;
        if (pipeline.status().code() != absl::StatusCode::kDataLoss) {
          return Outcome::kWrong;
        }
        refused = true;
        continue;
      }
      const uint64_t k = (*pipeline)->iteration();
      pipeline->reset();
      if (resumed_at != nullptr) (*resumed_at)[job.name] = k;
      absl::StatusOr<Tensors> held = ReadCommitted(**store, job.name);
      if (!held.ok()) {
        EXPECT_TRUE(IsChecksumRefusal(held.status()))
            << label << ": " << held.status();
        if (!IsChecksumRefusal(held.status())) return Outcome::kWrong;
        dead = true;
        continue;
      }
      const auto& truth = truth_[job.name];
      auto at = truth.find(static_cast<int>(k));
      if (at == truth.end() || *held != at->second) {
        ADD_FAILURE() << label << ": job '" << job.name
                      << "' resumed at iteration " << k
                      << (at == truth.end() ? ", which it never had"
                                            : " with other bytes than it had "
                                              "there");
        return Outcome::kWrong;
      }
    }
    return refused ? Outcome::kJobRefused
           : dead  ? Outcome::kDeadData
                   : Outcome::kExact;
  }

  // A fresh state directory holding `catalog`, the SSD files as training
  // left them (a case may write to them: a reopened job rebuilds stale
  // 16-bit copies).
  std::string Case(const std::string& catalog) {
    const std::string state = dir_.Subdir("case" + std::to_string(cases_++));
    WriteWholeFile(CatalogPath(state), catalog);
    for (size_t d = 0; d < options_.ssd_paths.size(); ++d) {
      WriteWholeFile(options_.ssd_paths[d] + "/lohan.data", data_[d]);
    }
    return state;
  }

  // Judges `catalog`; when refused and `salvage`, salvages it and judges
  // the result too (salvage's own refusal of a catalog it cannot rebuild
  // counts as refused).
  Outcome Judge(const std::string& catalog, const std::string& label,
                bool salvage = true) {
    const std::string state = Case(catalog);
    const Outcome o = OpenAndJudge(state, label);
    ++counts_[o];
    if (o == Outcome::kCatalogRefused && salvage) {
      StoreOptions so = options_;
      so.state_dir = state;
      absl::StatusOr<std::string> report = TensorStore::Salvage(so);
      const Outcome after = report.ok()
                                ? OpenAndJudge(state, label + ", salvaged")
                                : Outcome::kCatalogRefused;
      ++salvaged_[after];
      EXPECT_NE(after, Outcome::kWrong) << label << ", salvaged";
    }
    return o;
  }

  TempDir dir_;
  std::optional<AdamUpdater> updater_;
  ModelLayout layout_;
  StoreOptions options_;
  std::map<std::string, std::map<int, Tensors>> truth_;
  std::string catalog_;
  std::vector<std::string> data_;
  std::vector<uint64_t> starts_;  // Record offsets, then the file's end.
  uint64_t snapshot_end_ = 0;
  int cases_ = 0;
  std::map<Outcome, int> counts_;
  std::map<Outcome, int> salvaged_;
};

std::string Describe(const std::map<Outcome, int>& counts) {
  std::string out;
  for (const auto& [o, n] : counts) {
    absl::StrAppend(&out, out.empty() ? "" : ", ", n, " ", Name(o));
  }
  return out.empty() ? "none" : out;
}

TEST_F(CatalogSweepTest, TheUntouchedCatalogResumesBothJobsAtTheirLastStep) {
  std::map<std::string, uint64_t> at;
  EXPECT_EQ(OpenAndJudge(Case(catalog_), "untouched", &at), Outcome::kExact);
  for (const JobSetup& job : kJobs) {
    EXPECT_EQ(at[job.name], kFirstRun + kSecondRun) << job.name;
  }
}

TEST_F(CatalogSweepTest, EveryCutIsRefusedOrResumesExactlyWhereItSays) {
  const size_t records = starts_.size() - 1;
  int inside_snapshot = 0;
  for (size_t r = 0; r < records; ++r) {
    const uint64_t begin = starts_[r], end = starts_[r + 1];
    for (uint64_t cut : {begin, begin + 5, (begin + end) / 2, end - 1}) {
      const std::string label =
          absl::StrCat("cut at ", cut, " (record ", r, " of ", records, ")");
      const Outcome o = Judge(catalog_.substr(0, cut), label);
      EXPECT_NE(o, Outcome::kWrong) << label;
      if (cut < snapshot_end_) {
        // Inside the synced snapshot: never a torn tail.
        EXPECT_EQ(o, Outcome::kCatalogRefused) << label;
        ++inside_snapshot;
      }
    }
  }
  // At the end of the snapshot and after it, every job resumes at an
  // iteration it had, from the snapshot's on.
  for (size_t r = 0; r <= records; ++r) {
    if (starts_[r] < snapshot_end_) continue;
    std::map<std::string, uint64_t> at;
    const std::string label = absl::StrCat("cut at ", starts_[r]);
    const Outcome o =
        OpenAndJudge(Case(catalog_.substr(0, starts_[r])), label, &at);
    EXPECT_TRUE(o == Outcome::kExact || o == Outcome::kDeadData) << label;
    for (const auto& [job, k] : at) {
      EXPECT_GE(k, static_cast<uint64_t>(kFirstRun)) << label << " " << job;
    }
  }
  std::printf(
      "job-level catalog sweep, cuts (%zu records, the first %llu bytes a "
      "snapshot): %s (%d cuts inside the snapshot, all refused); salvaged "
      "after refusal: %s\n",
      records, static_cast<unsigned long long>(snapshot_end_),
      Describe(counts_).c_str(), inside_snapshot, Describe(salvaged_).c_str());
  EXPECT_EQ(counts_[Outcome::kWrong], 0);
  EXPECT_EQ(salvaged_[Outcome::kWrong], 0);
}

TEST_F(CatalogSweepTest, EveryFlippedRecordAndZeroedBlockIsRefusedOrExact) {
  const size_t records = starts_.size() - 1;
  for (size_t r = 0; r < records; ++r) {
    const uint64_t begin = starts_[r], end = starts_[r + 1];
    for (uint64_t at :
         {begin, begin + 4, begin + 8, (begin + end) / 2, end - 1}) {
      std::string damaged = catalog_;
      damaged[at] = static_cast<char>(damaged[at] ^ 0x10);
      const std::string label =
          absl::StrCat("byte ", at, " flipped (record ", r, ")");
      const Outcome o = Judge(damaged, label);
      EXPECT_NE(o, Outcome::kWrong) << label;
      // Only the last record (a sync mark written after the last sync)
      // may be a torn append; damage anywhere else is refused.
      if (r + 1 < records) {
        EXPECT_EQ(o, Outcome::kCatalogRefused) << label;
      }
    }
  }
  for (uint64_t block = 0; block < catalog_.size(); block += 512) {
    std::string zeroed = catalog_;
    const uint64_t end = std::min<uint64_t>(block + 512, zeroed.size());
    for (uint64_t i = block; i < end; ++i) zeroed[i] = '\0';
    const std::string label = absl::StrCat("block at ", block, " zeroed");
    const Outcome o = Judge(zeroed, label);
    EXPECT_NE(o, Outcome::kWrong) << label;
    if (end < starts_[records - 1]) {
      EXPECT_EQ(o, Outcome::kCatalogRefused) << label;
    }
  }
  std::printf(
      "job-level catalog sweep, flipped bytes and zeroed blocks: %s; "
      "salvaged after refusal: %s\n",
      Describe(counts_).c_str(), Describe(salvaged_).c_str());
  EXPECT_EQ(counts_[Outcome::kWrong], 0);
  EXPECT_EQ(salvaged_[Outcome::kWrong], 0);
  EXPECT_GT(salvaged_[Outcome::kExact], 0);
}

// A flipped byte anywhere in the SSD data files: a checksum error naming
// the tensor when a committed version holds it, else dead space and the
// jobs resume exactly at their last step.
TEST_F(CatalogSweepTest, EveryFlippedDataBlockIsAChecksumErrorOrDead) {
  std::map<Outcome, int> counts;
  for (size_t d = 0; d < data_.size(); ++d) {
    const std::string original = data_[d];
    for (uint64_t block = 0; block < original.size(); block += 4096) {
      data_[d][block + 1000] = static_cast<char>(data_[d][block + 1000] ^ 0x04);
      const std::string label =
          absl::StrCat("SSD ", d, " byte ", block + 1000, " flipped");
      std::map<std::string, uint64_t> at;
      const Outcome o = OpenAndJudge(Case(catalog_), label, &at);
      ++counts[o];
      EXPECT_TRUE(o == Outcome::kExact || o == Outcome::kDeadData) << label;
      if (o == Outcome::kExact) {
        for (const auto& [job, k] : at) {
          EXPECT_EQ(k, static_cast<uint64_t>(kFirstRun + kSecondRun)) << label;
        }
      }
      data_[d] = original;
    }
  }
  std::printf("SSD data sweep (a byte flipped in every 4 KiB block): %s\n",
              Describe(counts).c_str());
  EXPECT_GT(counts[Outcome::kDeadData], 0);
  EXPECT_GT(counts[Outcome::kExact], 0);
}

}  // namespace
}  // namespace lohan
