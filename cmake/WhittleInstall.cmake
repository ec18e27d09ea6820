# Installation and the exported CMake package: find_package(whittle) gives whittle::whittle.
include(CMakePackageConfigHelpers)
include(GNUInstallDirs)

get_property(_exported GLOBAL PROPERTY WHITTLE_EXPORTED_TARGETS)
install(TARGETS ${_exported} whittle_cli EXPORT whittleTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(FILES whittle.h DESTINATION include/whittle)
install(EXPORT whittleTargets NAMESPACE whittle:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/whittle)

configure_package_config_file(cmake/whittleConfig.cmake.in
  "${CMAKE_BINARY_DIR}/whittleConfig.cmake"
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/whittle)
write_basic_package_version_file("${CMAKE_BINARY_DIR}/whittleConfigVersion.cmake"
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES "${CMAKE_BINARY_DIR}/whittleConfig.cmake" "${CMAKE_BINARY_DIR}/whittleConfigVersion.cmake"
        DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/whittle)
