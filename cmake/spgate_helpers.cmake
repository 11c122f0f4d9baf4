# Small helpers shared by the folders' CMakeLists.

# spgate_test(NAME SOURCES... LIBS... [LABELS ...] [PER_CASE] [GRPC]) — one gtest binary
# registered with ctest: as one test, or with PER_CASE as one ctest test per gtest case
# (listed when ctest runs), so a case that GTEST_SKIPs is reported skipped on its own
# and never hides a failing case of the same binary (the GPU tests without a device).
# GRPC, for a test that runs gRPC servers or channels in-process: after its last test
# the binary waits for gRPC to finish shutting down (tests/testing/grpc_quiesce.cc).
# The binary is also listed under each of its labels, so that `tests_tsan` builds exactly
# the binaries `ctest -L tsan` runs.
function(spgate_test name)
  cmake_parse_arguments(T "PER_CASE;GRPC" "TIMEOUT" "SOURCES;LIBS;LABELS" ${ARGN})
  add_executable(${name} ${T_SOURCES})
  # Per label, for the tests_<label> targets (top-level CMakeLists.txt).
  foreach(label ${T_LABELS})
    set_property(GLOBAL APPEND PROPERTY SPGATE_TEST_TARGETS_${label} ${name})
  endforeach()
  target_link_libraries(${name} PRIVATE ${T_LIBS} GTest::gtest GTest::gmock GTest::gtest_main)
  if(T_GRPC)
    target_link_libraries(${name} PRIVATE spgate_grpc_quiesce)
  endif()
  set_target_properties(${name} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/tests)
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 300)
  endif()
  if(T_PER_CASE)
    # gtest_discover_tests marks each case skipped (not passed) when it GTEST_SKIPs.
    # Listing the cases runs the binary; on a loaded 2-core machine that can take more
    # than the default 5 s (an MPI test main starts MPI first), so allow a minute.
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${name}."
                         DISCOVERY_TIMEOUT 60)
    spgate_case_properties(${name} TIMEOUT ${T_TIMEOUT} LABELS ${T_LABELS})
    return()
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()

# spgate_case_properties(TARGET [TIMEOUT s] [RESOURCE_LOCK name] [LABELS ...]
#                        [ENVIRONMENT ...]) — properties for every case
# gtest_discover_tests(TARGET ... DISCOVERY_MODE PRE_TEST) lists when ctest runs.
# gtest_discover_tests' own PROPERTIES flattens a list value (two labels, an environment)
# into separate words, which set_tests_properties then pairs up wrongly; a script ctest
# includes after the discovery's sets each value whole.
function(spgate_case_properties target)
  cmake_parse_arguments(P "" "TIMEOUT;RESOURCE_LOCK" "LABELS;ENVIRONMENT" ${ARGN})
  set(props "")
  foreach(key TIMEOUT RESOURCE_LOCK LABELS ENVIRONMENT)
    if(DEFINED P_${key})
      string(APPEND props " ${key} [==[${P_${key}}]==]")
    endif()
  endforeach()
  set(script "${CMAKE_CURRENT_BINARY_DIR}/${target}_case_properties.cmake")
  file(WRITE "${script}"
       "if(${target}_TESTS)\n  set_tests_properties(\${${target}_TESTS} PROPERTIES${props})\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES "${script}")
endfunction()
