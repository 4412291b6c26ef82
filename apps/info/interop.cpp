// SPDX-License-Identifier: MIT
#include "interop.hpp"

#include "lavaflow/core/detail/format.hpp"
#if LAVAFLOW_INFO_CUDA
#include "lavaflow/cuda/cuda.hpp"
#endif
#if LAVAFLOW_INFO_OPENCL
#include "lavaflow/opencl/opencl.hpp"
#endif
#if LAVAFLOW_INFO_OPENGL
#include "lavaflow/opengl/opengl.hpp"
#endif

namespace lfinfo {

using lavaflow::str_format;

namespace {

std::string vk_name(const lavaflow::DeviceCapabilities& d) {
  return "Vulkan [" + std::to_string(d.index) + "] " + d.identity.name;
}

/// What a Vulkan exporter offers: "" when it can export memory, else why not.
std::string vk_memory_gap(const lavaflow::DeviceCapabilities& d) {
  return d.memory_fd_export ? "" : "Vulkan device cannot export opaque-fd memory";
}

void vulkan_rows(const std::vector<lavaflow::DeviceCapabilities>& vk, InteropReport& r) {
  for (const auto& e : vk)
    for (const auto& i : vk) {
      MatrixRow row{vk_name(e), vk_name(i) + " (another process or context)"};
      const bool same =
          e.identity.device_uuid == i.identity.device_uuid && e.identity.driver_uuid == i.identity.driver_uuid;
      if (!same) {
        row.memory_how = row.semaphore_how = "different device/driver UUID";
      } else {
        row.memory = e.memory_fd_export && i.memory_fd_import;
        row.memory_how =
            row.memory ? "opaque fd" : (vk_memory_gap(e).empty() ? "cannot import opaque-fd memory" : vk_memory_gap(e));
        row.semaphore = e.timeline_fd_export || (e.semaphore_fd_export && i.semaphore_fd_import);
        row.semaphore_how = e.timeline_fd_export ? "timeline, opaque fd"
                            : row.semaphore      ? "binary, opaque fd"
                                                 : "no exportable semaphores (CPU fence wait instead)";
      }
      r.matrix.push_back(std::move(row));
    }
}

#if LAVAFLOW_INFO_CUDA
void cuda_rows(const std::vector<lavaflow::DeviceCapabilities>& vk, InteropReport& r) {
  auto devs = lavaflow::cuda::devices();
  if (!devs) {
    r.notes.push_back("CUDA: " + devs.error().message());
    for (const auto& e : vk)
      r.matrix.push_back(
          {vk_name(e), "CUDA", false, "no CUDA device (" + devs.error().cause() + ")", false, "no CUDA device"});
    return;
  }
  for (const auto& c : *devs) {
    const std::string name = str_format("CUDA [{}] {}", c.ordinal, c.name);
    r.devices.push_back(
        {"CUDA", name,
         str_format("UUID {}, compute {}.{}, timeline semaphore interop {}, POSIX-fd allocations {}; {}",
                    lavaflow::to_string(c.uuid), c.compute_major, c.compute_minor,
                    c.timeline_semaphore_interop ? "yes" : "no", c.posix_fd_allocations ? "yes" : "no",
                    c.mps ? "MPS active: CUDA kernels of several processes run side by side, a GPU-ordered "
                            "hand-off between them costs microseconds"
                          : "no MPS: the GPU time-slices between processes, so a hand-off between two "
                            "processes' kernels waits for a context switch (about a hundred microseconds); "
                            "start nvidia-cuda-mps-control -d to share the GPU")});
    for (const auto& e : vk) {
      MatrixRow row{vk_name(e), name};
      const bool match = e.identity.device_uuid == c.uuid;
      row.memory = match && e.memory_fd_export;
      row.memory_how = !match       ? "UUID mismatch: another GPU"
                       : row.memory ? "cudaImportExternalMemory (buffers, mipmapped arrays)"
                                    : vk_memory_gap(e);
      row.semaphore = match && ((e.timeline_fd_export && c.timeline_semaphore_interop) || e.semaphore_fd_export);
      row.semaphore_how = !match                                                 ? "UUID mismatch"
                          : e.timeline_fd_export && c.timeline_semaphore_interop ? "timeline, opaque fd"
                          : e.semaphore_fd_export                                ? "binary, opaque fd"
                                                  : "Vulkan device exports no semaphores";
      r.matrix.push_back(row);
      MatrixRow back{name, vk_name(e)};
      back.memory = match && c.posix_fd_allocations && e.memory_fd_import;
      back.memory_how = !match        ? "UUID mismatch"
                        : back.memory ? "cuMemCreate POSIX fd → vkAllocateMemory import"
                                      : "no POSIX-fd CUDA allocations";
      back.semaphore = row.semaphore;
      back.semaphore_how = row.semaphore ? "Vulkan-created semaphore signalled by CUDA" : row.semaphore_how;
      r.matrix.push_back(std::move(back));
    }
  }
  if (devs->empty()) r.notes.push_back("CUDA: no device");
  // Two GPUs of this host: how one reaches the other's memory.
  auto links = lavaflow::cuda::peer_links();
  if (!links) return r.notes.push_back("CUDA peer links: " + links.error().message());
  for (const auto& l : *links) {
    MatrixRow row{str_format("CUDA [{}]", l.from), str_format("CUDA [{}] (peer GPU)", l.to)};
    row.memory = l.access;
    const std::string pcie = l.pcie_meet.empty() ? "" : ", PCIe routes meet at " + l.pcie_meet;
    row.memory_how = l.access ? str_format("peer access over {}{}{}", lavaflow::cuda::to_string(l.path),
                                           l.native_atomics ? ", native atomics" : "", pcie)
                              : "no peer access: through host memory" + pcie;
    row.semaphore_how = "semaphores stay on their GPU: order with events or the channel's counters";
    r.matrix.push_back(std::move(row));
  }
}
#endif

#if LAVAFLOW_INFO_OPENCL
void opencl_rows(const std::vector<lavaflow::DeviceCapabilities>& vk, InteropReport& r) {
  auto devs = lavaflow::cl::devices();
  if (!devs) {
    r.notes.push_back("OpenCL: " + devs.error().message());
    return;
  }
  if (devs->empty()) r.notes.push_back("OpenCL: no platform (no ICD installed)");
  for (const auto& d : *devs) {
    const std::string name = str_format("OpenCL {} ({})", d.name, d.platform_name);
    r.devices.push_back(
        {"OpenCL", name,
         str_format("{}; {}; external memory fd {}, external semaphore fd {}{}", d.version,
                    d.uuid_known ? "UUID " + lavaflow::to_string(d.device_uuid) : std::string("no UUID"),
                    d.external_memory_fd ? "yes" : "no", d.external_semaphore_fd ? "yes" : "no",
                    d.host_pointer_path ? "; CPU device: host-pointer path (zero copy)" : "")});
    for (const auto& e : vk) {
      MatrixRow row{vk_name(e), name};
      const bool match = d.uuid_known && d.device_uuid == e.identity.device_uuid;
      if (match && d.external_memory_fd && e.memory_fd_export) {
        row.memory = true;
        row.memory_how = "cl_khr_external_memory_opaque_fd";
      } else if (d.host_pointer_path) {
        row.memory = true;
        row.memory_how = "CL_MEM_USE_HOST_PTR on host-visible memory (zero copy on this CPU device); device-local: no";
      } else {
        row.memory_how = !d.uuid_known ? "no cl_khr_device_uuid"
                         : !match      ? "UUID mismatch: another device"
                                       : "no cl_khr_external_memory_opaque_fd";
      }
      row.semaphore = match && d.external_semaphore_fd && e.semaphore_fd_export;
      row.semaphore_how = row.semaphore              ? "binary, opaque fd"
                          : !d.external_semaphore_fd ? "no cl_khr_external_semaphore_opaque_fd (CPU wait instead)"
                          : !match                   ? "UUID mismatch"
                                                     : "Vulkan device exports no binary semaphores";
      r.matrix.push_back(std::move(row));
    }
  }
}
#endif

#if LAVAFLOW_INFO_OPENGL
void opengl_rows(const std::vector<lavaflow::DeviceCapabilities>& vk, InteropReport& r) {
  for (const auto& e : vk) {
    MatrixRow row{vk_name(e), "OpenGL (headless EGL)"};
    auto egl = lavaflow::gl::EglHeadless::create(e.identity.device_uuid);
    if (!egl) {
      row.memory_how = row.semaphore_how = "no EGL/GL context on this device: " + egl.error().cause();
      r.matrix.push_back(std::move(row));
      continue;
    }
    lavaflow::Result<lavaflow::gl::Capabilities> caps =
        std::unexpected(lavaflow::Error(lavaflow::Errc::Unsupported, "", ""));
    if (egl->make_current() && lavaflow::gl::load_functions()) caps = lavaflow::gl::query_current();
    if (!caps) {
      row.memory_how = row.semaphore_how = "GL context unusable";
      r.matrix.push_back(std::move(row));
      continue;
    }
    row.importer = "OpenGL " + caps->renderer + " (headless EGL)";
    r.devices.push_back({"OpenGL", caps->renderer,
                         str_format("{}; GL_EXT_memory_object_fd {}, GL_EXT_semaphore_fd {}", caps->version,
                                    caps->memory_object_fd ? "yes" : "no", caps->semaphore_fd ? "yes" : "no")});
    row.memory = caps->memory_object_fd && e.memory_fd_export;
    row.memory_how = row.memory                ? "GL_EXT_memory_object_fd (buffers, textures)"
                     : !caps->memory_object_fd ? "no GL_EXT_memory_object_fd"
                                               : vk_memory_gap(e);
    row.semaphore = caps->semaphore_fd && e.semaphore_fd_export;
    row.semaphore_how = row.semaphore         ? "binary, opaque fd"
                        : !caps->semaphore_fd ? "no GL_EXT_semaphore_fd (CPU wait instead)"
                                              : "Vulkan device exports no binary semaphores";
    r.matrix.push_back(std::move(row));
  }
}
#endif

}  // namespace

InteropReport interop_report(const std::vector<lavaflow::DeviceCapabilities>& vk) {
  InteropReport r;
  vulkan_rows(vk, r);
  // The notes are built in place: moving a temporary string into the vector draws a false
  // -Warray-bounds from GCC 12 at -O3.
#if LAVAFLOW_INFO_CUDA
  cuda_rows(vk, r);
#else
  r.notes.emplace_back("CUDA: adapter not built (LAVAFLOW_WITH_CUDA)");
#endif
#if LAVAFLOW_INFO_OPENCL
  opencl_rows(vk, r);
#else
  r.notes.emplace_back("OpenCL: adapter not built (LAVAFLOW_WITH_OPENCL)");
#endif
#if LAVAFLOW_INFO_OPENGL
  opengl_rows(vk, r);
#else
  r.notes.emplace_back("OpenGL: adapter not built (LAVAFLOW_WITH_OPENGL)");
#endif
  return r;
}

lavaflow::Accelerators accelerators(const std::vector<lavaflow::DeviceCapabilities>& vk,
                                    std::vector<std::string>& notes) {
  auto acc = lavaflow::Accelerators::from(vk);
  auto note = [&](const char* api, const lavaflow::Status& s) {
    if (!s) notes.push_back(str_format("{}: {}", api, s.error().message()));
  };
#if LAVAFLOW_INFO_CUDA
  note("CUDA", lavaflow::cuda::add_devices(acc));
#endif
#if LAVAFLOW_INFO_OPENCL
  note("OpenCL", lavaflow::cl::add_devices(acc));
#endif
#if LAVAFLOW_INFO_OPENGL
  note("OpenGL", lavaflow::gl::add_devices(acc));
#endif
  (void)note;
  return acc;
}

}  // namespace lfinfo
