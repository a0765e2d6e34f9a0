# Warnings and precompiled LibTorch headers for wrapcert's own targets, and ccache when it is
# there.

add_library(wrapcert_warnings INTERFACE)
target_compile_options(wrapcert_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic>)

# About ten of the fifteen seconds a translation unit takes go to parsing LibTorch's module
# headers, which nearly every one includes: they are parsed once, into one precompiled header
# that wrapcert's targets share (private to them: nothing reaches wrapcert's users).
# On by default with GCC only: ccache restores GCC's precompiled header in another clone and
# every unit using it hits, but Clang's records the absolute paths and times of its inputs, so
# a clone would miss the cache throughout (and could not use another clone's header).
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  set(_wrapcert_pch_default ON)
else()
  set(_wrapcert_pch_default OFF)
endif()
option(WRAPCERT_PRECOMPILE_HEADERS "Precompile the LibTorch headers of wrapcert's targets"
       ${_wrapcert_pch_default})
set(WRAPCERT_PRECOMPILED
    <torch/nn/module.h> <torch/nn/modules/linear.h> <torch/nn/modules/container/modulelist.h>
    <torch/nn/modules/container/sequential.h> <torch/nn/modules/container/moduledict.h>
    <torch/types.h> <torch/utils.h>)
set(_WRAPCERT_PCH_SOURCE "${CMAKE_CURRENT_LIST_DIR}/precompiled.cpp")

# Every target of wrapcert's own calls this: the warnings (never exported), and the shared
# precompiled headers where there are two translation units or more to use them.
function(wrapcert_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:wrapcert_warnings>)
  if(NOT WRAPCERT_PRECOMPILE_HEADERS)
    return()
  endif()
  if(NOT TARGET wrapcert_precompiled)
    # Built with the flags every target has (LibTorch's definitions, the warnings), once.
    add_library(wrapcert_precompiled OBJECT "${_WRAPCERT_PCH_SOURCE}")
    target_link_libraries(wrapcert_precompiled PRIVATE torch wrapcert_warnings)
    target_precompile_headers(wrapcert_precompiled PRIVATE ${WRAPCERT_PRECOMPILED})
  endif()
  get_target_property(sources ${target} SOURCES)
  list(FILTER sources INCLUDE REGEX "\\.cpp$")
  list(LENGTH sources count)
  if(count GREATER 1)
    target_precompile_headers(${target} REUSE_FROM wrapcert_precompiled)
  endif()
endfunction()

# ccache, with what it needs to cache precompiled headers and the units that use them: hits
# across clones come from scripts/bootstrap.sh's CCACHE_BASEDIR.
if(WRAPCERT_TOP_LEVEL AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(WRAPCERT_CCACHE ccache)
  if(WRAPCERT_CCACHE)
    set(CMAKE_CXX_COMPILER_LAUNCHER
        env "CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime"
        "${WRAPCERT_CCACHE}")
  endif()
endif()

# Sanitizers for the whole build, e.g. -DWRAPCERT_SANITIZE=address,undefined (any report is
# fatal: -fno-sanitize-recover). scripts/sanitize.sh builds this way with clang.
set(WRAPCERT_SANITIZE "" CACHE STRING "Sanitizers to build with (address,undefined,...)")
# The `Sanitize` build type: -O1 with line tables (CMake creates the variable empty).
if(NOT CMAKE_CXX_FLAGS_SANITIZE)
  set(CMAKE_CXX_FLAGS_SANITIZE "-O1 -gline-tables-only" CACHE STRING "Sanitize flags" FORCE)
endif()
if(WRAPCERT_SANITIZE)
  add_compile_options(-fsanitize=${WRAPCERT_SANITIZE} -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=${WRAPCERT_SANITIZE})
endif()

# libFuzzer targets (clang only): wrapcert's code gets coverage instrumentation for them.
option(WRAPCERT_BUILD_FUZZERS "Build the libFuzzer targets in fuzz/ (needs clang)" OFF)
if(WRAPCERT_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "WRAPCERT_BUILD_FUZZERS needs clang (-DCMAKE_CXX_COMPILER=clang++)")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
