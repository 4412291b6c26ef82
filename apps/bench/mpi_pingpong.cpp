// SPDX-License-Identifier: MIT
// lavaflow-bench-mpi: raw MPI ping-pong between ranks 0 and 1 (OSU osu_latency method: warm-up,
// then round trips of MPI_Send/MPI_Recv). Rank 0 prints one JSON object per size:
//   {"name":"mpi-pingpong","size":..,"p50_ns":..,"p99_ns":..,"max_ns":..,"avg_ns":..}
// usage: mpiexec -n 2 lavaflow-bench-mpi ITERATIONS SIZE...
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "cli.hpp"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  int iters = 0;
  std::vector<int> sizes;
  CLI::App app{"lavaflow-bench-mpi: raw MPI ping-pong (mpiexec -n 2), lavaflow-bench local's baseline",
               "lavaflow-bench-mpi"};
  app.add_option("ITERATIONS", iters, "round trips per size")->required()->check(lfapp::whole(1, 100'000'000));
  app.add_option("SIZE", sizes, "message sizes in bytes")->required()->check(lfapp::whole(0, 1 << 30));
  auto rc = lfapp::parse(app, argc, argv);
  if (!rc && n != 2) {
    if (rank == 0) std::fprintf(stderr, "lavaflow-bench-mpi: needs exactly 2 ranks (mpiexec -n 2)\n");
    rc = 2;
  }
  if (rc) {
    MPI_Finalize();
    return *rc;
  }
  const int warmup = std::max(100, iters / 10);
  for (const int size : sizes) {
    std::vector<char> buf(static_cast<std::size_t>(std::max(size, 1)));
    std::vector<double> one_way;
    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < warmup + iters; ++i) {
      const double t0 = MPI_Wtime();
      if (rank == 0) {
        MPI_Send(buf.data(), size, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
        MPI_Recv(buf.data(), size, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      } else {
        MPI_Recv(buf.data(), size, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Send(buf.data(), size, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
      }
      if (i >= warmup) one_way.push_back((MPI_Wtime() - t0) * 1e9 / 2);
    }
    if (rank == 0) {
      std::sort(one_way.begin(), one_way.end());
      double sum = 0;
      for (double v : one_way) sum += v;
      std::printf(
          "{\"name\":\"mpi-pingpong\",\"size\":%d,\"p50_ns\":%.1f,\"p99_ns\":%.1f,\"max_ns\":%.1f,\"avg_ns\":%.1f}\n",
          size, one_way[one_way.size() / 2], one_way[static_cast<std::size_t>(0.99 * double(one_way.size() - 1))],
          one_way.back(), sum / double(one_way.size()));
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
