// SPDX-License-Identifier: MIT
// lavaflow::mpi from the installed package: a Communicator over a one-rank job.
#include <mpi.h>

#include <cstdio>
#include <lavaflow/mpi/mpi.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  if (auto comm = lavaflow::mpi::Communicator::create(); comm) {
    std::printf("mpi: rank %d of %d\n", comm->rank(), comm->size());
    status = 0;
  } else {
    std::printf("mpi: %s\n", comm.error().message().c_str());
  }
  MPI_Finalize();
  return status;
}
