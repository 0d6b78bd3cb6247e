# Debian packages only: librdkafka-dev liblmdb-dev libmsgpack-dev libinih-dev libxxhash-dev
# libzstd-dev zlib1g-dev libmicrohttpd-dev. All are found through pkg-config.
find_package(PkgConfig REQUIRED)
find_package(Threads REQUIRED)
pkg_check_modules(LMDB REQUIRED IMPORTED_TARGET lmdb)
pkg_check_modules(INIH REQUIRED IMPORTED_TARGET inih)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)
pkg_check_modules(ZSTD REQUIRED IMPORTED_TARGET libzstd)
pkg_check_modules(ZLIB REQUIRED IMPORTED_TARGET zlib)
pkg_check_modules(RDKAFKA REQUIRED IMPORTED_TARGET rdkafka)
pkg_check_modules(MSGPACK REQUIRED IMPORTED_TARGET msgpack)
# /metrics, /healthz, /readyz (ops/http.c). Optional so that a machine without it (the GPU
# hosts' .devdeps bundle) still builds; there mfs_http_open() fails with ENOTSUP unless
# metrics.listen is empty, so a service can never silently run without its metrics.
pkg_check_modules(MHD IMPORTED_TARGET libmicrohttpd)
set(MFS_HAVE_MHD ${MHD_FOUND})
if(NOT MHD_FOUND)
  message(WARNING "mfstream: libmicrohttpd not found (apt install libmicrohttpd-dev): "
    "building without the metrics/health endpoint")
endif()
find_package(OpenMP COMPONENTS C) # only for -fopenmp-simd (cmake/stages.cmake)
