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
          --compare_batches=${WORK}/batches.csv --summary_json=${WORK}/compare.json
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
if(NOT header STREQUAL "step,sp,tp_only,static,adaptive,oracle,expected_oracle")
  message(FATAL_ERROR "series.csv header: ${header}")
endif()
# --compare_batches: a header and one row per group-step (200 x 2).
file(STRINGS ${WORK}/batches.csv batches)
list(LENGTH batches rows)
list(GET batches 0 header)
string(CONCAT want "group,step,stage,microbatch,sequences,tokens,max_length,length_cv,band,"
       "sp_expected_s,tp_only_expected_s,sp_s,tp_only_s")
if(NOT header STREQUAL want OR NOT rows EQUAL 401)
  message(FATAL_ERROR "batches.csv: ${rows} lines, header ${header}")
endif()
# --compare_batches: a folder is refused before the run; a file that fills up is an error
# naming the flag and why, not a short CSV.
execute_process(COMMAND ${SIM} replay --steps=2 --compare --compare_batches=${WORK}
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--compare_batches=.* is a folder; give a file's path")
  message(FATAL_ERROR "--compare_batches into a folder: rc ${rc}, ${err}")
endif()
execute_process(COMMAND ${SIM} replay --steps=400 --groups=4 --compare
                        --compare_batches=/dev/full
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "cannot write --compare_batches=/dev/full: No space left")
  message(FATAL_ERROR "--compare_batches=/dev/full: rc ${rc}, ${err}")
endif()
# --compare_batches's folder is checked before the run.
execute_process(COMMAND ${SIM} replay --steps=2 --compare --compare_batches=${WORK}/none/b.csv
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--compare_batches=.*folder .* does not exist")
  message(FATAL_ERROR "--compare_batches into a missing folder: rc ${rc}, ${err}")
endif()
# --compare belongs to replay.
execute_process(COMMAND ${SIM} --compare RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--compare")
  message(FATAL_ERROR "spgate-sim --compare without replay: rc ${rc}, ${err}")
endif()
# Pipelines (docs/sim.md "Pipelines"): --pp=1 --microbatches=1 is today's comparison to the
# byte; --pp=4 --microbatches=8 adds the pipeline and per-stage fields; bad layouts exit 2
# naming the flag, and pipelines belong to replay --compare.
execute_process(
  COMMAND ${SIM} replay --lengths=bimodal:short=256,long=8000,p_long=0.4 --bucketing=false
          --steps=100 --groups=2 --compare --pp=1 --microbatches=1
          --summary_json=${WORK}/compare_pp1.json
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "replay --compare --pp=1 --microbatches=1 failed (${rc}):\n${err}")
endif()
execute_process(
  COMMAND ${SIM} replay --lengths=bimodal:short=256,long=8000,p_long=0.4 --bucketing=false
          --steps=100 --groups=2 --compare --summary_json=${WORK}/compare_plain.json
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
file(READ ${WORK}/compare_pp1.json pp1)
file(READ ${WORK}/compare_plain.json plain)
string(REGEX REPLACE "\"wall_s\": [0-9.e+-]+" "" pp1 "${pp1}")
string(REGEX REPLACE "\"wall_s\": [0-9.e+-]+" "" plain "${plain}")
if(NOT pp1 STREQUAL plain)
  message(FATAL_ERROR "--pp=1 --microbatches=1 changed the output:\n${pp1}\nvs\n${plain}")
endif()
execute_process(
  COMMAND ${SIM} replay --lengths=bimodal:short=512,long=12000,p_long=0.3 --bucketing=false
          --steps=30 --groups=2 --compare --pp=4 --microbatches=8 --device_memory_gib=24
          --summary_json=${WORK}/compare_pp4.json
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES "\\| TP-only share per stage \\|")
  message(FATAL_ERROR "replay --compare --pp=4 --microbatches=8 failed (${rc}):\n${err}")
endif()
file(READ ${WORK}/compare_pp4.json json)
string(JSON pp GET "${json}" compare pipeline pp)
string(JSON mb GET "${json}" compare pipeline microbatches)
if(NOT pp EQUAL 4 OR NOT mb EQUAL 8)
  message(FATAL_ERROR "compare.pipeline: pp ${pp}, microbatches ${mb}")
endif()
foreach(policy sp tp_only static adaptive oracle)
  string(JSON n LENGTH "${json}" compare ${policy} stages)
  if(NOT n EQUAL 4)
    message(FATAL_ERROR "compare.${policy}.stages has ${n} entries, want 4")
  endif()
  foreach(key ratio_to_best_fixed memory_forced_sp bubble_share p2p_bytes_per_step
              p2p_native_bytes_per_step)
    string(JSON value ERROR_VARIABLE jerr GET "${json}" compare ${policy} ${key})
    if(jerr)
      message(FATAL_ERROR "compare.${policy} lacks \"${key}\": ${jerr}")
    endif()
  endforeach()
endforeach()
# The summary's top-level keys are the static policy's: 2 replicas x 30 steps x 4 stages x
# 8 micro-batches of decisions.
string(JSON steps GET "${json}" steps)
if(NOT steps EQUAL 30)
  message(FATAL_ERROR "steps: ${steps}")
endif()
# wall_s is the command's (a pipeline's read 0.000: it was never set).
string(JSON wall GET "${json}" wall_s)
if(NOT wall GREATER 0)
  message(FATAL_ERROR "a pipeline's wall_s: ${wall}")
endif()
foreach(case "--pp=0;--pp: must be in" "--microbatches=0;--microbatches: must be in"
             "--vp=2;--vp: the 1F1B schedule" "--schedule=zb;--schedule=zb: want 1f1b or interleaved"
             "--schedule=interleaved;--vp: the interleaved schedule needs at least 2"
             "--schedule=interleaved_1f1b;--vp: the interleaved schedule needs at least 2")
  list(GET case 0 flag)
  list(GET case 1 want)
  execute_process(COMMAND ${SIM} replay --compare --steps=2 --pp=2 --microbatches=4 ${flag}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${want}")
    message(FATAL_ERROR "${flag}: rc ${rc}, ${err}")
  endif()
endforeach()
foreach(args "replay;--pp=2" "replay;--compare;--sweep;--microbatches=4" "--microbatches=4")
  execute_process(COMMAND ${SIM} ${args} --steps=2 RESULT_VARIABLE rc ERROR_VARIABLE err
                  OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "replay --compare` only")
    message(FATAL_ERROR "${args}: rc ${rc}, ${err}")
  endif()
endforeach()
# Regret per window (docs/sim.md, "Regret per window"): every policy of a plain and of a PP
# cell has the windowed keys; --switch_cost_s=0 is the default to the byte; bad
# --regret_window and --switch_cost_s exit 2 naming the flag.
foreach(cell "compare_plain" "compare_pp4")
  file(READ ${WORK}/${cell}.json json)
  foreach(policy sp tp_only static adaptive oracle)
    foreach(key regret_window_median regret_window_p95 regret_window_worst
                worst_window_vs_best_fixed oracle_agreement flips_per_1000_steps explore_share)
      string(JSON value ERROR_VARIABLE jerr GET "${json}" compare ${policy} ${key})
      if(jerr)
        message(FATAL_ERROR "${cell}: compare.${policy} lacks \"${key}\": ${jerr}")
      endif()
    endforeach()
  endforeach()
  string(JSON agreement GET "${json}" compare oracle oracle_agreement)
  string(JSON window GET "${json}" compare regret regret_window)
  if(NOT agreement EQUAL 1 OR NOT window EQUAL 1000)
    message(FATAL_ERROR "${cell}: oracle agreement ${agreement}, regret window ${window}")
  endif()
endforeach()
execute_process(
  COMMAND ${SIM} replay --lengths=bimodal:short=256,long=8000,p_long=0.4 --bucketing=false
          --steps=100 --groups=2 --compare --switch_cost_s=0
          --summary_json=${WORK}/compare_switch0.json
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES "\\| window regret % median \\|")
  message(FATAL_ERROR "replay --compare --switch_cost_s=0 failed (${rc}):\n${err}")
endif()
file(READ ${WORK}/compare_switch0.json switch0)
string(REGEX REPLACE "\"wall_s\": [0-9.e+-]+" "" switch0 "${switch0}")
if(NOT switch0 STREQUAL plain)
  message(FATAL_ERROR "--switch_cost_s=0 changed the output:\n${switch0}\nvs\n${plain}")
endif()
foreach(case "--regret_window=0;--regret_window must be >= 1"
             "--regret_window=-3;--regret_window must be >= 1"
             "--switch_cost_s=-0.5;--switch_cost_s must be a finite number"
             "--switch_cost_s=inf;--switch_cost_s must be a finite number"
             "--switch_cost_s=nan;--switch_cost_s must be a finite number")
  list(GET case 0 flag)
  list(GET case 1 want)
  foreach(cell "--steps=2" "--steps=2;--pp=2;--microbatches=4")
    execute_process(COMMAND ${SIM} replay --compare ${cell} ${flag}
                    RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
    if(NOT rc EQUAL 2 OR NOT err MATCHES "${want}")
      message(FATAL_ERROR "${flag} ${cell}: rc ${rc}, ${err}")
    endif()
  endforeach()
endforeach()
# Every command refuses a bad run shape, noise, pairing or output folder before it runs,
# naming the flag (it used to crash on --tp=0, run empty on --groups=0 or --steps=-1, name
# --lengths for --tokens_per_batch, ignore a pairing, and fail on --summary_json after the
# run); a --config mistake says where it is.
file(WRITE ${WORK}/bad.textproto "max_length_cv: 0.2\nmax_cv: 0.3\n")
foreach(case "--tp=0;--tp must be in \\[1, 1024\\], got 0"
             "--groups=0;--groups must be >= 1, got 0"
             "--steps=-1;--steps must be >= 0, got -1"
             "--tokens_per_batch=0;--tokens_per_batch must be >= 1, got 0"
             "--jitter=-0.1;--jitter must be a finite number >= 0"
             "--straggler_prob=2;--straggler_prob must be in \\[0, 1\\]"
             "--straggler_burst_every=-4;--straggler_burst_every and"
             "--hidden=-1;--hidden must be in \\[1, 1048576\\], got -1"
             "--layers=0;--layers must be in \\[1, 1024\\], got 0"
             "--layers=5000;--layers must be in \\[1, 1024\\], got 5000"
             "--heads=3;--hidden=5120 is not divisible by --heads=3"
             "--straggler_burst_steps=5;--straggler_burst_steps=5 needs --straggler_burst_every"
             "--straggler_burst_every=10;--straggler_burst_every=10 needs --straggler_burst_steps"
             "--threads=-1;--threads must be >= 0"
             "--compare_series=${WORK}/x.csv;--compare_series belongs to `spgate-sim replay --compare`"
             "--compare_batches=${WORK}/x.csv;--compare_batches belongs to `spgate-sim replay --compare`"
             "--sweep_max_length_cv=0.1:0.2:0.05;belong to `spgate-sim replay --sweep`"
             "--summary_json=${WORK}/none/s.json;--summary_json=.*folder .* does not exist"
             "--lengths=lognormal:mean=4096,sigma=0.8,sigma=2;sigma= is given twice"
             "--config=${WORK}/bad.textproto;line 2 column 7: .*no field named \"max_cv\"")
  list(GET case 0 flag)
  list(GET case 1 want)
  execute_process(COMMAND ${SIM} replay --steps=2 ${flag}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${want}")
    message(FATAL_ERROR "replay ${flag}: rc ${rc}, ${err}")
  endif()
endforeach()
execute_process(COMMAND ${SIM} replay --compare --steps=2 --compare_window=-3
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--compare_window must be >= 0")
  message(FATAL_ERROR "--compare_window=-3: rc ${rc}, ${err}")
endif()
execute_process(COMMAND ${SIM} --steps=2 replay RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "replay, comes first")
  message(FATAL_ERROR "a subcommand after the flags: rc ${rc}, ${err}")
endif()
# A live run's deadline is its own flag's (it named the client's decision_deadline).
execute_process(COMMAND ${SIM} --steps=2 --deadline=-1ms RESULT_VARIABLE rc ERROR_VARIABLE err
                OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--deadline must be >= 0")
  message(FATAL_ERROR "--deadline=-1ms: rc ${rc}, ${err}")
endif()
# A TP degree past the preset's measured curves runs, and says which curve it used.
execute_process(COMMAND ${SIM} replay --steps=2 --groups=1 --tp=16
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES "--tp=16 uses the 8-rank curves")
  message(FATAL_ERROR "--tp=16: rc ${rc}, ${err}")
endif()
# Shapes and bursts that cannot be meant exit 2 naming the flags (they ran as if given
# otherwise); heads that do not split over the ranks run with flash attention, which reads
# no head count, and say so.
foreach(case "--heads=20 --flash_attention=false;--heads=20 is not divisible by --tp=8"
             "--straggler_burst_steps=20 --straggler_burst_every=10;--straggler_burst_steps=20 must be less than --straggler_burst_every=10")
  list(GET case 0 flags)
  list(GET case 1 want)
  separate_arguments(flags)
  execute_process(COMMAND ${SIM} replay --steps=2 ${flags}
                  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
  if(NOT rc EQUAL 2 OR NOT err MATCHES "${want}")
    message(FATAL_ERROR "replay ${flags}: rc ${rc}, ${err}")
  endif()
endforeach()
execute_process(COMMAND ${SIM} replay --steps=1 --groups=1 --heads=20
                RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES "note: --heads=20 is not divisible by --tp=8")
  message(FATAL_ERROR "--heads=20 with flash attention: rc ${rc}, ${err}")
endif()
# The human line counts in the singular where it is one.
if(NOT err MATCHES "spgate-sim replay: 1 group x 8 ranks, 1 step each, [0-9.]+ s wall, 1 thread\n")
  message(FATAL_ERROR "the summary line: ${err}")
endif()
# A sweep says which grid values it skipped and why; an axis left with none exits 2 naming
# its flag (it was "the sweep grid has no valid config").
execute_process(
  COMMAND ${SIM} replay --steps=5 --groups=1 --sweep --sweep_max_length_cv=0.2:0.2:0.1
          --sweep_max_rs_wait_share=0.01:0.05:0.01 --summary_json=${WORK}/sweep_skip.json
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 0 OR NOT err MATCHES
   "note: --sweep_max_rs_wait_share=0.01:0.05:0.01: skipping 0.01, 0.02, 0.03 \\(rs_wait_reenable_margin \\(0.03\\) must be less than max_rs_wait_share")
  message(FATAL_ERROR "a sweep with skipped values: rc ${rc}, ${err}")
endif()
file(READ ${WORK}/sweep_skip.json json)
string(JSON n LENGTH "${json}" sweep)
if(NOT n EQUAL 2)
  message(FATAL_ERROR "the sweep ran ${n} points, want 2 (max_rs_wait_share 0.04, 0.05)")
endif()
execute_process(
  COMMAND ${SIM} replay --steps=5 --groups=1 --sweep --sweep_max_rs_wait_share=0.01:0.02:0.01
  RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(NOT rc EQUAL 2 OR NOT err MATCHES "--sweep_max_rs_wait_share=0.01:0.02:0.01: no value on the grid")
  message(FATAL_ERROR "a sweep axis without a valid value: rc ${rc}, ${err}")
endif()
