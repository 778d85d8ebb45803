// ParallelFor: split [0, n) into `threads` contiguous ranges and run fn(chunk, begin, end) on each (chunk in [0, NumChunks(n, threads))), the
// first range on the calling thread. Threads are created per call: the codecs call it on tensors
// of megabytes, where thread start-up (tens of microseconds) is noise. Small inputs stay serial.
#ifndef LONGHAUL_CODEC_PARALLEL_H_
#define LONGHAUL_CODEC_PARALLEL_H_

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

namespace longhaul::codec {

inline int NumChunks(int64_t n, int threads) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads, n)));
}

template <typename Fn>
void ParallelFor(int64_t n, int threads, Fn&& fn) {
  const int t = NumChunks(n, threads);
  if (t <= 1) {
    if (n > 0) fn(0, int64_t{0}, n);
    return;
  }
  std::vector<std::thread> pool;
  pool.reserve(t - 1);
  auto range = [&](int i) { return std::make_pair(n * i / t, n * (i + 1) / t); };
  for (int i = 1; i < t; ++i) {
    auto [b, e] = range(i);
    pool.emplace_back([&fn, i, b = b, e = e] { fn(i, b, e); });
  }
  auto [b0, e0] = range(0);
  fn(0, b0, e0);
  for (auto& th : pool) th.join();
}

}  // namespace longhaul::codec

#endif  // LONGHAUL_CODEC_PARALLEL_H_
