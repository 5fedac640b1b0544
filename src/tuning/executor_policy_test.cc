#include "stoker/tuning/executor_policy.h"

#include <gtest/gtest.h>

namespace stoker {
namespace {

using Kind = ExecutorDecision::Kind;

TEST(ExecutorPolicy, ProcessesNowWhenTheFirstBatchsRestPays) {
  ExecutorPolicy p(4);
  EXPECT_EQ(p.first_chunks(0.001, 10).kind, Kind::kStay);  // 10 ms left in the batch
  const ExecutorDecision d = p.first_chunks(0.001, 30);    // 30 ms: one a core but this one's
  EXPECT_EQ(d.kind, Kind::kProcesses);
  EXPECT_EQ(d.workers, 3);
  EXPECT_EQ(d.reason, "the first batch's rest takes 30 ms here");
}

TEST(ExecutorPolicy, ProcessesLaterWhenTheRestOfTheEpochPaysAtTheFastestPace) {
  ExecutorPolicy p(4);
  EXPECT_EQ(p.after_batch(0.0001, 4000).kind, Kind::kStay);  // 0.4 s of epoch left
  EXPECT_EQ(p.after_batch(0.0002, 3000).kind, Kind::kStay);  // the fastest pace so far counts
  EXPECT_DOUBLE_EQ(p.pace(), 0.0001);
  const ExecutorDecision d = p.after_batch(0.0002, 6000);  // 0.6 s
  EXPECT_EQ(d.kind, Kind::kProcesses);
  EXPECT_EQ(d.reason, "the rest of the epoch takes 0.60 s here");
  ExecutorPolicy persistent(2, /*forked=*/true, /*persistent=*/true);
  EXPECT_EQ(persistent.after_batch(0.0001, 2000).kind, Kind::kProcesses);  // 0.2 s, paid once
}

TEST(ExecutorPolicy, SpawnedWorkersMustPayTheirStartToo) {
  ExecutorPolicy spawned(2, /*forked=*/false);  // each worker imports torch first
  EXPECT_EQ(spawned.start_s(), ExecutorPolicy::kSpawnStartS);
  EXPECT_EQ(ExecutorPolicy(2).start_s(), 0.0);
  EXPECT_EQ(spawned.after_batch(0.001, 2000).kind, Kind::kStay);
  EXPECT_EQ(spawned.first_chunks(0.001, 30).kind, Kind::kStay);
  const ExecutorDecision d = spawned.after_batch(0.001, 3000);
  EXPECT_EQ(d.kind, Kind::kProcesses);
  EXPECT_EQ(d.workers, 1);
}

TEST(ExecutorPolicy, ThreadsWhenTwoTogetherBeatTheGain) {
  ExecutorPolicy threads(2, true, false, /*threads_allowed=*/true);
  EXPECT_TRUE(threads.threads_allowed());
  EXPECT_FALSE(threads.persistent());
  EXPECT_TRUE(threads.wants_thread_trial());
  const ExecutorDecision d = threads.thread_trial(0.003, 0.0016);  // 0.53x: releases the GIL
  EXPECT_EQ(d.kind, Kind::kThreads);
  EXPECT_EQ(d.workers, 2);
  EXPECT_EQ(d.reason,
            "two threads took 0.53x one thread's time a sample: the work releases the GIL");
  const ExecutorDecision same = threads.thread_trial(0.003, 0.003);
  EXPECT_EQ(same.kind, Kind::kStay);
  EXPECT_EQ(same.workers, 0);
  EXPECT_EQ(same.reason, "the measured work does not pay for workers");
  EXPECT_FALSE(ExecutorPolicy(1, true, false, true).wants_thread_trial());
  EXPECT_FALSE(ExecutorPolicy(4).wants_thread_trial());
}

// A batch that takes this process long to make: one worker a core (its help would hold up the
// batches workers finished); a quick one: a core left to this process.
TEST(ExecutorPolicy, HeavyBatchesGetOneWorkerACore) {
  ExecutorPolicy heavy(2, true, false, false, /*batch_size=*/64);
  const ExecutorDecision d = heavy.first_chunks(0.004, 60);  // 64 x 4 ms = 256 ms a batch
  EXPECT_EQ(d.kind, Kind::kProcesses);
  EXPECT_EQ(d.workers, 2);
  EXPECT_EQ(d.reason, "the first batch's rest takes 240 ms here; a batch takes 256 ms here: one "
                      "worker a core");
  ExecutorPolicy light(2, true, false, false, /*batch_size=*/64);
  EXPECT_EQ(light.after_batch(0.0005, 2000).workers, 1);  // 32 ms a batch
  EXPECT_EQ(ExecutorPolicy(1, true, false, false, 64).first_chunks(0.004, 60).workers, 1);
}

TEST(ExecutorPolicy, CoresBelowOneCountAsOne) {
  ExecutorPolicy p(0);
  EXPECT_EQ(p.cores(), 1);
  EXPECT_EQ(p.first_chunks(1.0, 10).workers, 1);
  EXPECT_STREQ(executor_kind_name(Kind::kProcesses), "processes");
  EXPECT_STREQ(executor_kind_name(Kind::kThreads), "threads");
  EXPECT_STREQ(executor_kind_name(Kind::kStay), "stay");
}

}  // namespace
}  // namespace stoker
