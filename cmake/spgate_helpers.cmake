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
    set(props TIMEOUT ${T_TIMEOUT})
    if(T_LABELS)
      list(APPEND props LABELS "${T_LABELS}")
    endif()
    # gtest_discover_tests marks each case skipped (not passed) when it GTEST_SKIPs.
    # Listing the cases runs the binary; on a loaded 2-core machine that can take more
    # than the default 5 s (an MPI test main starts MPI first), so allow a minute.
    gtest_discover_tests(${name} DISCOVERY_MODE PRE_TEST TEST_PREFIX "${name}."
                         DISCOVERY_TIMEOUT 60 PROPERTIES ${props})
    return()
  endif()
  add_test(NAME ${name} COMMAND ${name})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT})
  if(T_LABELS)
    set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}")
  endif()
endfunction()
