// SPDX-License-Identifier: MIT
// lavaflow::mesh_mpi from the installed package: the mesh of a one-rank job and one all_reduce on
// its native world group.
#include <mpi.h>

#include <cstdio>
#include <lavaflow/mesh_mpi/mesh_mpi.hpp>

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int status = 1;
  {
    using namespace lavaflow::mesh;
    auto job = lavaflow::mpi::Communicator::create();
    auto mesh = job ? mesh_from_mpi(*job) : lavaflow::Result<DeviceMesh>(std::unexpected(job.error()));
    auto comm = mesh ? mesh->communicator("world", mpi_communicators(*job))
                     : lavaflow::Result<std::unique_ptr<Communicator>>(std::unexpected(mesh.error()));
    float x = 2, y = 0;
    if (comm &&
        (*comm)
            ->all_reduce(std::as_bytes(std::span(&x, 1)), std::as_writable_bytes(std::span(&y, 1)), DType::F32,
                         ReduceOp::Sum)
            .wait() &&
        y == 2) {
      std::printf("mesh_mpi: %s backend, all_reduce = %g\n", (*comm)->backend().data(), y);
      status = 0;
    } else {
      std::printf("mesh_mpi: %s\n", comm ? "wrong result" : comm.error().message().c_str());
    }
  }
  MPI_Finalize();
  return status;
}
