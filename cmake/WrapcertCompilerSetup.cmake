# Warnings for wrapcert's own targets, and ccache when it is there.

add_library(wrapcert_warnings INTERFACE)
target_compile_options(wrapcert_warnings INTERFACE
  $<$<CXX_COMPILER_ID:GNU,Clang>:-Wall -Wextra -Wpedantic>)

# Link wrapcert's own targets against this to get the warnings (never exported).
function(wrapcert_target_defaults target)
  target_link_libraries(${target} PRIVATE $<BUILD_INTERFACE:wrapcert_warnings>)
endfunction()

if(WRAPCERT_TOP_LEVEL AND NOT CMAKE_CXX_COMPILER_LAUNCHER)
  find_program(WRAPCERT_CCACHE ccache)
  if(WRAPCERT_CCACHE)
    set(CMAKE_CXX_COMPILER_LAUNCHER "${WRAPCERT_CCACHE}")
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
