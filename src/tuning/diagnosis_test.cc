#include "stoker/tuning/diagnosis.h"

#include <gtest/gtest.h>

#include <condition_variable>
#include <mutex>
#include <optional>

#include "stoker/cuda/cuda.h"

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

// The diagnosis knows no dataset: a stage, its share and its advice come with the figures.
TEST(Diagnosis, AStageOfTheDatasetsOwnThatTakesMostOfTheWorkersTimeLimits) {
  DiagnosisInputs in = base();
  in.consumer_wait_seconds = 6;
  in.source_figures = {{"decode seconds", 24, "s", "decode", "re-encode with a shorter GOP"},
                       {"transform seconds", 5, "s", "transform", "lighter transforms"},
                       {"frames decoded per frame delivered", 5, "", "", ""}};
  Diagnosis d = diagnose(in);  // of 30 busy seconds: 80% decoding
  EXPECT_EQ(d.verdict, "input-bound");
  EXPECT_EQ(d.limiting_stage, "decode");
  EXPECT_NE(d.action.find("shorter GOP"), std::string::npos) << d.action;
  EXPECT_EQ(d.reasons.back(),
            "decode 80% of the workers' busy time, transform 17%; frames decoded per frame "
            "delivered 5");
  in.source_figures[0].value = 6;  // mostly elsewhere: the workers, not one stage
  EXPECT_EQ(diagnose(in).limiting_stage, "workers");
  in.source_figures[1].value = 20;  // the busiest stage is the one that limits
  EXPECT_EQ(diagnose(in).limiting_stage, "transform");
  EXPECT_NE(diagnose(in).action.find("lighter transforms"), std::string::npos);
  in.source_figures[1].value = 5;
  in.source_figures[0].value = 24;
  in.stages[0].threads = 1;  // idle cores come first
  in.core_utilization = {1.0, 0.1, 0.1, 0.1};
  EXPECT_NE(diagnose(in).action.find("raise num_workers to 4"), std::string::npos);
  EXPECT_EQ(diagnose(in).limiting_stage, "decode");
  in.source_figures.clear();  // a dataset without figures: the plain rule
  EXPECT_EQ(diagnose(in).limiting_stage, "workers");
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

// GPU figures (NVML) fed synthetically: what the verdict does with them on a real GPU.
DiagnosisInputs with_gpu(double wait_seconds, double gpu_utilization) {
  DiagnosisInputs in = base();
  in.consumer_wait_seconds = wait_seconds;
  in.gpu_present = true;
  in.gpu_utilization = gpu_utilization;
  in.gpu_memory_used = 30ull << 30;
  in.gpu_memory_total = 80ull << 30;
  return in;
}

bool mentions(const std::vector<std::string>& reasons, const std::string& what) {
  for (const std::string& r : reasons)
    if (r.find(what) != std::string::npos) return true;
  return false;
}

TEST(Diagnosis, ATinyModelWaitingOnAnIdleGpuIsInputBound) {
  Diagnosis d = diagnose(with_gpu(6, 0.15));
  EXPECT_EQ(d.verdict, "input-bound");
  EXPECT_EQ(d.limiting_stage, "workers");
  EXPECT_TRUE(mentions(d.reasons, "GPU busy 15% of the time"));
  EXPECT_TRUE(mentions(d.reasons, "idle 85% of the time"));
  EXPECT_TRUE(mentions(d.reasons, "30720 MiB of 81920 MiB"));
}

TEST(Diagnosis, AFullGpuIsComputeBoundEvenWhenTheHostWaited) {
  // ResNet-50 with the host running ahead: next() blocks while the GPU still works on queued
  // steps, so the host-side wait is high though the GPU never ran dry.
  Diagnosis d = diagnose(with_gpu(4, 0.97));
  EXPECT_EQ(d.verdict, "compute-bound");
  EXPECT_EQ(d.limiting_stage, "consumer");
  EXPECT_TRUE(mentions(d.reasons, "GPU busy 97% of the time"));
  EXPECT_TRUE(mentions(d.reasons, "overlapped GPU work"));
  EXPECT_NE(d.action.find("mixed precision"), std::string::npos);
}

TEST(Diagnosis, ABusyGpuThatNeverWaitedIsComputeBound) {
  Diagnosis d = diagnose(with_gpu(0.1, 0.99));
  EXPECT_EQ(d.verdict, "compute-bound");
  EXPECT_FALSE(mentions(d.reasons, "overlapped"));
  EXPECT_NE(d.action.find("mixed precision"), std::string::npos);
}

TEST(Diagnosis, AnIdleGpuWithAFedConsumerPointsAtTheStepsHostSide) {
  Diagnosis d = diagnose(with_gpu(0.1, 0.30));
  EXPECT_EQ(d.verdict, "compute-bound");
  EXPECT_NE(d.action.find("GPU is idle 70% of the time"), std::string::npos);
  EXPECT_NE(d.action.find("synchronizations"), std::string::npos);
}

TEST(Diagnosis, WithoutGpuFiguresTheHostWaitDecides) {
  DiagnosisInputs in = with_gpu(4, 0.97);
  in.gpu_present = false;
  EXPECT_EQ(diagnose(in).verdict, "input-bound");
  EXPECT_FALSE(mentions(diagnose(in).reasons, "GPU"));
}

TEST(GpuSampler, AveragesUtilizationAndKeepsPeakMemory) {
  std::vector<std::optional<GpuReading>> readings = {
      GpuReading{0.5, 10, 100}, std::nullopt, GpuReading{1.0, 40, 100}, GpuReading{0.0, 20, 100}};
  size_t next = 0;
  GpuSampler sampler([&] { return next < readings.size() ? readings[next++] : std::nullopt; },
                     std::chrono::milliseconds(0));
  for (int i = 0; i < 4; ++i) sampler.sample();
  GpuFigures f = sampler.stop();
  EXPECT_TRUE(f.present);
  EXPECT_EQ(f.samples, 3);
  EXPECT_DOUBLE_EQ(f.utilization, 0.5);
  EXPECT_EQ(f.memory_used, 40u);
  EXPECT_EQ(f.memory_total, 100u);
  sampler.sample();  // after stop: ignored
  EXPECT_EQ(sampler.stop().samples, 3);
}

TEST(GpuSampler, ItsThreadSamplesUntilStopped) {
  std::mutex mu;
  std::condition_variable read;
  int reads = 0;
  GpuSampler sampler(
      [&]() -> std::optional<GpuReading> {
        {
          std::lock_guard lock(mu);
          ++reads;
        }
        read.notify_all();
        return GpuReading{0.25, 1, 2};
      },
      std::chrono::milliseconds(1));
  {
    std::unique_lock lock(mu);
    ASSERT_TRUE(read.wait_for(lock, std::chrono::seconds(30), [&] { return reads >= 5; }));
  }
  GpuFigures f = sampler.stop();
  EXPECT_GE(f.samples, 5);
  EXPECT_DOUBLE_EQ(f.utilization, 0.25);
}

TEST(GpuSampler, NothingToReadMeansNoGpu) {
  GpuSampler sampler([] { return std::nullopt; }, std::chrono::milliseconds(0));
  sampler.sample();
  GpuFigures f = sampler.stop();
  EXPECT_FALSE(f.present);
  EXPECT_EQ(f.samples, 0);
}

TEST(GpuSampler, NvmlReaderWithoutAGpuReadsNothing) {
  if (cuda_available()) GTEST_SKIP() << "a GPU is present";
  GpuSampler sampler(GpuSampler::nvml(0), std::chrono::milliseconds(0));
  EXPECT_FALSE(sampler.stop().present);
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
}

}  // namespace
}  // namespace stoker
