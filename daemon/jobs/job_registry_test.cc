#include "daemon/jobs/job_registry.h"

#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace lohan {
namespace {

using ::testing::HasSubstr;

constexpr uid_t kAlice = 1001;
constexpr uid_t kBob = 1002;

class JobRegistryTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string templ = ::testing::TempDir() + "/jobsXXXXXX";
    ASSERT_NE(mkdtemp(templ.data()), nullptr);
    state_dir_ = templ;
    registry_ = OpenRegistry();
  }

  std::unique_ptr<JobRegistry> OpenRegistry() {
    auto registry = JobRegistry::Open(
        {.state_dir = state_dir_, .host_pool_capacity_bytes = 1000});
    EXPECT_TRUE(registry.ok()) << registry.status();
    return registry.ok() ? *std::move(registry) : nullptr;
  }

  static v1::JobSpec Spec(const std::string& name, uint64_t pool = 0) {
    v1::JobSpec spec;
    spec.set_name(name);
    spec.set_host_pool_bytes(pool);
    return spec;
  }

  Caller alice_{.uid = kAlice, .pid = getpid()};
  Caller bob_{.uid = kBob, .pid = getpid()};
  Caller root_{.uid = 0, .pid = getpid()};
  std::string state_dir_;
  std::unique_ptr<JobRegistry> registry_;
};

TEST_F(JobRegistryTest, OwnerAndRootMayActOthersMayNot) {
  absl::StatusOr<v1::Job> job = registry_->Create(alice_, Spec("llama"));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->owner_uid(), kAlice);
  EXPECT_EQ(job->id(), "j-000001");
  EXPECT_EQ(job->state(), v1::JOB_STATE_DETACHED);

  // To bob, alice's job is exactly a missing one: the same code and the
  // same words, so ids tell him nothing.
  const absl::Status missing = registry_->Attach(bob_, "j-000077").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  const std::string missing_text = std::string(missing.message());
  auto as_missing = [&](const absl::Status& status) {
    EXPECT_EQ(status.code(), absl::StatusCode::kNotFound) << status;
    std::string text(status.message());
    text.replace(text.find(job->id()), job->id().size(), "j-000077");
    EXPECT_EQ(text, missing_text);
  };
  as_missing(registry_->Attach(bob_, job->id()).status());
  as_missing(registry_->Detach(bob_, job->id()).status());
  as_missing(registry_->Delete(bob_, job->id()));
  as_missing(registry_->CheckAttachedBy(bob_, job->id()).status());
  EXPECT_TRUE(registry_->List(bob_).empty());
  EXPECT_EQ(registry_->List(alice_).size(), 1u);
  EXPECT_EQ(registry_->List(root_).size(), 1u);

  absl::StatusOr<v1::Job> attached = registry_->Attach(alice_, job->id());
  ASSERT_TRUE(attached.ok()) << attached.status();
  EXPECT_EQ(attached->state(), v1::JOB_STATE_ATTACHED);
  EXPECT_EQ(attached->attached_pid(), getpid());
  // Same process again: idempotent.
  EXPECT_TRUE(registry_->Attach(alice_, job->id()).ok());
  EXPECT_EQ(registry_->Delete(alice_, job->id()).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(registry_->Detach(root_, job->id()).ok());
  EXPECT_TRUE(registry_->Delete(root_, job->id()).ok());
  EXPECT_TRUE(registry_->List(root_).empty());
}

