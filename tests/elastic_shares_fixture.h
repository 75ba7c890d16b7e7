#ifndef LOHAN_TESTS_ELASTIC_SHARES_FIXTURE_H_
#define LOHAN_TESTS_ELASTIC_SHARES_FIXTURE_H_

// Elastic shares (issue #47) with a real second uid: MultiUserTest's lohand
// and `nobody`, with training processes (train_client) of either user
// whose jobs lohand asks to shrink and grow, and what root's status says
// of their planes and jobs. The fixture of elastic_shares_test (clients
// that follow the asks) and elastic_shares_hostile_test (clients that
// answer them wrongly).
#include <sys/stat.h>
#include <unistd.h>

#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "tests/multi_user_fixture.h"

namespace lohan::testing {

// fp32, 512 KiB each: resident, the arena is 40 MiB and more, beyond half
// the harness's 64 MiB pool; streamed through 8 shared buffers, 9 MiB.
inline const std::vector<uint64_t> kWideLayers(40, 128 << 10);

class ElasticSharesTest : public MultiUserTest {
 protected:
  // A training process.
  struct Trainer {
    std::string name;
    std::vector<uint64_t> layers;
    std::string stop;     // it stops at the first iteration's end it exists
    std::string weights;  // its dump
    std::unique_ptr<BackgroundProcess> process;
  };

  // Starts a training process of `who` ("root" or "nobody") of job `name`
  // (a model of `layers`, created for it, ARENA_FIT_MOST) that trains
  // until stopped, following lohand's asks unless `flags` (train_client's,
  // e.g. --ignore-share) say otherwise; returns once it has trained two
  // steps.
  Trainer& StartTrainer(const std::string& who,
                        const std::vector<std::string>& flags = {},
                        const std::string& name = "trainer",
                        const std::vector<uint64_t>& layers = kWideLayers) {
    const std::string out = dir_.path() + "/out";
    if (access(out.c_str(), F_OK) != 0) {
      EXPECT_EQ(mkdir(out.c_str(), 0777), 0);
      EXPECT_EQ(chmod(out.c_str(), 0777), 0);  // past the umask
    }
    Trainer& trainer = trainers_[name];
    trainer.name = name;
    trainer.layers = layers;
    trainer.stop = out + "/stop-" + name;
    trainer.weights = out + "/weights-" + name;
    std::vector<std::string> argv = {
        who == "root" ? Runfile("tests/train_client")
                      : CopyForOtherUsers("tests/train_client", bin_),
        "--socket",
        daemon_->socket(),
        "--job",
        name,
        "--layers",
        absl::StrJoin(layers, ","),
        "--fit-arena",
        "--grad-slots",
        "8",
        "--weight-slots",
        "8",
        "--iterations",
        "1000000",
        "--until-file",
        trainer.stop,
        "--out",
        trainer.weights};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto started =
        BackgroundProcess::Start(who == "root" ? argv : AsNobody(argv));
    EXPECT_TRUE(started.ok()) << started.status() << daemon_->Log();
    if (started.ok()) trainer.process = *std::move(started);
    EXPECT_TRUE(AwaitPlane(
        [](const v1::SessionStatus& s) { return s.iteration() >= 2; }, name))
        << daemon_->Log();
    return trainer;
  }

  // Job `name`'s open plane (an empty status when it has none).
  v1::SessionStatus PlaneOf(const std::string& name = "trainer") {
    auto status = root_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    auto jobs = root_->ListJobs();
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    if (!status.ok() || !jobs.ok()) return {};
    std::string id;
    for (const v1::Job& job : *jobs) {
      if (job.spec().name() == name) id = job.id();
    }
    for (const v1::SessionStatus& open : status->sessions()) {
      if (open.job_id() == id) return open;
    }
    return {};
  }

  // Job `name` as root's GetStatus lists it (an empty one when it does
  // not), with what lohand asked of it and closed of it.
  v1::Job JobNamed(const std::string& name) {
    auto status = root_->GetStatus();
    EXPECT_TRUE(status.ok()) << status.status();
    if (!status.ok()) return {};
    for (const v1::Job& job : status->jobs()) {
      if (job.spec().name() == name) return job;
    }
    ADD_FAILURE() << "no job " << name;
    return {};
  }

  // Whether a plane holds less than its job's arena, its model registered.
  static bool Moved(const v1::SessionStatus& s) {
    return s.layers() != 0 && s.arena_bytes() < s.wanted_arena_bytes();
  }
  // Whether it holds its job's whole arena, its model registered.
  static bool Whole(const v1::SessionStatus& s) {
    return s.layers() != 0 && s.arena_bytes() == s.wanted_arena_bytes();
  }

  // Polls job `name`'s plane until `holds` (a failsafe of a minute, not a
  // measure).
  template <typename Predicate>
  bool AwaitPlane(Predicate holds, const std::string& name = "trainer") {
    for (int i = 0; i < 6000; ++i) {
      if (holds(PlaneOf(name))) return true;
      usleep(10 * 1000);
    }
    return false;
  }

  // Stops trainer `name` at its next iteration's end: it must exit cleanly
  // with the weights of an uninterrupted run of as many iterations.
  void StopAndCheckTrainer(const std::string& name = "trainer") {
    Trainer& trainer = trainers_.at(name);
    std::ofstream(trainer.stop) << "stop\n";
    EXPECT_EQ(trainer.process->Stop(0), 0) << daemon_->Log();
    std::ifstream done(trainer.stop + ".iterations");
    int iterations = 0;
    ASSERT_TRUE(done >> iterations) << "no " << trainer.stop << ".iterations";
    ASSERT_GT(iterations, 2);
    const absl::Status exact = CheckDumpedWeights(
        trainer.weights, {.layers = trainer.layers, .iterations = iterations});
    EXPECT_TRUE(exact.ok()) << exact;
  }

  std::map<std::string, Trainer> trainers_;
};

}  // namespace lohan::testing

#endif  // LOHAN_TESTS_ELASTIC_SHARES_FIXTURE_H_
