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

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, n = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &n);
  if (n != 2 || argc < 3) {
    if (rank == 0) std::fprintf(stderr, "usage: mpiexec -n 2 %s ITERATIONS SIZE...\n", argv[0]);
    MPI_Finalize();
    return 2;
  }
  const int iters = std::atoi(argv[1]);
  const int warmup = std::max(100, iters / 10);
  for (int a = 2; a < argc; ++a) {
    const int size = std::atoi(argv[a]);
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
      std::printf("{\"name\":\"mpi-pingpong\",\"size\":%d,\"p50_ns\":%.1f,\"p99_ns\":%.1f,\"max_ns\":%.1f,\"avg_ns\":%.1f}\n",
                  size, one_way[one_way.size() / 2], one_way[static_cast<std::size_t>(0.99 * double(one_way.size() - 1))],
                  one_way.back(), sum / double(one_way.size()));
      std::fflush(stdout);
    }
  }
  MPI_Finalize();
  return 0;
}
