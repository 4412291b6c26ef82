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

# NCCL: where LAVAFLOW_NCCL_ROOT or NCCL_HOME says, else in the system's directories, else beside
# the CUDA toolkit (searched last: a system NCCL's header and library stay a pair). One library and
# header for every target that uses it.
set(nccl_found OFF)
if(LAVAFLOW_HAVE_CUDA AND NOT LAVAFLOW_WITH_NCCL STREQUAL "OFF")
  find_path(LAVAFLOW_NCCL_INCLUDE nccl.h HINTS ${LAVAFLOW_NCCL_ROOT} $ENV{NCCL_HOME} PATH_SUFFIXES include
            PATHS ${CUDAToolkit_INCLUDE_DIRS})
  find_library(LAVAFLOW_NCCL_LIBRARY NAMES nccl libnccl.so.2 HINTS ${LAVAFLOW_NCCL_ROOT} $ENV{NCCL_HOME}
               PATH_SUFFIXES lib lib64 PATHS ${CUDAToolkit_LIBRARY_DIR})
  if(LAVAFLOW_NCCL_INCLUDE AND LAVAFLOW_NCCL_LIBRARY)
    # Non-blocking communicators, ncclCommFinalize and ncclRemoteError came with NCCL 2.14.
    file(STRINGS ${LAVAFLOW_NCCL_INCLUDE}/nccl.h nccl_version REGEX "^#define NCCL_(MAJOR|MINOR) ")
    string(REGEX REPLACE ".*NCCL_MAJOR ([0-9]+).*" "\\1" nccl_major "${nccl_version}")
    string(REGEX REPLACE ".*NCCL_MINOR ([0-9]+).*" "\\1" nccl_minor "${nccl_version}")
    if(nccl_major GREATER 2 OR (nccl_major EQUAL 2 AND nccl_minor GREATER_EQUAL 14))
      set(nccl_found ON)
    endif()
  endif()
endif()
lavaflow_backend_resolve(NCCL "${nccl_found}"
  "no CUDA, or no NCCL 2.14 or later (nccl.h, libnccl) beside it, in LAVAFLOW_NCCL_ROOT or in NCCL_HOME")

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

if(NOT LAVAFLOW_WITH_GLOO STREQUAL "OFF")
  find_package(Gloo QUIET CONFIG)
endif()
set(gloo_found OFF)
if(Gloo_FOUND AND TARGET gloo AND LAVAFLOW_HAVE_MPI)
  set(gloo_found ON)
endif()
lavaflow_backend_resolve(GLOO "${gloo_found}" "no Gloo (libgloo-dev), or no MPI to start its ranks")

# Python: the interpreter whose packages the tests use, its headers, and pybind11 (all Debian
# packages). A sanitizer build leaves it out: its extension would need an interpreter started
# with the sanitizer runtime preloaded.
set(LAVAFLOW_PYTHON /usr/bin/python3 CACHE FILEPATH "The Python interpreter the package is built for and tested with")
set(python_found OFF)
set(python_why "no Python development files or pybind11 for ${LAVAFLOW_PYTHON} (python3-dev, pybind11-dev)")
if(LAVAFLOW_SANITIZE)
  set(python_why "sanitizer build (LAVAFLOW_SANITIZE): the extension would need the sanitizer runtime preloaded into Python")
elseif(NOT LAVAFLOW_WITH_PYTHON STREQUAL "OFF")
  set(Python_EXECUTABLE ${LAVAFLOW_PYTHON})
  find_package(Python 3.9 QUIET COMPONENTS Interpreter Development.Module)
  set(PYBIND11_FINDPYTHON ON)
  find_package(pybind11 QUIET CONFIG)
  if(Python_FOUND AND pybind11_FOUND)
    set(python_found ON)
  endif()
endif()
lavaflow_backend_resolve(PYTHON "${python_found}" "${python_why}")
