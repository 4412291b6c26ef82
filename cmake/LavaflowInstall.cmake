# The install tree: every component that was built — its library, its own public headers and an
# export set of its own — so that find_package(lavaflow COMPONENTS …) loads only what is asked
# for, and nothing of a component that was not built is installed.
include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(cmake_dir ${CMAKE_INSTALL_LIBDIR}/cmake/lavaflow)
get_property(components GLOBAL PROPERTY LAVAFLOW_COMPONENTS)
foreach(component IN LISTS components)
  get_property(target GLOBAL PROPERTY LAVAFLOW_COMPONENT_${component}_TARGET)
  get_property(include GLOBAL PROPERTY LAVAFLOW_COMPONENT_${component}_INCLUDE)
  install(TARGETS ${target} EXPORT lavaflow-${component}-targets
          ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
          LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
  install(DIRECTORY ${include}/ DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  install(EXPORT lavaflow-${component}-targets NAMESPACE lavaflow:: DESTINATION ${cmake_dir})
endforeach()

get_property(apps GLOBAL PROPERTY LAVAFLOW_INSTALL_APPS)
if(apps)
  # Installed programs carry no path of the build tree (nor need one: they link no library of
  # ours dynamically).
  set_target_properties(${apps} PROPERTIES INSTALL_RPATH "")
  install(TARGETS ${apps} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

set(LAVAFLOW_BUILT_COMPONENTS ${components})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/lavaflowConfig.cmake.in
  ${PROJECT_BINARY_DIR}/lavaflowConfig.cmake
  INSTALL_DESTINATION ${cmake_dir})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lavaflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lavaflowConfig.cmake ${PROJECT_BINARY_DIR}/lavaflowConfigVersion.cmake
        DESTINATION ${cmake_dir})
