// SPDX-License-Identifier: MIT
// libFuzzer target for every decoder that reads bytes from a peer: the channel handshake (Hello /
// Welcome / Refuse, with any fd count), buffer and image export descriptors and process locations.
// A decoder may refuse input; it must never crash, hang, read out of bounds or accept inconsistent
// values.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "handshake.hpp"
#include "lavaflow/core/gpu_image.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  const auto fds = static_cast<std::size_t>(data[0] % 67);
  const auto bytes = std::as_bytes(std::span(data + 1, size - 1));
  auto hs = lavaflow::detail::decode(bytes, fds);
  if (hs) {
    if (auto* w = std::get_if<lavaflow::detail::Welcome>(&*hs)) {
      // Accepted welcomes are internally consistent.
      const bool flags = w->flag_block.has_value();
      if (w->ring.size() != w->slots || w->slots == 0 || w->slots > lavaflow::detail::kMaxSlots ||
          fds != 1 + w->slots + (w->timeline ? 1u : 0u) + (w->release_timeline ? 1u : 0u) + (flags ? 2u : 0u) ||
          (w->release_timeline && !w->timeline) || (flags && w->timeline) || flags != w->release_block.has_value())
        std::abort();
      // A flag channel's blocks are valid descriptors, and its release counter an aligned word
      // inside its block.
      if (flags &&
          (!w->flag_block->validate() || !w->release_block->validate() ||
           w->release_offset % lavaflow::detail::kFlagStride != 0 || w->release_offset + 8 > w->release_block->size))
        std::abort();
      for (const auto& d : w->ring)
        if (!d.validate() || d.size < w->slot_size) std::abort();
      // Re-encoding an accepted message decodes to the same thing.
      if (!lavaflow::detail::decode(lavaflow::detail::encode(*w), fds)) std::abort();
    }
  }
  if (auto d = lavaflow::ExportDescriptor::deserialize(bytes); d && (d->offset + d->size > d->buffer_size))
    std::abort();
  // An accepted image descriptor is one a peer could have written: valid, its pixels fit its
  // allocation, and it encodes back to the same bytes.
  if (auto d = lavaflow::ImageDescriptor::deserialize(bytes); d) {
    if (!d->validate() || d->packed_size() > d->allocation_size) std::abort();
    const auto again = d->serialize();
    if (again.size() != bytes.size() || !std::equal(again.begin(), again.end(), bytes.begin())) std::abort();
  }
  (void)lavaflow::ProcessLocation::deserialize(bytes);
  return 0;
}
