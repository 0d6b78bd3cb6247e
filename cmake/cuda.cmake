# CUDA is optional: compiled whenever nvcc is present, so CI without a GPU still
# catches compile errors in every .cu file. Running needs a device (tests skip with 77).
set(MFS_HAVE_CUDA OFF)
if(MFS_ENABLE_CUDA)
  if(NOT DEFINED CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
      # Hopper is the target (H100/H200). Release builds may widen this list:
      # e.g. "80-real;86-real;89-real;90-real;90-virtual".
      set(CMAKE_CUDA_ARCHITECTURES 90)
    endif()
    enable_language(CUDA)
    set(CMAKE_CUDA_STANDARD 17)
    find_package(CUDAToolkit REQUIRED)
    set(MFS_HAVE_CUDA ON)
    message(STATUS "mfstream: CUDA enabled (${CMAKE_CUDA_COMPILER_VERSION}, archs ${CMAKE_CUDA_ARCHITECTURES})")
  else()
    message(STATUS "mfstream: nvcc not found, building the CPU engine only")
  endif()
endif()
