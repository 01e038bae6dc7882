# Libraries Debian ships without CMake config files: COIN-OR CBC (pkg-config) and METIS.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CBC REQUIRED IMPORTED_TARGET cbc)

find_path(METIS_INCLUDE_DIR metis.h REQUIRED)
find_library(METIS_LIBRARY metis REQUIRED)
add_library(cobalt_metis INTERFACE)
target_include_directories(cobalt_metis INTERFACE ${METIS_INCLUDE_DIR})
target_link_libraries(cobalt_metis INTERFACE ${METIS_LIBRARY})
