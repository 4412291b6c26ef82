// SPDX-License-Identifier: MIT
// The asymmetric fence behind a channel's admission and a pool's close: the store-buffer litmus
// test, with a thread on each side, round after round.
#include <atomic>
#include <thread>
#include <vector>

#include "lavaflow/core/detail/process_fence.hpp"
#include "lavaflow/core/detail/wait.hpp"
#include "support.hpp"

using namespace lavaflow;

TEST_CASE("process fence: of two threads that each store and then load, one always sees the other's store") {
  const detail::ProcessFence fence;
  if (!fence.expedited()) WARN("no expedited membarrier here: both sides fence themselves");
  constexpr int kRounds = 50000;
  std::atomic<int> x{0}, y{0}, arrived{0};
  std::vector<int> seen_by_light(kRounds + 1), seen_by_heavy(kRounds + 1);
  bool heavy_ok = true;
  // Both threads leave a round's barrier together, so their stores race: spinning rather than
  // yielding, where both have a core, keeps them close enough that with a compiler fence on both
  // sides a run of this length has rounds in which neither store is seen.
  auto meet = [&](int round) {
    arrived.fetch_add(1, std::memory_order_acq_rel);
    for (int spins = 0; arrived.load(std::memory_order_acquire) < 2 * round;)
      if (++spins > 4096)
        std::this_thread::yield();
      else
        detail::cpu_relax();
  };
  std::thread heavy([&] {
    for (int i = 1; i <= kRounds; ++i) {
      meet(i);
      y.store(i, std::memory_order_relaxed);
      heavy_ok = fence.heavy() && heavy_ok;
      seen_by_heavy[i] = x.load(std::memory_order_relaxed);
    }
  });
  for (int i = 1; i <= kRounds; ++i) {
    meet(i);
    x.store(i, std::memory_order_relaxed);
    fence.light();
    seen_by_light[i] = y.load(std::memory_order_relaxed);
  }
  heavy.join();
  CHECK(heavy_ok);
  int neither = 0;
  for (int i = 1; i <= kRounds; ++i) neither += seen_by_light[i] < i && seen_by_heavy[i] < i;
  CHECK(neither == 0);
}
