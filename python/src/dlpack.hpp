// SPDX-License-Identifier: MIT
#pragma once
/// @file
/// The DLPack ABI (https://dmlc.github.io/dlpack/latest/c_api.html), declared here: the structs
/// are small and fixed by the standard, and the packaged header predates the versioned tensor.
/// Both the legacy DLManagedTensor (capsule "dltensor", what PyTorch 1.x takes) and the 1.x
/// DLManagedTensorVersioned (capsule "dltensor_versioned") are produced.

#include <cstdint>

namespace lavaflow::python::dlpack {

inline constexpr std::uint32_t kMajor = 1;
inline constexpr std::uint32_t kMinor = 0;

enum DeviceType : std::int32_t { kCPU = 1, kCUDA = 2 };
enum TypeCode : std::uint8_t { kInt = 0, kUInt = 1, kFloat = 2 };

struct Device {
  std::int32_t device_type;
  std::int32_t device_id;
};
struct DataType {
  std::uint8_t code;
  std::uint8_t bits;
  std::uint16_t lanes;
};
struct Tensor {
  void* data;
  Device device;
  std::int32_t ndim;
  DataType dtype;
  std::int64_t* shape;
  std::int64_t* strides;  ///< null: compact row-major
  std::uint64_t byte_offset;
};
struct ManagedTensor {
  Tensor dl_tensor;
  void* manager_ctx;
  void (*deleter)(ManagedTensor* self);
};
struct Version {
  std::uint32_t major;
  std::uint32_t minor;
};
inline constexpr std::uint64_t kFlagReadOnly = 1;
struct ManagedTensorVersioned {
  Version version;
  void* manager_ctx;
  void (*deleter)(ManagedTensorVersioned* self);
  std::uint64_t flags;
  Tensor dl_tensor;
};

inline constexpr const char* kCapsule = "dltensor";
inline constexpr const char* kUsedCapsule = "used_dltensor";
inline constexpr const char* kVersionedCapsule = "dltensor_versioned";
inline constexpr const char* kUsedVersionedCapsule = "used_dltensor_versioned";

}  // namespace lavaflow::python::dlpack
