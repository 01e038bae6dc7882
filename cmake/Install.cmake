# `cmake --install <build> --prefix P` installs the CLI (P/bin/cobalt), the library and its public
# headers, and a CMake package, so that other projects link Cobalt with
#   find_package(cobalt REQUIRED)  and  target_link_libraries(app PRIVATE cobalt::cobalt)
# (examples/cpp; tested by the ctest install_and_consume). cobalt::cuda is installed too when the
# build has the CUDA kernels.
include(CMakePackageConfigHelpers)

set(COBALT_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/cobalt)
set(cobalt_install_targets cobalt)
if(COBALT_HAVE_CUDA)
  list(APPEND cobalt_install_targets cobalt_cuda)
  set_target_properties(cobalt_cuda PROPERTIES EXPORT_NAME cuda)
endif()

install(TARGETS ${cobalt_install_targets}
        EXPORT cobaltTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(TARGETS cobalt_cli RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/cobalt DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT cobaltTargets NAMESPACE cobalt:: DESTINATION ${COBALT_INSTALL_CMAKEDIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/cobaltConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/cobaltConfig.cmake
                              INSTALL_DESTINATION ${COBALT_INSTALL_CMAKEDIR})
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cobaltConfigVersion.cmake
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cobaltConfig.cmake ${PROJECT_BINARY_DIR}/cobaltConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/FindMetisTarget.cmake
        DESTINATION ${COBALT_INSTALL_CMAKEDIR})
