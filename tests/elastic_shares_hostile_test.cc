// Elastic shares (issue #47) against clients that answer lohand's asks
// wrongly, with a real second uid: a job asked to shrink that begins its
// move and then asks for a buffer per layer in the arena it was given, one
// that acknowledges the ask and never moves, one that does not follow an
// ask to grow, and one that registered its model laid out as given, which
// lohand must not ask what it cannot follow. None takes more than its
// share, none disturbs the other user's plane, and a job's committed
// iterations are never lost.
#include <csignal>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "tests/elastic_shares_fixture.h"

namespace lohan::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

class ElasticSharesHostileTest : public ElasticSharesTest {
 protected:
  // Nobody's idle plane of 28 MiB (a one-layer model registered), within
  // its share (32 of the 64 MiB pool) but more than is free beside root's
  // whole 42 MiB job; returns once it is open. It writes the failure that
  // closed it, if any, to `told_`.
  std::unique_ptr<BackgroundProcess> NobodysIdlePlane() {
    told_ = dir_.path() + "/out/idle";
    auto idle = BackgroundProcess::Start(
        Nobody({"register-await", daemon_->socket(), "idle", told_,
                std::to_string(kIdleBytes)}));
    EXPECT_TRUE(idle.ok()) << idle.status() << daemon_->Log();
    if (!idle.ok()) return nullptr;
    EXPECT_THAT((*idle)->first_line(), HasSubstr("registered j-"))
        << daemon_->Log();
    return *std::move(idle);
  }

  // The lines of the whole file `path` (written aside and renamed).
  static std::vector<std::string> LinesOf(const std::string& path) {
    std::ifstream in(path);
    std::vector<std::string> lines;
    for (std::string line; std::getline(in, line);) lines.push_back(line);
    return lines;
  }

  static constexpr uint64_t kIdleBytes = uint64_t{28} << 20;
  std::string told_;
};

// Root's job, asked to shrink for nobody's plane, begins its move (the
// commit, its plane closed and opened again: the shrunk arena lohand
// reserved for it) and then registers its model with a buffer per layer,
// laid out as given: as much as its old arena. Refused, RESOURCE_EXHAUSTED
// naming the arena this plane holds, the job's and why (the ask, for uid
// 65534's job), and how to fit; nothing else changes. Nobody's plane,
// opened meanwhile, stays open, untouched. The same plane then registers
// the model as before (ARENA_FIT_MOST): in the shrunk arena, streamed, at
// the committed iteration, and root trains on to exact weights.
TEST_F(ElasticSharesHostileTest,
       AShrunkJobAskingForABufferPerLayerIsRefusedAndTrainsOnInItsArena) {
  StartDaemon("", {"--ssd-capacity", "512MiB"});
  const std::string answer = dir_.path() + "/out/answer";
  StartTrainer("root",
               {"--answer-shrink", "resident", "--answer-file", answer});
  ASSERT_TRUE(Whole(PlaneOf()));
  const uint64_t whole = PlaneOf().arena_bytes();
  std::unique_ptr<BackgroundProcess> idle = NobodysIdlePlane();
  ASSERT_NE(idle, nullptr);

  ASSERT_TRUE(WaitForFile(answer)) << daemon_->Log();
  const std::vector<std::string> said = LinesOf(answer);
  ASSERT_EQ(said.size(), 2u) << answer;
  const v1::SessionStatus shrunk = PlaneOf();
  EXPECT_LT(shrunk.arena_bytes(), whole);
  EXPECT_LE(shrunk.arena_bytes() + kIdleBytes, uint64_t{64} << 20);
  const std::string& refused = said[0];
  EXPECT_THAT(refused, HasSubstr("resident: RESOURCE_EXHAUSTED: "));
  EXPECT_THAT(refused, HasSubstr(absl::StrCat("holds ", shrunk.arena_bytes(),
                                              " bytes")));
  EXPECT_THAT(refused, HasSubstr(absl::StrCat(whole)));
  EXPECT_THAT(refused, HasSubstr("asked to shrink"));
  EXPECT_THAT(refused, HasSubstr("uid 65534's job"));
  EXPECT_THAT(refused, HasSubstr("ARENA_FIT_MOST"));
  EXPECT_THAT(refused, Not(HasSubstr("larger host_pool_bytes")));
  // Registered again on the same plane, at the iteration it committed.
  const uint64_t resumed = NumberAfter(said[1], "resumed at iteration ");
  EXPECT_GE(resumed, 2u) << said[1];
  EXPECT_EQ(resumed, NumberAfter(said[1], "of committed ")) << said[1];
  EXPECT_THAT(said[1], HasSubstr(absl::StrCat(" in ", shrunk.arena_bytes(),
                                              " bytes (8 grad buffers)")));
  EXPECT_EQ(shrunk.grad_slots(), 8u);
  EXPECT_EQ(PlaneOf("idle").arena_bytes(), kIdleBytes);

  ASSERT_TRUE(AwaitPlane([resumed](const v1::SessionStatus& s) {
    return s.iteration() >= resumed + 3;
  })) << daemon_->Log();
  EXPECT_EQ(PlaneOf().arena_bytes(), shrunk.arena_bytes());
  StopAndCheckTrainer();
  // Nobody's plane never noticed: open, its arena whole, not closed.
  EXPECT_EQ(PlaneOf("idle").arena_bytes(), kIdleBytes);
  EXPECT_EQ(access(told_.c_str(), F_OK), -1) << "nobody's plane was closed";
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid")));
  const v1::Job job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u);
  EXPECT_EQ(job.planes_closed(), 0u);
  // The refusal is the job's last failure, as `lohanctl jobs` shows it.
  EXPECT_THAT(job.last_failure(), HasSubstr("registering the model"));
  const v1::Job idles = JobNamed("idle");
  EXPECT_EQ(idles.arena_shrink_asks(), 0u);
  EXPECT_EQ(idles.planes_closed(), 0u);
}

