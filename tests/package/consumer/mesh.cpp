// SPDX-License-Identifier: MIT
// lavaflow::mesh from the installed package: a mixed topology's groups and one all_reduce on the
// Mock backend (two ranks as two threads).
#include <cstdio>
#include <lavaflow/mesh/mesh.hpp>
#include <lavaflow/mesh/mock.hpp>
#include <thread>

int main() {
  using namespace lavaflow::mesh;
  auto mesh = DeviceMesh::create(0, {{"host", {}}, {"host", {}}}, Backend::Mock);
  if (!mesh || !mesh->with_topology(TensorParallel{2, {1, 2}})) return 1;
  auto world = MockWorld::create(2);
  float out[2] = {};
  std::thread peer([&] {
    auto c = world->communicator("world", {0, 1}, 1);
    const float one = 1;
    if (c)
      (void)(*c)
          ->all_reduce(std::as_bytes(std::span(&one, 1)), std::as_writable_bytes(std::span(&out[1], 1)), DType::F32,
                       ReduceOp::Sum)
          .wait();
  });
  auto c = world->communicator("world", {0, 1}, 0);
  const float two = 2;
  auto ok = c ? (*c)->all_reduce(std::as_bytes(std::span(&two, 1)), std::as_writable_bytes(std::span(&out[0], 1)),
                                 DType::F32, ReduceOp::Sum)
                    .wait()
              : lavaflow::Status(std::unexpected(c.error()));
  peer.join();
  if (!ok || out[0] != 3 || out[1] != 3) return 1;
  std::printf("mesh: %zu groups, all_reduce over 2 mock ranks = %g\n", mesh->groups().size(), out[0]);
}
