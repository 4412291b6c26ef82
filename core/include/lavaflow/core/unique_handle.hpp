// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// One move-only owner for the system handles lava-flow holds that are not Vulkan objects (those
/// are Vulkan-Hpp's RAII types): file descriptors (fds, pidfds: `UniqueFd`) and memory mappings
/// (`UniqueMapping`). `Traits` says what an empty handle is and how one is given back.
#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <span>

namespace lavaflow {

template <class Traits>
class UniqueHandle {
 public:
  using handle_type = typename Traits::handle_type;

  UniqueHandle() noexcept = default;
  /// Takes ownership of `handle` (may be the empty one).
  explicit UniqueHandle(handle_type handle) noexcept : handle_(handle) {}
  UniqueHandle(const UniqueHandle&) = delete;
  UniqueHandle& operator=(const UniqueHandle&) = delete;
  UniqueHandle(UniqueHandle&& other) noexcept : handle_(other.release()) {}
  UniqueHandle& operator=(UniqueHandle&& other) noexcept {
    if (this != &other) reset(other.release());
    return *this;
  }
  ~UniqueHandle() { reset(); }

  [[nodiscard]] handle_type get() const noexcept { return handle_; }
  [[nodiscard]] bool valid() const noexcept { return !Traits::empty(handle_); }
  explicit operator bool() const noexcept { return valid(); }

  /// Gives up ownership without giving the handle back; the caller now owns it.
  [[nodiscard]] handle_type release() noexcept {
    handle_type h = handle_;
    handle_ = Traits::none();
    return h;
  }
  /// Gives back the owned handle (if any) and takes ownership of `handle`.
  void reset(handle_type handle = Traits::none()) noexcept {
    if (!Traits::empty(handle_) && !Traits::same(handle_, handle)) Traits::give_back(handle_);
    handle_ = handle;
  }

 private:
  handle_type handle_ = Traits::none();
};

namespace detail {

struct FdTraits {
  using handle_type = int;
  static constexpr int none() noexcept { return -1; }
  static constexpr bool empty(int fd) noexcept { return fd < 0; }
  static constexpr bool same(int a, int b) noexcept { return a == b; }
  static void give_back(int fd) noexcept { ::close(fd); }  // close errors are not actionable: the fd is gone
};

struct MappingTraits {
  using handle_type = std::span<std::byte>;
  static constexpr handle_type none() noexcept { return {}; }
  static constexpr bool empty(handle_type m) noexcept { return m.data() == nullptr; }
  static constexpr bool same(handle_type a, handle_type b) noexcept { return a.data() == b.data(); }
  static void give_back(handle_type m) noexcept { ::munmap(m.data(), m.size()); }
};

}  // namespace detail

/// A memory mapping (mmap), unmapped when its owner goes.
using UniqueMapping = UniqueHandle<detail::MappingTraits>;

}  // namespace lavaflow
