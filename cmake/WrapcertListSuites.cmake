# Run by wrapcert_discover_suites after a test executable is built (cmake -P): lists its
# googletest suites and writes one ctest test per suite to TEST_FILE.
#   TEST_EXECUTABLE, TEST_TARGET, TEST_LABELS (a list), TEST_WORKING_DIRECTORY, TEST_FILE
cmake_minimum_required(VERSION 3.23)

# The limit is there for an executable that hangs, and is counted in wall time: scripts/test.sh
# runs the sanitizer build at nice 19 beside the main suites, where a listing (2-3 s of CPU under
# ASan) can wait minutes for a core; 60 s was once not enough there.
execute_process(
  COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests
  WORKING_DIRECTORY "${TEST_WORKING_DIRECTORY}"
  TIMEOUT 900
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE errors
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  file(REMOVE "${TEST_FILE}")
  message(FATAL_ERROR "${TEST_TARGET}: --gtest_list_tests failed (${status}):\n${listing}${errors}")
endif()

# A suite line is the suite's name and a dot, then perhaps "  # TypeParam = ..."; case lines are
# indented. Names never hold spaces, `[` or `]`, so bracket arguments quote them.
string(REPLACE "\n" ";" lines "${listing}")
set(script "")
set(count 0)
foreach(line IN LISTS lines)
  if(NOT line MATCHES "^([^ #]+)\\.( |$)")
    continue()
  endif()
  set(suite "${CMAKE_MATCH_1}")
  if(suite MATCHES "(^|/)DISABLED_")
    continue()
  endif()
  string(APPEND script
         "add_test([==[${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==])\n"
         "set_tests_properties([==[${suite}]==] PROPERTIES\n"
         "  WORKING_DIRECTORY [==[${TEST_WORKING_DIRECTORY}]==]\n"
         "  LABELS [==[${TEST_LABELS}]==]\n"
         "  SKIP_REGULAR_EXPRESSION [==[wrapcert: every case skipped]==])\n")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${TEST_TARGET}: no test suites in its --gtest_list_tests output:\n${listing}")
endif()
file(WRITE "${TEST_FILE}" "${script}")
