# Run by wrapcert_discover_suites after a test executable is built (cmake -P): lists its
# googletest suites and writes one ctest test per suite to TEST_FILE.
#   TEST_EXECUTABLE, TEST_TARGET, TEST_LABELS (a list), TEST_WORKING_DIRECTORY, TEST_FILE,
#   TEST_COSTS (`Suite=seconds,...`: ctest's COST of the suites named)
cmake_minimum_required(VERSION 3.23)

# The limit is there for an executable that hangs, and is counted in wall time: scripts/test.sh
# runs the sanitizer build at nice 19 beside the main suites, where a listing (2-3 s of CPU under
# ASan) can wait minutes for a core; 60 s was once not enough there.
set(json_file "${TEST_FILE}.listing.json")
execute_process(
  COMMAND "${TEST_EXECUTABLE}" --gtest_list_tests "--gtest_output=json:${json_file}"
  WORKING_DIRECTORY "${TEST_WORKING_DIRECTORY}"
  TIMEOUT 900
  OUTPUT_VARIABLE listing
  ERROR_VARIABLE errors
  RESULT_VARIABLE status)
if(NOT status EQUAL 0)
  file(REMOVE "${TEST_FILE}")
  message(FATAL_ERROR "${TEST_TARGET}: --gtest_list_tests failed (${status}):\n${listing}${errors}")
endif()

# The area of each suite, from the source file of its cases (the JSON listing names it): a
# test in src/wrapcert/io/ is labelled `area:io`, so that `scripts/test.sh --changed` runs what
# covers the folders a change touched.
function(area_of path out)
  if(path MATCHES "src/wrapcert/(io|gen|certify|python|test_support)/")
    set(${out} "area:${CMAKE_MATCH_1}" PARENT_SCOPE)
  elseif(path MATCHES "src/wrapcert/")
    set(${out} "area:core" PARENT_SCOPE)
  elseif(path MATCHES "(^|/)(fixtures|regression|property_tests|fuzz|bench)/")
    set(${out} "area:${CMAKE_MATCH_2}" PARENT_SCOPE)
  else()
    set(${out} "" PARENT_SCOPE)
  endif()
endfunction()
file(READ "${json_file}" json)
file(REMOVE "${json_file}")
string(JSON suite_count LENGTH "${json}" testsuites)
math(EXPR last_suite "${suite_count} - 1")
foreach(i RANGE ${last_suite})
  string(JSON suite_name GET "${json}" testsuites ${i} name)
  string(JSON case_count LENGTH "${json}" testsuites ${i} testsuite)
  math(EXPR last_case "${case_count} - 1")
  set(areas "")
  foreach(j RANGE ${last_case})
    string(JSON source ERROR_VARIABLE no_file GET "${json}" testsuites ${i} testsuite ${j} file)
    if(NOT no_file)
      area_of("${source}" area)
      if(area)
        list(APPEND areas "${area}")
      endif()
    endif()
  endforeach()
  list(REMOVE_DUPLICATES areas)
  set("areas_of_${suite_name}" "${areas}")
endforeach()

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
  set(labels ${TEST_LABELS} ${areas_of_${suite}})
  set(cost 0)
  if(",${TEST_COSTS}" MATCHES ",${suite}=([0-9]+),")
    set(cost "${CMAKE_MATCH_1}")
  endif()
  string(APPEND script
         "add_test([==[${suite}]==] [==[${TEST_EXECUTABLE}]==] [==[--gtest_filter=${suite}.*]==])\n"
         "set_tests_properties([==[${suite}]==] PROPERTIES\n"
         "  WORKING_DIRECTORY [==[${TEST_WORKING_DIRECTORY}]==]\n"
         "  LABELS [==[${labels}]==]\n"
         "  COST ${cost}\n"
         "  SKIP_REGULAR_EXPRESSION [==[wrapcert: every case skipped]==])\n")
  math(EXPR count "${count} + 1")
endforeach()
if(count EQUAL 0)
  message(FATAL_ERROR "${TEST_TARGET}: no test suites in its --gtest_list_tests output:\n${listing}")
endif()
file(WRITE "${TEST_FILE}" "${script}")
