#include "anvil/ft/injector.hpp"

#include <fcntl.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <thread>
#include <vector>

#include "anvil/ckpt/sharded.hpp"

namespace anvil::ft {

Injector::Injector(const InjectOptions& options, int rank) : rank_(rank) {
  if (!options.inject.empty()) fault_ = parse_fault(options.inject);
}

bool Injector::strikes(const char* kind, int64_t step) const {
  return fault_ && fault_->kind == kind && fault_->rank == rank_ && fault_->step == step;
}

void Injector::step_begin(int64_t done, double last_compute_s) const {
  if (!fault_ || fault_->rank != rank_ || done + 1 < fault_->step) return;
  if (fault_->kind == "slow")
    std::this_thread::sleep_for(std::chrono::microseconds(static_cast<int64_t>(fault_->arg * 1e3)));
  // The previous step's compute already includes this fault's sleep from
  // the step after STEP on: what the rank computes is that / ARG.
  if (fault_->kind == "slow-rank" && last_compute_s > 0) {
    const double compute = done + 1 > fault_->step ? last_compute_s / fault_->arg : last_compute_s;
    std::this_thread::sleep_for(
        std::chrono::microseconds(static_cast<int64_t>((fault_->arg - 1) * compute * 1e6)));
  }
}

double Injector::step_loss(int64_t done, double loss_sum) const {
  if (strikes("nan", done + 1)) return std::numeric_limits<double>::quiet_NaN();
  if (strikes("spike", done + 1)) return loss_sum * (fault_->arg > 0 ? fault_->arg : 10.0);
  return loss_sum;
}

void Injector::step_end(int64_t done) const {
  if (strikes("kill", done + 1)) std::raise(SIGKILL);
  if (strikes("term", done)) std::raise(SIGTERM);  // a preemption once STEP is done
  if (strikes("hang", done + 1))
    for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

void Injector::step_updated(int64_t done, const std::function<float*()>& weights) const {
  if (!strikes("flip-param", done)) return;
  float* w = weights();
  uint32_t bits;
  std::memcpy(&bits, w, sizeof bits);
  bits ^= 1u << 22;
  std::memcpy(w, &bits, sizeof bits);
}

namespace {

// Whether the file system of `dir` has at most `most` bytes free (the fault
// is for a small tmpfs, never a real disk).
bool at_most_free(const std::string& dir, uint64_t most) {
  struct statvfs fs {};
  return ::statvfs(dir.c_str(), &fs) == 0 &&
         static_cast<uint64_t>(fs.f_bavail) * fs.f_frsize <= most;
}

// Appends zeros to `path` until its file system is full.
void fill_file_system(const std::string& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) return;  // already too full to create it
  std::vector<char> zeros(size_t{1} << 20, 0);
  for (size_t chunk = zeros.size(); chunk >= 512;) {
    if (::write(fd, zeros.data(), chunk) < 0) chunk /= 2;
  }
  ::close(fd);
}

}  // namespace

void Injector::keep_full(int64_t step, const std::string& run_dir) const {
  if (!fault_ || fault_->kind != "disk-full" || fault_->rank != rank_ || step < fault_->step) return;
  const std::string filler = run_dir + "/.disk-full-filler";
  const auto steps = static_cast<int64_t>(fault_->arg);
  if (steps > 0 && step >= fault_->step + steps) {  // the space returns
    std::error_code ec;
    if (std::filesystem::remove(filler, ec))
      std::fprintf(stderr, "anvil: injected fault: %s has space again\n", run_dir.c_str());
    return;
  }
  if (!at_most_free(run_dir, uint64_t{1} << 30)) {
    std::fprintf(stderr,
                 "anvil: warning: --inject disk-full: %s has more than 1 GiB free; not filling "
                 "it (the fault is for a small tmpfs)\n",
                 run_dir.c_str());
    return;
  }
  // The fill takes the room a prune could free too: with several ranks, one
  // rank's prune-and-retry must not hand free space to another rank's first
  // try, so every save of the window meets a disk that pruning cannot fix.
  ckpt::prune_to_newest_intact(run_dir);
  fill_file_system(filler);
  std::fprintf(stderr, "anvil: injected fault: %s is full before the checkpoint of step %lld\n",
               run_dir.c_str(), static_cast<long long>(step));
}

void Injector::clear_stale_fill(const std::string& run_dir) {
  std::error_code ec;
  if (std::filesystem::remove(run_dir + "/.disk-full-filler", ec))
    std::fprintf(stderr,
                 "anvil: removed %s/.disk-full-filler, left by an injected disk-full fault\n",
                 run_dir.c_str());
}

void Injector::save_retry(int64_t step, const std::string& run_dir) const {
  keep_full(step, run_dir);
}

void Injector::save_begin(int64_t step, const std::string& run_dir) const {
  keep_full(step, run_dir);
  if (!strikes("kill-in-save", step)) return;
  // Dies while its part is being written (the job never commits this step).
  const auto ms = static_cast<int64_t>(fault_->arg);
  std::thread([ms] {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
    std::raise(SIGKILL);
  }).detach();
}

void Injector::save_end(int64_t step, const std::function<void()>& wait,
                        const std::string& index_file, const std::string& shard_file) const {
  if (!strikes("corrupt-ckpt", step)) return;
  // Once the step is committed, one byte of this rank's first shard flips
  // and the job dies: a restart must find the damage and go back further.
  wait();
  while (!std::filesystem::exists(index_file))
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  if (FILE* f = std::fopen(shard_file.c_str(), "r+b")) {
    unsigned char len[8] = {};
    if (std::fread(len, 1, 8, f) == 8) {
      uint64_t header = 0;
      for (int i = 7; i >= 0; --i) header = header << 8 | len[i];
      std::fseek(f, static_cast<long>(8 + header + 2), SEEK_SET);
      const int c = std::fgetc(f);
      std::fseek(f, static_cast<long>(8 + header + 2), SEEK_SET);
      std::fputc(c ^ 0x5a, f);
    }
    std::fclose(f);
  }
  std::raise(SIGKILL);
}

}  // namespace anvil::ft