TEST_F(JobRegistryTest, CheckAttachedByNamesTheProcess) {
  absl::StatusOr<v1::Job> job = registry_->Create(alice_, Spec("dp"));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(registry_->CheckAttachedBy(alice_, job->id()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(registry_->Attach(alice_, job->id()).ok());
  EXPECT_TRUE(registry_->CheckAttachedBy(alice_, job->id()).ok());
  EXPECT_EQ(registry_->CheckAttachedBy(bob_, job->id()).status().code(),
            absl::StatusCode::kNotFound);
  Caller other_process{.uid = kAlice, .pid = getppid()};
  EXPECT_EQ(
      registry_->CheckAttachedBy(other_process, job->id()).status().code(),
      absl::StatusCode::kFailedPrecondition);
}

TEST_F(JobRegistryTest, NamesAreCheckedAndUniquePerOwner) {
  ASSERT_TRUE(registry_->Create(alice_, Spec("run-1")).ok());
  EXPECT_EQ(registry_->Create(alice_, Spec("run-1")).status().code(),
            absl::StatusCode::kAlreadyExists);
  EXPECT_TRUE(registry_->Create(bob_, Spec("run-1")).ok());
  for (const std::string& bad :
       {std::string(""), std::string(65, 'a'), std::string("a b"),
        std::string("../x"), std::string("x\n"), std::string("\xff")}) {
    absl::StatusOr<v1::Job> job = registry_->Create(alice_, Spec(bad));
    EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

v1::JobSpec RankSpec(const std::string& name, const std::string& run,
                     uint32_t rank, uint32_t world_size) {
  v1::JobSpec spec;
  spec.set_name(name);
  spec.mutable_run()->set_name(run);
  spec.mutable_run()->set_rank(rank);
  spec.mutable_run()->set_world_size(world_size);
  return spec;
}

TEST_F(JobRegistryTest, RunsAreCheckedSayingWhatIsAllowed) {
  struct Bad {
    v1::JobSpec spec;
    std::string says;
  };
  const std::vector<Bad> bad = {
      {RankSpec("a", "", 0, 2), "run name must be 1 to 64 characters, got 0"},
      {RankSpec("a", std::string(65, 'r'), 0, 2),
       "run name must be 1 to 64 characters, got 65"},
      {RankSpec("a", "my run", 0, 2),
       "run name 'my run' may hold only letters, digits, '.', '_' and '-'"},
      {RankSpec("a", "dp", 0, 1),
       "run 'dp' has world_size 1; a distributed run has at least 2 ranks"},
      {RankSpec("a", "dp", 0, 0), "has world_size 0"},
      {RankSpec("a", "dp", 2, 2),
       "run 'dp' rank 2 is not below its world_size 2 (ranks are 0 to "
       "world_size - 1)"},
  };
  for (const Bad& b : bad) {
    absl::Status status = registry_->Create(alice_, b.spec).status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << b.says;
    EXPECT_THAT(std::string(status.message()), HasSubstr(b.says));
    EXPECT_THAT(std::string(status.message()), HasSubstr("job 'a'"));
  }
  EXPECT_TRUE(registry_->List(root_).empty());
  absl::StatusOr<v1::Job> last =
      registry_->Create(alice_, RankSpec("a", "dp", 1, 2));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_EQ(last->spec().run().rank(), 1u);
  EXPECT_EQ(last->spec().run().world_size(), 2u);
}

TEST_F(JobRegistryTest, OneJobPerRankOfARunPerOwner) {
  absl::StatusOr<v1::Job> rank0 =
      registry_->Create(alice_, RankSpec("dp.rank0", "dp", 0, 2));
  ASSERT_TRUE(rank0.ok()) << rank0.status();
  ASSERT_TRUE(registry_->Create(alice_, RankSpec("dp.rank1", "dp", 1, 2)).ok());
  // Rank 0 again under another job name: refused, naming the job.
  absl::Status again =
      registry_->Create(alice_, RankSpec("other", "dp", 0, 2)).status();
  EXPECT_EQ(again.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(std::string(again.message()),
              HasSubstr("rank 0 of run 'dp' is already job j-000001 "
                        "('dp.rank0') on this daemon"));
  // Another owner's run of that name, another run, and a job on its own of
  // that name are not the same rank.
  EXPECT_TRUE(registry_->Create(bob_, RankSpec("dp.rank0", "dp", 0, 2)).ok());
  EXPECT_TRUE(registry_->Create(alice_, RankSpec("x", "dp2", 0, 2)).ok());
  EXPECT_TRUE(registry_->Create(alice_, Spec("dp")).ok());
  // Once deleted, the rank may be created again.
  ASSERT_TRUE(registry_->Delete(alice_, rank0->id()).ok());
  EXPECT_TRUE(registry_->Create(alice_, RankSpec("other", "dp", 0, 2)).ok());
}

TEST_F(JobRegistryTest, UnknownJobIsNotFound) {
  absl::Status status = registry_->Detach(alice_, "j-999999").status();
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr("lohanctl jobs"));
}

TEST_F(JobRegistryTest, MalformedJobIdIsInvalidArgument) {
  EXPECT_EQ(registry_->Attach(alice_, "").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(registry_->Delete(alice_, std::string(1 << 20, 'j')).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(JobRegistryTest, AttachingClaimsNoPoolAskingBeyondThePoolIsRefused) {
  // The pool is claimed by an open data plane (daemon/session), not by an
  // attachment: attached jobs that never open one keep nobody out.
  absl::StatusOr<v1::Job> a = registry_->Create(alice_, Spec("a", 900));
  ASSERT_TRUE(a.ok());
  absl::StatusOr<v1::Job> b = registry_->Create(bob_, Spec("b", 900));
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(registry_->Attach(alice_, a->id()).ok());
  EXPECT_TRUE(registry_->Attach(bob_, b->id()).ok());
  // More than the whole pool never fits.
  absl::Status huge = registry_->Create(alice_, Spec("huge", 1001)).status();
  EXPECT_EQ(huge.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(huge.message()),
              HasSubstr("asks for 1001 bytes (1001 B) of host pool but the "
                        "whole pool is 1000"));
}

TEST_F(JobRegistryTest, QuotasBoundJobsAndWhatOneJobMayAskFor) {
  const QuotaTable quotas(
      UserLimits{.jobs = 2},
      {{kBob, UserLimits{.jobs = 1, .host_pool_bytes = 500, .ssd_bytes = 7}}});
  auto registry = JobRegistry::Open({.state_dir = state_dir_,
                                     .host_pool_capacity_bytes = 1000,
                                     .ssd_capacity_bytes = 100,
                                     .quotas = &quotas});
  ASSERT_TRUE(registry.ok()) << registry.status();
  ASSERT_TRUE((*registry)->Create(alice_, Spec("one")).ok());
  ASSERT_TRUE((*registry)->Create(alice_, Spec("two")).ok());
  absl::Status third = (*registry)->Create(alice_, Spec("three")).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(third.message()),
              HasSubstr("uid 1001 has 2 jobs and the quota is 2"));
  // Deleting one makes room.
  ASSERT_TRUE((*registry)->Delete(alice_, "j-000001").ok());
  EXPECT_TRUE((*registry)->Create(alice_, Spec("three")).ok());

  absl::Status pool = (*registry)->Create(bob_, Spec("big", 501)).status();
  EXPECT_EQ(pool.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(pool.message()),
              HasSubstr("uid 1002's quota ([quotas] host_pool) is 500"));
  v1::JobSpec ssd = Spec("ssd");
  ssd.set_ssd_bytes(8);
  absl::Status space = (*registry)->Create(bob_, ssd).status();
  EXPECT_THAT(std::string(space.message()),
              HasSubstr("8 bytes (8 B) of SSD space but uid 1002's quota"));
  ssd.set_ssd_bytes(101);
  space = (*registry)->Create(root_, ssd).status();
  EXPECT_THAT(std::string(space.message()), HasSubstr("the whole SSD array"));
  ASSERT_TRUE((*registry)->Create(bob_, Spec("only", 500)).ok());
  EXPECT_EQ((*registry)->Create(bob_, Spec("second")).status().code(),
            absl::StatusCode::kResourceExhausted);
}

TEST_F(JobRegistryTest, JobsSurviveReopenDetached) {
  absl::StatusOr<v1::Job> job = registry_->Create(alice_, Spec("keep"));
  ASSERT_TRUE(job.ok());
  ASSERT_TRUE(registry_->Attach(alice_, job->id()).ok());
  ASSERT_TRUE(registry_->Create(alice_, Spec("gone")).ok());
  ASSERT_TRUE(registry_->Delete(alice_, "j-000002").ok());
  registry_.reset();

  std::unique_ptr<JobRegistry> reopened = OpenRegistry();
  std::vector<v1::Job> jobs = reopened->List(root_);
  ASSERT_EQ(jobs.size(), 1u);
  EXPECT_EQ(jobs[0].spec().name(), "keep");
  EXPECT_EQ(jobs[0].owner_uid(), kAlice);
  EXPECT_EQ(jobs[0].state(), v1::JOB_STATE_DETACHED);
  EXPECT_FALSE(jobs[0].spec().has_run());
  // Ids are never reused.
  absl::StatusOr<v1::Job> next = reopened->Create(alice_, Spec("new"));
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->id(), "j-000003");
}

TEST_F(JobRegistryTest, RunSurvivesReopenAndStillBindsItsRank) {
  ASSERT_TRUE(registry_->Create(alice_, RankSpec("dp.rank3", "dp", 3, 4)).ok());
  registry_.reset();

  std::unique_ptr<JobRegistry> reopened = OpenRegistry();
  std::vector<v1::Job> jobs = reopened->List(alice_);
  ASSERT_EQ(jobs.size(), 1u);
  ASSERT_TRUE(jobs[0].spec().has_run());
  EXPECT_EQ(jobs[0].spec().run().name(), "dp");
  EXPECT_EQ(jobs[0].spec().run().rank(), 3u);
  EXPECT_EQ(jobs[0].spec().run().world_size(), 4u);
  EXPECT_EQ(
      reopened->Create(alice_, RankSpec("again", "dp", 3, 4)).status().code(),
      absl::StatusCode::kAlreadyExists);
}

TEST_F(JobRegistryTest, CorruptFileIsDataLoss) {
  std::ofstream(state_dir_ + "/jobs.binpb") << "\xff\xff\xff garbage";
  auto registry = JobRegistry::Open({.state_dir = state_dir_});
  EXPECT_EQ(registry.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(registry.status().message()),
              HasSubstr("jobs.binpb"));
}

TEST_F(JobRegistryTest, FailedSaveChangesNothing) {
  ASSERT_TRUE(registry_->Create(alice_, Spec("before")).ok());
  // A directory where the temp file must go makes the save fail.
  ASSERT_EQ(mkdir((state_dir_ + "/jobs.binpb.tmp").c_str(), 0700), 0);
  absl::StatusOr<v1::Job> job = registry_->Create(alice_, Spec("after"));
  EXPECT_FALSE(job.ok());
  EXPECT_THAT(std::string(job.status().message()),
              HasSubstr("saving the job registry"));
  EXPECT_EQ(registry_->List(alice_).size(), 1u);
  EXPECT_FALSE(registry_->Delete(alice_, "j-000001").ok());
  EXPECT_EQ(registry_->List(alice_).size(), 1u);
}

// [jobs] keep_ended: a job ended (no process attached) that long ago and
// not pinned is due; an attached or pinned one never is; the registry
// checks again as it deletes.
TEST_F(JobRegistryTest, EndedJobsAreDueAfterKeepEndedUnlessAttachedOrKept) {
  registry_.reset();
  auto opened = JobRegistry::Open(
      {.state_dir = state_dir_, .keep_ended = absl::Hours(1)});
  ASSERT_TRUE(opened.ok()) << opened.status();
  registry_ = *std::move(opened);
  const int64_t before = time(nullptr);
  absl::StatusOr<v1::Job> idle = registry_->Create(alice_, Spec("idle"));
  absl::StatusOr<v1::Job> running = registry_->Create(alice_, Spec("running"));
  absl::StatusOr<v1::Job> pinned = registry_->Create(alice_, Spec("pinned"));
  absl::StatusOr<v1::Job> bobs = registry_->Create(bob_, Spec("bobs"));
  ASSERT_TRUE(idle.ok() && running.ok() && pinned.ok() && bobs.ok());
  // Never attached: ended when created.
  EXPECT_GE(idle->ended_unix_seconds(), before);
  ASSERT_TRUE(registry_->Attach(alice_, running->id()).ok());
  EXPECT_EQ(registry_->Keep(bob_, pinned->id(), true).status().code(),
            absl::StatusCode::kNotFound);
  absl::StatusOr<v1::Job> kept = registry_->Keep(alice_, pinned->id(), true);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE(kept->kept());
  EXPECT_EQ(kept->delete_after_unix_seconds(), 0);

  for (const v1::Job& job : registry_->List(alice_)) {
    if (job.id() == idle->id()) {
      EXPECT_EQ(job.delete_after_unix_seconds(),
                idle->ended_unix_seconds() + 3600);
    } else {
      EXPECT_EQ(job.delete_after_unix_seconds(), 0) << job.id();
    }
  }
  EXPECT_TRUE(registry_->Expired(absl::Now()).empty());
  const absl::Time later = absl::Now() + absl::Hours(2);
  std::vector<std::string> due;
  for (const v1::Job& job : registry_->Expired(later)) due.push_back(job.id());
  EXPECT_EQ(due, (std::vector<std::string>{idle->id(), bobs->id()}));

  // Attached meanwhile: no longer due.
  ASSERT_TRUE(registry_->Attach(alice_, idle->id()).ok());
  EXPECT_EQ(registry_->DeleteExpired(idle->id(), later).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->DeleteExpired(pinned->id(), later).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->DeleteExpired("j-999999", later).code(),
            absl::StatusCode::kNotFound);
  ASSERT_TRUE(registry_->DeleteExpired(bobs->id(), later).ok());
  EXPECT_TRUE(registry_->List(bob_).empty());

  // Detached: ended now, due keep_ended later.
  const int64_t detached_at = time(nullptr);
  ASSERT_TRUE(registry_->Detach(alice_, idle->id()).ok());
  std::vector<v1::Job> ended = registry_->EndedOf(kAlice);
  ASSERT_EQ(ended.size(), 2u);  // idle and pinned; running is attached
  EXPECT_EQ(ended[0].id(), idle->id());
  EXPECT_GE(ended[0].ended_unix_seconds(), detached_at);
  EXPECT_EQ(ended[1].id(), pinned->id());
  EXPECT_TRUE(registry_->EndedOf(kBob).empty());
  EXPECT_TRUE(registry_->Expired(absl::Now()).empty());
  ASSERT_EQ(registry_->Expired(later).size(), 1u);

  // Unpinned: due as any other.
  ASSERT_TRUE(registry_->Keep(root_, pinned->id(), false).ok());
  EXPECT_EQ(registry_->Expired(later).size(), 2u);
  ASSERT_TRUE(registry_->Keep(alice_, pinned->id(), true).ok());

  // Pins and ends survive a restart; the job attached when lohand stopped
  // ended at the restart, not before.
  registry_.reset();
  const int64_t restarted = time(nullptr);
  opened = JobRegistry::Open(
      {.state_dir = state_dir_, .keep_ended = absl::Hours(1)});
  ASSERT_TRUE(opened.ok()) << opened.status();
  registry_ = *std::move(opened);
  for (const v1::Job& job : registry_->List(alice_)) {
    EXPECT_EQ(job.kept(), job.id() == pinned->id()) << job.id();
    if (job.id() == running->id()) {
      EXPECT_GE(job.ended_unix_seconds(), restarted);
    }
    if (job.id() == idle->id()) {
      EXPECT_LE(job.ended_unix_seconds(), restarted);
    }
  }
  // Nothing is ever due with keep_ended zero.
  registry_.reset();
  registry_ = OpenRegistry();
  EXPECT_TRUE(registry_->Expired(later + absl::Hours(24 * 365)).empty());
  for (const v1::Job& job : registry_->List(root_)) {
    EXPECT_EQ(job.delete_after_unix_seconds(), 0);
  }
}

TEST_F(JobRegistryTest, DeadProcessLosesItsAttachment) {
  absl::StatusOr<v1::Job> job = registry_->Create(alice_, Spec("crashy"));
  ASSERT_TRUE(job.ok());
  pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    pause();
    _exit(0);
  }
  Caller child_caller{.uid = kAlice, .pid = child};
  ASSERT_TRUE(registry_->Attach(child_caller, job->id()).ok());
  EXPECT_EQ(registry_->Attach(alice_, job->id()).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(registry_->CountAll().attached, 1u);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(registry_->CountAll().attached, 0u);
  EXPECT_TRUE(registry_->Attach(alice_, job->id()).ok());
}

}  // namespace
}  // namespace lohan