// Root's job, asked to shrink, acknowledges as a move begins (it waits for
// its last commit) and moves no further: it keeps its plane between
// iterations, asking ITER_COMMITTED. That buys it nothing: after half
// nobody's wait it is closed at once, as one that ignores the ask, counted
// once and told why (ABORTED: for uid 65534's job's share of the host
// pool, and the iteration the job keeps); nobody's plane opens. Nothing
// committed is lost: an honest run resumes the job there, in the arena it
// was asked to shrink to, and trains on to exact weights.
TEST_F(ElasticSharesHostileTest,
       AJobThatAcknowledgesTheAskButDoesNotMoveIsClosedAfterTheWait) {
  StartDaemon("", {"--ssd-capacity", "512MiB"});
  const std::string answer = dir_.path() + "/out/answer";
  Trainer& trainer = StartTrainer(
      "root", {"--answer-shrink", "acknowledge", "--answer-file", answer});
  std::unique_ptr<BackgroundProcess> idle = NobodysIdlePlane();
  ASSERT_NE(idle, nullptr);
  ASSERT_TRUE(WaitForFile(answer)) << daemon_->Log();
  EXPECT_NE(trainer.process->Stop(0), 0);
  const std::vector<std::string> said = LinesOf(answer);
  ASSERT_EQ(said.size(), 2u) << answer;
  const uint64_t kept = NumberAfter(said[0], "acknowledged at iteration ");
  ASSERT_GE(kept, 2u) << said[0];
  const std::string& closed = said[1];
  EXPECT_THAT(closed, HasSubstr("closed: ABORTED: lohand closed this job's "
                                "data plane to give uid 65534's job"));
  EXPECT_THAT(closed, HasSubstr("its share of the host pool"));
  EXPECT_THAT(closed,
              HasSubstr(absl::StrCat("the job keeps iteration ", kept, ":")));
  EXPECT_EQ(LogLinesWith("was closed for uid 65534's job"), 1u)
      << daemon_->Log();
  v1::Job job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u) << daemon_->Log();
  EXPECT_EQ(job.arena_grow_asks(), 0u);
  EXPECT_EQ(job.planes_closed(), 1u) << daemon_->Log();
  EXPECT_THAT(job.last_failure(), HasSubstr("was closed for uid 65534's job"));
  EXPECT_EQ(JobNamed("idle").planes_closed(), 0u);
  EXPECT_EQ(PlaneOf("idle").arena_bytes(), kIdleBytes);

  // The job resumes at the iteration it kept, beside nobody's plane.
  const RunResult resumed = RunCommand(
      {Runfile("tests/train_client"), "--socket", daemon_->socket(), "--job",
       "trainer", "--layers", absl::StrJoin(kWideLayers, ","), "--fit-arena",
       "--grad-slots", "8", "--weight-slots", "8", "--iterations", "2", "--out",
       trainer.weights});
  ASSERT_EQ(resumed.exit_code, 0)
      << resumed.out << resumed.err << daemon_->Log();
  EXPECT_THAT(resumed.out, HasSubstr("buffers 8 gradient"));
  const absl::Status exact = CheckDumpedWeights(
      trainer.weights,
      {.layers = kWideLayers, .iterations = static_cast<int>(kept) + 2});
  EXPECT_TRUE(exact.ok()) << exact;
  EXPECT_EQ(access(told_.c_str(), F_OK), -1) << "nobody's plane was closed";
  job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u);
  EXPECT_EQ(job.planes_closed(), 1u);
}

