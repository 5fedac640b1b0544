#include "stoker/diagnosis.h"

#include <gtest/gtest.h>

namespace stoker {
namespace {

DiagnosisInputs base() {
  DiagnosisInputs in;
  in.wall_seconds = 10;
  in.usable_cores = 4;
  in.physical_memory_bytes = 16ull << 30;
  in.rss_bytes = 1ull << 30;
  in.memory_budget = 1ull << 30;
  in.buffer_bytes_peak = 64ull << 20;
  in.stages = {{"workers", 4, 1000, 30, 29}, {"consumer", 1, 1000, 9, 9}};
  in.core_utilization = {0.9, 0.9, 0.9, 0.9};
  return in;
}

TEST(Diagnosis, SlowConsumerIsComputeBound) {
  DiagnosisInputs in = base();
  in.consumer_wait_seconds = 0.2;
  Diagnosis d = diagnose(in);
  EXPECT_EQ(d.verdict, "compute-bound");
  EXPECT_EQ(d.limiting_stage, "consumer");
  EXPECT_NE(d.action.find("mixed precision"), std::string::npos);
  EXPECT_NEAR(d.wait_fraction, 0.02, 1e-12);
}

TEST(Diagnosis, WaitingConsumerIsInputBound) {
  DiagnosisInputs in = base();
  in.consumer_wait_seconds = 6;
  Diagnosis d = diagnose(in);
  EXPECT_EQ(d.verdict, "input-bound");
  EXPECT_EQ(d.limiting_stage, "workers");
  EXPECT_NE(d.action.find("reduced-size decode"), std::string::npos);
  EXPECT_NE(d.action.find("more cores"), std::string::npos);
}

TEST(Diagnosis, InputBoundWithIdleCoresSaysMoreWorkers) {
  DiagnosisInputs in = base();
  in.consumer_wait_seconds = 6;
  in.stages[0].threads = 1;
  in.core_utilization = {1.0, 0.1, 0.1, 0.1};
  EXPECT_NE(diagnose(in).action.find("raise num_workers to 4"), std::string::npos);
}

TEST(Diagnosis, OffCpuWorkersPointAtStorage) {
  DiagnosisInputs in = base();
  in.consumer_wait_seconds = 6;
  in.stages[0].cpu_seconds = 5;  // of 30 busy seconds
  EXPECT_NE(diagnose(in).action.find("storage"), std::string::npos);
}

TEST(Diagnosis, MemoryRules) {
  DiagnosisInputs in = base();
  in.rss_bytes = 15ull << 30;
  EXPECT_EQ(diagnose(in).verdict, "memory-bound");
  in = base();
  in.consumer_wait_seconds = 5;
  in.buffer_bytes_peak = in.memory_budget;
  in.buffer_wait_seconds = 20;  // of 40 worker-seconds
  EXPECT_EQ(diagnose(in).verdict, "memory-bound");
  in.buffer_wait_seconds = 1;  // buffers full but workers rarely wait: not the limit
  EXPECT_EQ(diagnose(in).verdict, "input-bound");
  in = base();
  in.pinned_budget_bytes = 100;
  in.pinned_bytes = 95;
  EXPECT_EQ(diagnose(in).verdict, "memory-bound");
}

TEST(Diagnosis, ReadsTheSystem) {
  SystemSample a = read_system();
  volatile double x = 0;
  for (int i = 0; i < 1000000; ++i) x = x + i;
  SystemSample b = read_system();
  EXPECT_GT(a.rss_bytes, 0u);
  EXPECT_FALSE(a.core_total.empty());
  auto u = core_utilization(a, b);
  EXPECT_EQ(u.size(), a.core_total.size());
  for (double v : u) EXPECT_TRUE(v >= 0 && v <= 1);
  EXPECT_GT(thread_cpu_ns(), 0);
}

}  // namespace
}  // namespace stoker
