# Warnings and precompiled LibTorch headers for wrapcert's own targets, and ccache when it is
# there.

add_library(wrapcert_warnings INTERFACE)
target_compile_options(wrapcert_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic>)

# About ten of the fifteen seconds a translation unit takes go to parsing LibTorch's module
# headers, which nearly every one includes: they are parsed once, into one precompiled header
# that wrapcert's targets share (private to them: nothing reaches wrapcert's users).
# ccache restores a unit built with it in another clone when the header it used is the same:
# GCC's precompiled header is hashed as it is. Clang's records the absolute path of the clone
# that built it, so ccache hashes a checksum of what went into it instead (the `.sum` file
# beside it, ccache's pch_external_checksum: the compiler, the flags, the header list and
# LibTorch's version), and the units name it with `-include-pch` alone (CMake's way adds an
# `-Xclang -include` of the clone's own header path, which ccache hashes as it is).
option(WRAPCERT_PRECOMPILE_HEADERS "Precompile the LibTorch headers of wrapcert's targets" ON)
set(WRAPCERT_PRECOMPILED
    <torch/nn/module.h> <torch/nn/modules/linear.h> <torch/nn/modules/container/modulelist.h>
    <torch/nn/modules/container/sequential.h> <torch/nn/modules/container/moduledict.h>
    <torch/types.h> <torch/utils.h>)
set(_WRAPCERT_PCH_SOURCE "${CMAKE_CURRENT_LIST_DIR}/precompiled.cpp")

# The checksum ccache hashes in place of Clang's precompiled header (written at configure time:
# everything it covers is known then).
function(_wrapcert_pch_checksum pch_dir)
  execute_process(COMMAND "${CMAKE_CXX_COMPILER}" --version OUTPUT_VARIABLE version)
  string(TOUPPER "${CMAKE_BUILD_TYPE}" type)
  find_file(_wrapcert_torch_version torch/version.h PATHS ${TORCH_INCLUDE_DIRS}
            /usr/include/torch/csrc/api/include NO_DEFAULT_PATH)
  set(torch_version "")
  if(_wrapcert_torch_version)
    file(READ "${_wrapcert_torch_version}" torch_version)
  endif()
  get_directory_property(options COMPILE_OPTIONS)
  string(SHA256 sum "${version}|${CMAKE_CXX_FLAGS}|${CMAKE_CXX_FLAGS_${type}}|${options}|\
${CMAKE_CXX_STANDARD}|${WRAPCERT_PRECOMPILED}|${torch_version}")
  file(WRITE "${pch_dir}/cmake_pch.hxx.pch.sum" "${sum}\n")
endfunction()

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
    if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
      # No time stamps of the headers in it (ccache could not reuse units built with it).
      target_compile_options(wrapcert_precompiled PRIVATE "SHELL:-Xclang -fno-pch-timestamp")
      _wrapcert_pch_checksum("${CMAKE_CURRENT_BINARY_DIR}/CMakeFiles/wrapcert_precompiled.dir")
    endif()
  endif()
  get_target_property(sources ${target} SOURCES)
  list(FILTER sources INCLUDE REGEX "\\.cpp$")
  list(LENGTH sources count)
  if(count LESS 2)
    return()
  endif()
  if(CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    get_target_property(dir wrapcert_precompiled BINARY_DIR)
    set(pch "${dir}/CMakeFiles/wrapcert_precompiled.dir/cmake_pch.hxx.pch")
    add_dependencies(${target} wrapcert_precompiled)
    target_compile_options(${target} PRIVATE -Winvalid-pch "SHELL:-include-pch ${pch}")
    set_property(SOURCE ${sources} TARGET_DIRECTORY ${target} APPEND PROPERTY OBJECT_DEPENDS
                 "${pch}")
  else()
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
        CCACHE_PCH_EXTSUM=true
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
