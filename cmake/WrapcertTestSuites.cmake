# One ctest test per googletest suite, not per case.
#
#   wrapcert_discover_suites(wrapcert_unit_tests LABELS unit COSTS Certify 230)
#
# Each test process loads LibTorch, which costs about half a second (more than a second under
# the sanitizers) before the first case runs: with a process per case that start-up was a third
# of the suites' time. A suite runs its cases in one process, each still reported by gtest;
# `ctest -R Suite` picks suites, and `--gtest_filter` cases within one.
#
# Discovery works as gtest_discover_tests does (after the build, by --gtest_list_tests), with the
# suites written to a file ctest includes. A suite whose every case was skipped (no TPU, no GPU)
# is reported skipped (wrapcert_test_main prints the line that says so); a suite with a case
# passed and another skipped passes, and one with a case failed fails.
#
# COSTS names the suites that take minutes, with their seconds on 2 cores in the slowest build
# that runs them: ctest starts the costliest tests first, and in a new build folder (no timings
# of its own yet) it knows only these. They order the run; they limit nothing.

set(_WRAPCERT_LIST_SUITES "${CMAKE_CURRENT_LIST_DIR}/WrapcertListSuites.cmake")

function(wrapcert_discover_suites target)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "" "LABELS;COSTS")
  set(costs "")
  while(arg_COSTS)
    list(POP_FRONT arg_COSTS suite seconds)
    string(APPEND costs "${suite}=${seconds},")
  endwhile()
  set(base "${CMAKE_CURRENT_BINARY_DIR}/${target}")
  set(suites_file "${base}_suites.cmake")
  add_custom_command(
    TARGET ${target} POST_BUILD
    BYPRODUCTS "${suites_file}"
    COMMAND "${CMAKE_COMMAND}" "-DTEST_EXECUTABLE=$<TARGET_FILE:${target}>"
            "-DTEST_TARGET=${target}" "-DTEST_LABELS=${arg_LABELS}" "-DTEST_COSTS=${costs}"
            "-DTEST_WORKING_DIRECTORY=${CMAKE_CURRENT_BINARY_DIR}" "-DTEST_FILE=${suites_file}"
            -P "${_WRAPCERT_LIST_SUITES}"
    VERBATIM)
  file(WRITE "${base}_include.cmake"
       "if(EXISTS \"${suites_file}\")\n"
       "  include(\"${suites_file}\")\n"
       "else()\n"
       "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\n"
       "  set_tests_properties(${target}_NOT_BUILT PROPERTIES LABELS \"${arg_LABELS}\")\n"
       "endif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${base}_include.cmake")
endfunction()
