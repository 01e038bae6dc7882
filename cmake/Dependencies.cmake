# Libraries Debian ships without CMake config files: COIN-OR CBC (pkg-config) and METIS.
find_package(PkgConfig REQUIRED)
pkg_check_modules(CBC REQUIRED IMPORTED_TARGET cbc)
include(${CMAKE_CURRENT_LIST_DIR}/FindMetisTarget.cmake)
