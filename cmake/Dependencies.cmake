# Third-party dependencies, all from Debian packages (see .ci/install-deps).
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(nlohmann_json 3 REQUIRED)
find_package(CLI11 REQUIRED)

# OpenBLAS provides cblas_sgemm/cblas_dgemm for the CPU GEMMs.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(ZSHARD_CBLAS_INCLUDE cblas.h
  PATHS /usr/include/${CMAKE_LIBRARY_ARCHITECTURE}/openblas-pthread /usr/include/openblas
  REQUIRED)
# xxHash checksums the checkpoint files; used header-only (XXH_INLINE_ALL), so nothing to link.
find_path(ZSHARD_XXHASH_INCLUDE xxhash.h REQUIRED)

add_library(zshard_blas INTERFACE)
target_link_libraries(zshard_blas INTERFACE ${BLAS_LIBRARIES})
target_include_directories(zshard_blas INTERFACE ${ZSHARD_CBLAS_INCLUDE})
