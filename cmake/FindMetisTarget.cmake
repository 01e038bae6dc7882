# METIS as the imported target cobalt::metis (Debian ships it without a CMake config file). Used by
# the build (cmake/Dependencies.cmake) and by the installed package (cobaltConfig.cmake), which
# finds METIS again on the machine that uses it instead of recording this machine's path.
if(NOT TARGET cobalt::metis)
  find_path(METIS_INCLUDE_DIR metis.h REQUIRED)
  find_library(METIS_LIBRARY metis REQUIRED)
  add_library(cobalt::metis UNKNOWN IMPORTED GLOBAL)
  set_target_properties(cobalt::metis PROPERTIES IMPORTED_LOCATION "${METIS_LIBRARY}"
                                                 INTERFACE_INCLUDE_DIRECTORIES "${METIS_INCLUDE_DIR}")
endif()
