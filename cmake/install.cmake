# SPDX-License-Identifier: Apache-2.0
# install() and export() of the library: headers (with the generated version.h), the static or
# shared library, the CLI when built, and the CMake package sparse_swaConfig.cmake (+ its
# version file) with the target sparse_swa::sparse_swa. The build tree is a package too
# (export(): -Dsparse_swa_DIR=<build>).
include(CMakePackageConfigHelpers)
set(SPARSE_SWA_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/sparse_swa)

install(TARGETS sparse_swa EXPORT sparse_swaTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/sparse_swa
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} FILES_MATCHING PATTERN "*.h")
install(FILES ${PROJECT_BINARY_DIR}/include/sparse_swa/version.h
        DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/sparse_swa)
if(SPARSE_SWA_CLI)
  install(TARGETS sparse-swa RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

install(EXPORT sparse_swaTargets NAMESPACE sparse_swa:: DESTINATION ${SPARSE_SWA_CMAKE_DIR})
export(EXPORT sparse_swaTargets NAMESPACE sparse_swa::
       FILE ${PROJECT_BINARY_DIR}/sparse_swaTargets.cmake)
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/sparse_swaConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/sparse_swaConfig.cmake
                              INSTALL_DESTINATION ${SPARSE_SWA_CMAKE_DIR})
# 0.x: a minor version may change the API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/sparse_swaConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/sparse_swaConfig.cmake
              ${PROJECT_BINARY_DIR}/sparse_swaConfigVersion.cmake
        DESTINATION ${SPARSE_SWA_CMAKE_DIR})
