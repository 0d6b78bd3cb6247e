# Debian packages only: librdkafka-dev liblmdb-dev libmsgpack-dev libinih-dev libxxhash-dev
# libzstd-dev zlib1g-dev. All are found through pkg-config.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
pkg_check_modules(RDKAFKA REQUIRED IMPORTED_TARGET rdkafka)
pkg_check_modules(MSGPACK REQUIRED IMPORTED_TARGET msgpack)
find_package(OpenMP COMPONENTS C)
add_library(mfs_deps INTERFACE)
add_library(mfs::deps ALIAS mfs_deps)
target_link_libraries(mfs_deps INTERFACE PkgConfig::LMDB PkgConfig::INIH PkgConfig::XXHASH
  PkgConfig::ZSTD PkgConfig::ZLIB PkgConfig::RDKAFKA PkgConfig::MSGPACK)
if(OpenMP_C_FOUND)
  # Only the SIMD pragmas: threads are ours (pthreads), so no OpenMP runtime is needed.
  target_compile_options(mfs_deps INTERFACE $<$<COMPILE_LANGUAGE:C>:-fopenmp-simd>)
endif()
