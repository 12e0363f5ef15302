# libtorch, for the optional adapter in adapters/libtorch (target zero3::libtorch). ZERO3_LIBTORCH (AUTO|ON|OFF)
# becomes ZERO3_HAVE_LIBTORCH; the core library never needs it.
#   Debian/Ubuntu's libtorch-dev is found on the system paths. Any other libtorch is named by Torch_DIR, e.g. a
#   PyPI wheel's torch/share/cmake/Torch: its own libtorch and libc10 are then used even when the system has one.
#   ZERO3_LIBTORCH_CPU_ONLY links only libtorch_cpu and libc10: a CUDA build of libtorch (the PyPI wheel) on a
#   machine without the CUDA libraries it was built against.
# Sets ZERO3_TORCH_LIBRARIES and ZERO3_TORCH_CXX_FLAGS for the adapter.
set(ZERO3_LIBTORCH AUTO CACHE STRING "libtorch adapter zero3::libtorch (AUTO|ON|OFF)")
set_property(CACHE ZERO3_LIBTORCH PROPERTY STRINGS AUTO ON OFF)
option(ZERO3_LIBTORCH_CPU_ONLY "Link the libtorch adapter to libtorch_cpu and libc10 only" OFF)

set(_torch_found OFF)
set(_torch_detail "find_package(Torch): install libtorch-dev, or set Torch_DIR")
if(NOT ZERO3_LIBTORCH STREQUAL "OFF")
  if(Torch_DIR)
    # TorchConfig looks for its Caffe2 package, libtorch and libc10 on the system paths first: take those beside
    # Torch_DIR, not a system libtorch's.
    get_filename_component(_torch_prefix "${Torch_DIR}/../../.." ABSOLUTE)
    if(EXISTS "${Torch_DIR}/../Caffe2/Caffe2Config.cmake")
      get_filename_component(_caffe2_dir "${Torch_DIR}/../Caffe2" ABSOLUTE)
      set(Caffe2_DIR "${_caffe2_dir}" CACHE PATH "Caffe2's CMake package, beside Torch_DIR" FORCE)
    endif()
    # A CUDA build's package probes the machine's GPUs (try_run) unless it is told the architectures; the CPU part
    # alone needs none.
    if(ZERO3_LIBTORCH_CPU_ONLY AND NOT DEFINED TORCH_CUDA_ARCH_LIST AND NOT DEFINED ENV{TORCH_CUDA_ARCH_LIST})
      set(TORCH_CUDA_ARCH_LIST "8.0")
    endif()
    find_library(TORCH_LIBRARY torch PATHS "${_torch_prefix}/lib" NO_DEFAULT_PATH)
    find_library(c10_LIBRARY c10 PATHS "${_torch_prefix}/lib" NO_DEFAULT_PATH)
  endif()
  find_package(Torch QUIET)
  if(Torch_FOUND AND Torch_VERSION VERSION_LESS 1.13)
    set(_torch_detail "libtorch ${Torch_VERSION} at ${TORCH_INSTALL_PREFIX}; the adapter needs 1.13 or newer")
  elseif(Torch_FOUND)
    set(_torch_found ON)
    set(_torch_detail "libtorch ${Torch_VERSION} (${TORCH_INSTALL_PREFIX})")
    if(ZERO3_LIBTORCH_CPU_ONLY)
      set(ZERO3_TORCH_LIBRARIES torch_cpu ${c10_LIBRARY})
      string(APPEND _torch_detail ", libtorch_cpu only")
    else()
      set(ZERO3_TORCH_LIBRARIES ${TORCH_LIBRARIES})
    endif()
    separate_arguments(ZERO3_TORCH_CXX_FLAGS UNIX_COMMAND "${TORCH_CXX_FLAGS}")
  endif()
endif()
zero3_decide(ZERO3_LIBTORCH ${_torch_found} "${_torch_detail}")

# libtorch's headers take most of the 25 to 35 CPU-seconds of each source that includes them: the adapter compiles
# them once as its precompiled header, and its tests and the libtorch examples reuse it (docs/testing.md, "How long
# the test command takes"). The list holds the headers that most of those sources include; all of torch/torch.h
# would make each of them slower to compile, not faster. GCC and Clang read a precompiled header only under the
# position-independence flag it was made with, so a program that reuses it is compiled as position-independent code
# (-fPIC, after CMake's -fPIE), as the adapter, a shared library, is; and they read it only where every macro defined
# when it was made is defined too, so the adapter goes without CMake's zero3_libtorch_EXPORTS, which nothing reads.
option(ZERO3_LIBTORCH_PCH "Precompile libtorch's common headers once for the adapter, its tests and examples" ON)
function(zero3_torch_pch target)
  if(NOT ZERO3_LIBTORCH_PCH)
    return()
  endif()
  if(target STREQUAL "zero3_libtorch")
    set_target_properties(${target} PROPERTIES DEFINE_SYMBOL "")
    target_precompile_headers(${target} PRIVATE <ATen/core/Tensor.h> <torch/nn/module.h> <torch/nn/modules/linear.h>
                              <torch/nn/functional/loss.h> <torch/optim/adamw.h> <torch/utils.h>)
    return()
  endif()
  target_precompile_headers(${target} REUSE_FROM zero3_libtorch)
  get_target_property(type ${target} TYPE)
  if(type STREQUAL "EXECUTABLE")
    target_compile_options(${target} PRIVATE -fPIC)
  endif()
endfunction()
