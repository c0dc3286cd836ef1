# The CUDA path is optional: ZSHARD_CUDA=AUTO builds it wherever nvcc is found (a GPU is not needed to
# compile), ON insists, OFF skips. Default architecture Hopper (sm_90); override CMAKE_CUDA_ARCHITECTURES.
set(ZSHARD_HAVE_CUDA OFF)
if(NOT ZSHARD_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    # CMake 3.25 predates nvcc's C++20 mode in its tables: teach it the flag, then ask for C++20 as in C++.
    if(NOT CMAKE_CUDA20_STANDARD_COMPILE_OPTION)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
      list(APPEND CMAKE_CUDA_COMPILE_FEATURES cuda_std_20)
    endif()
    set(CMAKE_CUDA_STANDARD 20)
    set(CMAKE_CUDA_STANDARD_REQUIRED ON)
    find_package(CUDAToolkit REQUIRED)
    find_library(ZSHARD_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
    find_path(ZSHARD_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
    if(ZSHARD_NCCL_LIBRARY AND ZSHARD_NCCL_INCLUDE)
      set(ZSHARD_HAVE_CUDA ON)
    elseif(ZSHARD_CUDA STREQUAL "ON")
      message(FATAL_ERROR "ZSHARD_CUDA=ON but NCCL was not found")
    endif()
  elseif(ZSHARD_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ZSHARD_CUDA=ON but no CUDA compiler was found")
  endif()
endif()
message(STATUS "zshard CUDA path: ${ZSHARD_HAVE_CUDA}")

# Fused attention on cuda goes through cuDNN's SDPA, built from the cudnn-frontend headers that
# scripts/install-deps.sh unpacks into .deps/ (ZSHARD_CUDNN_FRONTEND_INCLUDE elsewhere) and cudnn.h. libcudnn
# itself is loaded at run time, never linked: without either header the build goes on without the fused
# CUDA path (--attention auto keeps blocks on cuda).
set(ZSHARD_HAVE_CUDNN OFF)
if(ZSHARD_HAVE_CUDA)
  find_path(ZSHARD_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h HINTS ${PROJECT_SOURCE_DIR}/.deps/cudnn-frontend/include)
  find_path(ZSHARD_CUDNN_INCLUDE cudnn.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
  if(ZSHARD_CUDNN_FRONTEND_INCLUDE AND ZSHARD_CUDNN_INCLUDE)
    set(ZSHARD_HAVE_CUDNN ON)
    message(STATUS "zshard fused attention on cuda: cuDNN frontend ${ZSHARD_CUDNN_FRONTEND_INCLUDE}, "
                   "cudnn.h ${ZSHARD_CUDNN_INCLUDE}")
  else()
    message(STATUS "zshard fused attention on cuda: OFF (no cudnn_frontend.h: run scripts/install-deps.sh; "
                   "or no cudnn.h in the CUDA toolkit)")
  endif()
endif()

# Adds the CUDA sources (kernels/cuda/*.cu, *.cpp) to `target` when the CUDA path is on.
function(zshard_add_cuda target)
  if(NOT ZSHARD_HAVE_CUDA)
    return()
  endif()
  file(GLOB cuda_sources CONFIGURE_DEPENDS
    ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cpp
    ${PROJECT_SOURCE_DIR}/comm/nccl/*.cpp)
  if(NOT cuda_sources)
    return()
  endif()
  target_sources(${target} PRIVATE ${cuda_sources})
  # The .cu files stay out of the unity batches (which CMake 3.31 makes of CUDA sources too): nvcc
  # compiles each on its own, as it always has.
  set(cu_sources ${cuda_sources})
  list(FILTER cu_sources INCLUDE REGEX "\\.cu$")
  set_source_files_properties(${cu_sources} PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
  # PRIVATE: no public header knows CUDA; zshard_internal passes the definition on to the tests.
  target_compile_definitions(${target} PRIVATE ZSHARD_WITH_CUDA=1)
  target_include_directories(${target} PRIVATE ${ZSHARD_NCCL_INCLUDE})
  target_link_libraries(${target} PRIVATE CUDA::cudart CUDA::cublas CUDA::cublasLt ${ZSHARD_NCCL_LIBRARY})
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
  if(ZSHARD_HAVE_CUDNN)
    file(GLOB cudnn_sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/kernels/cuda/cudnn/*.cpp)
    target_sources(${target} PRIVATE ${cudnn_sources})
    # The frontend's headers (and the copy of nlohmann-json they carry) for these files only, as system
    # headers (their warnings are not ours), each file compiled on its own: they are heavy, and define the
    # library handle the shim resolves cuDNN through.
    set_source_files_properties(${cudnn_sources} PROPERTIES
      SKIP_UNITY_BUILD_INCLUSION ON
      COMPILE_OPTIONS "-isystem;${ZSHARD_CUDNN_FRONTEND_INCLUDE};-isystem;${ZSHARD_CUDNN_INCLUDE}"
      COMPILE_DEFINITIONS NV_CUDNN_FRONTEND_USE_DYNAMIC_LOADING)
    target_compile_definitions(${target} PRIVATE ZSHARD_WITH_CUDNN=1)
    target_link_libraries(${target} PRIVATE ${CMAKE_DL_LIBS})
  endif()
endfunction()
