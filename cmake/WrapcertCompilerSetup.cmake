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