// Root's job shrinks for nobody's plane (it follows asks to shrink) and,
// once nobody has left, is asked to grow (regrow_after = 1s), which it
// does not follow. That costs nothing: it trains on in its smaller arena,
// on the same plane, never closed, and lohand asks it once: the ask
// stands (each ITER_END's completion says it again) but is not made,
// counted or logged again, however many regrow_after pass.
TEST_F(ElasticSharesHostileTest, AGrowNotFollowedCostsNothingAndIsAskedOnce) {
  StartDaemon("[quotas]\nregrow_after = \"1s\"\n",
              {"--ssd-capacity", "512MiB"});
  StartTrainer("root", {"--ignore-grow"});
  std::unique_ptr<BackgroundProcess> idle = NobodysIdlePlane();
  ASSERT_NE(idle, nullptr);
  ASSERT_TRUE(AwaitPlane(Moved)) << daemon_->Log();
  const v1::SessionStatus shrunk = PlaneOf();
  idle->Stop(SIGKILL);

  ASSERT_TRUE(AwaitPlane([](const v1::SessionStatus& s) {
    return s.arena_asked_bytes() > s.arena_bytes();
  })) << daemon_->Log();
  const v1::SessionStatus asked = PlaneOf();
  EXPECT_EQ(asked.arena_bytes(), shrunk.arena_bytes());
  EXPECT_THAT(asked.arena_note(), HasSubstr("asked to grow"));
  // Five regrow_after, and as many iterations, unfollowed.
  const absl::Time since = absl::Now();
  ASSERT_TRUE(AwaitPlane([&](const v1::SessionStatus& s) {
    return s.iteration() >= asked.iteration() + 5 &&
           absl::Now() >= since + absl::Seconds(5);
  })) << daemon_->Log();
  const v1::SessionStatus later = PlaneOf();
  EXPECT_EQ(later.arena_bytes(), shrunk.arena_bytes());
  EXPECT_EQ(later.arena_asked_bytes(), asked.arena_asked_bytes());
  // Two planes in all: the first and the one it shrank to.
  EXPECT_EQ(LogLinesWith("data plane open for job " + later.job_id()), 2u)
      << daemon_->Log();
  EXPECT_EQ(LogLinesWith("asked to grow"), 1u) << daemon_->Log();
  v1::Job job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 1u);
  EXPECT_EQ(job.arena_grow_asks(), 1u);
  EXPECT_EQ(job.planes_closed(), 0u);
  StopAndCheckTrainer();
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("was closed for uid")));
  EXPECT_EQ(JobNamed("trainer").arena_grow_asks(), 1u);
}

// Root's job was created for its model (ARENA_FIT_MOST) but its client
// registered it laid out as given, a buffer per layer: its plane has no
// smaller arena it could move to, so lohand does not ask it to shrink
// (an ask it could only fail to follow, holding nobody's plane for the
// wait). For nobody's plane it is closed at the end of its iteration,
// nothing rolled back, counted once and told why; nobody's plane opens.
TEST_F(ElasticSharesHostileTest,
       AJobRegisteredWithABufferPerLayerIsClosedAtItsIterationsEndNotAsked) {
  StartDaemon("", {"--ssd-capacity", "512MiB"});
  Trainer& trainer = StartTrainer("root", {"--register-resident"});
  ASSERT_TRUE(Whole(PlaneOf()));
  ASSERT_EQ(PlaneOf().grad_slots(), kWideLayers.size());
  std::unique_ptr<BackgroundProcess> idle = NobodysIdlePlane();
  ASSERT_NE(idle, nullptr);
  EXPECT_NE(trainer.process->Stop(0), 0);  // told why: ABORTED
  EXPECT_THAT(daemon_->Log(), Not(HasSubstr("asked to shrink")));
  EXPECT_EQ(LogLinesWith("was closed for uid 65534's job"), 1u)
      << daemon_->Log();
  EXPECT_EQ(LogLinesWith("within that user's share (drain"), 1u)
      << daemon_->Log();
  const v1::Job job = JobNamed("trainer");
  EXPECT_EQ(job.arena_shrink_asks(), 0u);
  EXPECT_EQ(job.planes_closed(), 1u);
  EXPECT_THAT(job.last_failure(), HasSubstr("was closed for uid 65534's job"));
  EXPECT_EQ(PlaneOf("idle").arena_bytes(), kIdleBytes);
}

}  // namespace
}  // namespace lohan::testing
