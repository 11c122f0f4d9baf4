# spgate-sim replay --sweep over a small trace: exit 0, the sweep table on stderr, and a
# summary JSON with every docs/design.md §5 key.
file(WRITE ${WORK}/trace.txt "# lengths\n")
foreach(i RANGE 1 400)
  math(EXPR len "(${i} * 7919) % 8000 + 64")
  file(APPEND ${WORK}/trace.txt "${len}\n")
endforeach()
file(WRITE ${WORK}/gates.txtpb "max_length_cv: 0.3\nwindow_steps: 20\n")
execute_process(
  COMMAND ${SIM} replay --config=${WORK}/gates.txtpb --lengths=file:${WORK}/trace.txt
          --tokens_per_batch=8192 --sweep --sweep_max_length_cv=0.1:0.5:0.2
          --sweep_max_rs_wait_share=0.1:0.3:0.1 --summary_json=${WORK}/summary.json
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_VARIABLE out)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "spgate-sim replay failed (${rc}):\n${out}\n${err}")
endif()
if(NOT err MATCHES "max_length_cv \\| max_rs_wait_share")
  message(FATAL_ERROR "no sweep table on stderr:\n${err}")
endif()
file(READ ${WORK}/summary.json json)
foreach(key steps decisions local_decisions consistency_violations lost_telemetry
            effective_tokens_per_s step_time_p95_s peak_memory_bytes sweep config)
  string(JSON value ERROR_VARIABLE jerr GET "${json}" ${key})
  if(jerr)
    message(FATAL_ERROR "summary.json lacks \"${key}\": ${jerr}\n${json}")
  endif()
endforeach()
string(JSON cv GET "${json}" config max_length_cv)
if(NOT cv EQUAL 0.3)
  message(FATAL_ERROR "replay did not use --config (max_length_cv ${cv})")
endif()
# Bad flags exit 2 with a message naming the flag.
execute_process(COMMAND ${SIM} replay --lengths=gamma:k=1 RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--lengths")
  message(FATAL_ERROR "bad --lengths: rc ${rc}, ${err}")
endif()
# With a controller and neither --job_id nor a job id in the environment, start-up fails
# naming the flag (the daemon is never dialled: nothing listens on port 1).
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env --unset=SPGATE_JOB_ID --unset=SLURM_JOB_NAME
          ${SIM} --controller=127.0.0.1:1 --groups=1 --tp=1 --steps=1
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--job_id: required with --controller")
  message(FATAL_ERROR "no --job_id with --controller: rc ${rc}, ${err}")
endif()
# An unreadable or empty --worker_token_file is refused at start-up, naming the flag.
file(WRITE ${WORK}/empty_token "\n")
foreach(case "missing_token;cannot read" "empty_token;is empty")
  list(GET case 0 file)
  list(GET case 1 want)
  execute_process(
    COMMAND ${SIM} --controller=127.0.0.1:1 --job_id=cli --worker_token_file=${WORK}/${file}
            --groups=1 --tp=1 --steps=1
    RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "--worker_token_file: .*${want}")
    message(FATAL_ERROR "--worker_token_file=${file}: rc ${rc}, ${err}")
  endif()
endforeach()
# replay --compare: the five policies under JSON key "compare", the table on stderr and
# the series CSV.
execute_process(
  COMMAND ${SIM} replay --lengths=bimodal:short=256,long=8000,p_long=0.4 --bucketing=false
          --steps=200 --groups=2 --compare --compare_series=${WORK}/series.csv
          --summary_json=${WORK}/compare.json
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES "\\| oracle \\|")
  message(FATAL_ERROR "spgate-sim replay --compare failed (${rc}):\n${err}")
endif()
file(READ ${WORK}/compare.json json)
foreach(policy sp tp_only static adaptive oracle)
  foreach(key effective_tokens_per_s step_time_p95_s peak_memory_bytes ratio_to_oracle switches
              probe_steps)
    string(JSON value ERROR_VARIABLE jerr GET "${json}" compare ${policy} ${key})
    if(jerr)
      message(FATAL_ERROR "compare.${policy} lacks \"${key}\": ${jerr}\n${json}")
    endif()
  endforeach()
endforeach()
string(JSON oracle GET "${json}" compare oracle ratio_to_oracle)
if(NOT oracle EQUAL 1)
  message(FATAL_ERROR "the oracle's ratio to itself is ${oracle}")
endif()
file(STRINGS ${WORK}/series.csv series)
list(GET series 0 header)
if(NOT header STREQUAL "step,sp,tp_only,static,adaptive,oracle")
  message(FATAL_ERROR "series.csv header: ${header}")
endif()
# --compare belongs to replay.
execute_process(COMMAND ${SIM} --compare RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--compare")
  message(FATAL_ERROR "spgate-sim --compare without replay: rc ${rc}, ${err}")
endif()
