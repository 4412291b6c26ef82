// SPDX-License-Identifier: MIT
#pragma once
// Private: runs a Vulkan-Hpp call and turns its exceptions into lava-flow Errors, so no exception
// crosses the public API.
#include <exception>
#include <type_traits>
#include <vulkan/vulkan_raii.hpp>

#include "lavaflow/core/error.hpp"

namespace lavaflow::detail {

template <class T>
struct as_result {
  using type = Result<T>;
};
template <class T>
struct as_result<Result<T>> {
  using type = Result<T>;
};

/// Result<R> for a callable returning R; a callable that already returns Result<T> keeps it.
template <class F>
auto vk_call(std::string call, F&& f) -> typename as_result<std::invoke_result_t<F>>::type {
  try {
    if constexpr (std::is_void_v<std::invoke_result_t<F>>) {
      f();
      return {};
    } else {
      return f();
    }
  } catch (const vk::SystemError& e) {
    return std::unexpected(from_vk(e.code().value(), std::move(call)));
  } catch (const std::exception& e) {
    return fail(Errc::Driver, std::move(call), e.what());
  }
}

}  // namespace lavaflow::detail
