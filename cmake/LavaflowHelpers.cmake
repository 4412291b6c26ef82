# Small helpers that keep every folder's CMakeLists.txt a few lines long.
include_guard(GLOBAL)

set(LAVAFLOW_BACKENDS "" CACHE INTERNAL "")

# lavaflow_backend_option(NAME DOC): declares LAVAFLOW_WITH_<NAME> = AUTO|ON|OFF.
function(lavaflow_backend_option name doc)
  set(LAVAFLOW_WITH_${name} AUTO CACHE STRING "${doc}: AUTO (build when found), ON (required), OFF")
  set_property(CACHE LAVAFLOW_WITH_${name} PROPERTY STRINGS AUTO ON OFF)
  string(TOUPPER "${LAVAFLOW_WITH_${name}}" value)
  if(NOT value MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "LAVAFLOW_WITH_${name}=${LAVAFLOW_WITH_${name}}: expected AUTO, ON or OFF")
  endif()
  set(LAVAFLOW_BACKENDS "${LAVAFLOW_BACKENDS};${name}" CACHE INTERNAL "")
endfunction()

# lavaflow_backend_resolve(NAME FOUND REASON): decides whether backend NAME is built.
# Sets LAVAFLOW_HAVE_<NAME> in the caller's scope; fails loudly when ON and not found.
function(lavaflow_backend_resolve name found reason)
  string(TOUPPER "${LAVAFLOW_WITH_${name}}" value)
  set(have OFF)
  if(value STREQUAL "OFF")
    set(why "disabled (LAVAFLOW_WITH_${name}=OFF)")
  elseif(found)
    set(have ON)
    set(why "found")
  elseif(value STREQUAL "ON")
    message(FATAL_ERROR "LAVAFLOW_WITH_${name}=ON but ${reason}")
  else()
    set(why "not built: ${reason}")
  endif()
  set(LAVAFLOW_HAVE_${name} ${have} PARENT_SCOPE)
  set(LAVAFLOW_HAVE_${name} ${have} CACHE INTERNAL "")
  set(LAVAFLOW_WHY_${name} "${why}" CACHE INTERNAL "")
endfunction()

function(lavaflow_print_backend_summary)
  foreach(name IN LISTS LAVAFLOW_BACKENDS)
    if(name)
      message(STATUS "lavaflow: ${name} = ${LAVAFLOW_WITH_${name}} -> ${LAVAFLOW_WHY_${name}}")
    endif()
  endforeach()
endfunction()

# Warnings and sanitizers for every target of ours.
function(lavaflow_target_flags target)
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wpedantic -Wshadow -Wconversion
                                           -Wno-sign-conversion
                                           # g++ 12 flags designated initializers that rely on
                                           # default member initializers (fixed in g++ 13).
                                           -Wno-missing-field-initializers)
  if(LAVAFLOW_WERROR)
    target_compile_options(${target} PRIVATE -Werror)
  endif()
  # Debug info names the build directory as "."; installed files carry no path of the build tree.
  target_compile_options(${target} PRIVATE -ffile-prefix-map=${PROJECT_BINARY_DIR}=.)
  if(LAVAFLOW_SANITIZE)
    target_compile_options(${target} PRIVATE -fsanitize=address,undefined -fno-omit-frame-pointer
                                             -fno-sanitize-recover=undefined)
    target_link_options(${target} PRIVATE -fsanitize=address,undefined)
  endif()
endfunction()

# Vulkan-Hpp is most of the parse time of most of our sources: its headers (and the standard
# headers nearly every file uses) are precompiled once for position-independent code and once for
# the rest, and every target of ours reuses the matching one. The carriers get the same flags as
# the targets that reuse them; g++ refuses a header compiled with other code-generation options,
# and CMake's -Winvalid-pch (an error under LAVAFLOW_WERROR) says so at build time.
# Called once, after the options and find_package(Vulkan), before any target of ours.
function(lavaflow_add_precompiled_headers)
  if(NOT LAVAFLOW_PRECOMPILE_HEADERS)
    return()
  endif()
  foreach(pic IN ITEMS ON OFF)
    add_library(lavaflow_pch_pic_${pic} OBJECT ${PROJECT_SOURCE_DIR}/cmake/precompiled.cpp)
    set_target_properties(lavaflow_pch_pic_${pic} PROPERTIES POSITION_INDEPENDENT_CODE ${pic})
    target_compile_features(lavaflow_pch_pic_${pic} PRIVATE cxx_std_23)
    target_link_libraries(lavaflow_pch_pic_${pic} PRIVATE Vulkan::Vulkan)
    target_precompile_headers(lavaflow_pch_pic_${pic} PRIVATE
      <vulkan/vulkan_raii.hpp> <algorithm> <chrono> <cstdint> <cstring> <functional> <memory> <optional>
      <span> <string> <string_view> <thread> <vector>)
    lavaflow_target_flags(lavaflow_pch_pic_${pic})
  endforeach()
endfunction()

# lavaflow_target_flags, and for a target with C++ sources the precompiled headers (C-only targets
# would need a C carrier).
function(lavaflow_target_defaults target)
  lavaflow_target_flags(${target})
  get_target_property(sources ${target} SOURCES)
  list(FILTER sources INCLUDE REGEX "\\.cpp$")
  if(NOT LAVAFLOW_PRECOMPILE_HEADERS OR NOT sources)
    return()
  endif()
  get_target_property(type ${target} TYPE)
  get_target_property(pic ${target} POSITION_INDEPENDENT_CODE)
  if(type STREQUAL "SHARED_LIBRARY" OR type STREQUAL "MODULE_LIBRARY" OR pic)
    target_precompile_headers(${target} REUSE_FROM lavaflow_pch_pic_ON)
  else()
    target_precompile_headers(${target} REUSE_FROM lavaflow_pch_pic_OFF)
  endif()
endfunction()

# Executables of sanitizer builds keep the Vulkan drivers loaded (see cmake/sanitizer_pin.cpp).
function(lavaflow_executable_defaults target)
  lavaflow_target_defaults(${target})
  if(LAVAFLOW_SANITIZE)
    target_sources(${target} PRIVATE ${PROJECT_SOURCE_DIR}/cmake/sanitizer_pin.cpp)
    target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS})
  endif()
endfunction()

# lavaflow_add_library(NAME ALIAS SOURCES ...): a library with include/ as public headers, the
# package component ALIAS (lavaflow::ALIAS).
function(lavaflow_add_library name alias)
  add_library(${name} ${ARGN})
  add_library(lavaflow::${alias} ALIAS ${name})
  set_target_properties(${name} PROPERTIES EXPORT_NAME ${alias} OUTPUT_NAME lavaflow_${alias}
                                           POSITION_INDEPENDENT_CODE ON)
  target_include_directories(${name} PUBLIC
    $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(${name} PUBLIC cxx_std_23)
  lavaflow_target_defaults(${name})
  # Installed as component ALIAS: the target, its export set and exactly its own include/ tree.
  set_property(GLOBAL APPEND PROPERTY LAVAFLOW_COMPONENTS ${alias})
  set_property(GLOBAL PROPERTY LAVAFLOW_COMPONENT_${alias}_TARGET ${name})
  set_property(GLOBAL PROPERTY LAVAFLOW_COMPONENT_${alias}_INCLUDE ${CMAKE_CURRENT_SOURCE_DIR}/include)
endfunction()

function(lavaflow_add_app name)
  add_executable(${name} ${ARGN})
  lavaflow_executable_defaults(${name})
  set_property(GLOBAL APPEND PROPERTY LAVAFLOW_INSTALL_APPS ${name})
endfunction()
