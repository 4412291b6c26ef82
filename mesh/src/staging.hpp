// SPDX-License-Identifier: MIT
#pragma once
// What the GPU collectives' staged paths share (Vulkan and CUDA): a call staged through host memory
// goes in pieces, GPU → pinned slot → host collective → GPU, and the copies of the pieces before
// and after one run while the host carries it.
#include <algorithm>
#include <cstdint>

#include "lavaflow/mesh/collectives.hpp"

namespace lavaflow::mesh::staging {

/// Pieces begin on this boundary: a whole number of elements of every type (and of the Vulkan
/// shader's 32-bit words).
constexpr std::uint64_t kPartAlign = 256;
/// A staged call goes in at least this many pieces where each stays above kMinPiece.
constexpr std::uint64_t kPieces = 4;
constexpr std::uint64_t kMinPiece = 64 << 10;

/// The length of a staged call's pieces: about a kPieces-th of `total`, at least kMinPiece, at
/// most `most` (itself at least kPartAlign), on kPartAlign.
[[nodiscard]] constexpr std::uint64_t piece(std::uint64_t total, std::uint64_t most) {
  const std::uint64_t want = ((total + kPieces - 1) / kPieces + kPartAlign - 1) & ~(kPartAlign - 1);
  return std::max<std::uint64_t>(kPartAlign, std::min(most & ~(kPartAlign - 1), std::max(kMinPiece, want)));
}

/// Waits for a staged call's host collective, started with the time the call has left: the
/// communicator ends it by then, naming the ranks that did not take part (the timeout contract of
/// CallOptions). A wait of its own would not bound it anyway — a Work in flight is waited for when
/// dropped — and with the same deadline it would often end first with less to say.
[[nodiscard]] inline Status carried(Work w) { return w.wait(); }

}  // namespace lavaflow::mesh::staging
