include_guard(GLOBAL)
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

get_property(targets GLOBAL PROPERTY LAVAFLOW_INSTALL_TARGETS)
get_property(apps GLOBAL PROPERTY LAVAFLOW_INSTALL_APPS)
install(TARGETS ${targets} EXPORT lavaflowTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(apps)
  install(TARGETS ${apps} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/core/include/ ${PROJECT_SOURCE_DIR}/transports/include/
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT lavaflowTargets NAMESPACE lavaflow:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lavaflow)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/lavaflowConfig.cmake.in
  ${PROJECT_BINARY_DIR}/lavaflowConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lavaflow)
write_basic_package_version_file(${PROJECT_BINARY_DIR}/lavaflowConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/lavaflowConfig.cmake ${PROJECT_BINARY_DIR}/lavaflowConfigVersion.cmake
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/lavaflow)
