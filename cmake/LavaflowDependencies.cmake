# Finds the optional backends once, at the top level, so their imported targets are visible to
# every folder (interop/, transports/, apps/, tests/). Decides LAVAFLOW_HAVE_<X> per the
# LAVAFLOW_WITH_<X> options.
include_guard(GLOBAL)

include(CheckLanguage)
if(NOT LAVAFLOW_WITH_CUDA STREQUAL "OFF")
  check_language(CUDA)
  find_package(CUDAToolkit QUIET)
endif()
set(cuda_found OFF)
if(CMAKE_CUDA_COMPILER AND CUDAToolkit_FOUND)
  set(cuda_found ON)
endif()
lavaflow_backend_resolve(CUDA "${cuda_found}" "no CUDA toolkit (nvcc) found")
if(LAVAFLOW_HAVE_CUDA)
  # Hopper (H100/H200) and Ampere by default; "native" would fail on machines without a GPU.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80 90)
  endif()
  enable_language(CUDA)
endif()

if(NOT LAVAFLOW_WITH_OPENCL STREQUAL "OFF")
  find_package(OpenCL QUIET)
endif()
lavaflow_backend_resolve(OPENCL "${OpenCL_FOUND}" "no OpenCL headers/loader (opencl-headers, ocl-icd-opencl-dev)")

if(NOT LAVAFLOW_WITH_OPENGL STREQUAL "OFF")
  find_package(OpenGL QUIET COMPONENTS OpenGL EGL)
  find_package(GLEW QUIET)
endif()
set(opengl_found OFF)
if(OpenGL_FOUND AND GLEW_FOUND)
  set(opengl_found ON)
endif()
lavaflow_backend_resolve(OPENGL "${opengl_found}" "no OpenGL/EGL/GLEW development files (libegl-dev, libgl-dev, libglew-dev)")

if(NOT LAVAFLOW_WITH_MPI STREQUAL "OFF")
  find_package(MPI QUIET COMPONENTS C)
endif()
lavaflow_backend_resolve(MPI "${MPI_C_FOUND}" "no MPI implementation found (mpich, libmpich-dev)")
