#!/usr/bin/env python3
"""Tests mirror the source tree (docs/design.md §8): every unit of a source folder has its
test beside the folder's mirror under tests/, or an entry below that says which test
covers it and why it has none of its own.

A unit is a .cc or .cu file's stem (in kernels/, `x_ref.cc`, `x_cpu.cc` and `x.cu` are the
one op `x`, as docs/design.md §8 lays kernels out); its test is tests/<folder>/<unit>_test.cc
or <unit>_test.py. The check fails, naming each, on
  - a unit with neither a test nor an exception;
  - a source file in a folder this check does not know (add the folder to SOURCE_FOLDERS
    or NOT_SOURCE);
  - an exception that no longer holds: its unit has gone or now has its own test, or the
    test it names as covering it does not exist;
Pure file listing, no build; run as ctest `tree_mirror_test` (label `layout`) or directly:
`python3 tests/tree_mirror_test.py [--root=DIR]` (another checkout, e.g. to try the check).
"""
import argparse
import os
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))

# Folders whose .cc/.cu files are units, each mirrored by tests/<folder>.
SOURCE_FOLDERS = [
    "common", "policy", "proto", "server", "kernels", "kernels/internal", "worker",
    "worker/client", "worker/runtime", "tools/sim", "tools/spgatectl", "python",
]

# Top-level folders with C++ that is not a unit to mirror.
NOT_SOURCE = {
    "tests": "the tests themselves",
    "bench": "benchmarks, outside the default ctest run; bench/ checks its own drivers",
    "examples": "example programs, run by tests/python/torch_example_test.py",
}

# Units with no test of their own: unit path -> (the test that covers it, why).
EXCEPTIONS = {
    # tools/sim/sweep: the replay sweep, split out of sim.cc for its length; its tests are
    # sim.cc's (SimSweepTest) and the CLI's sweep cases.
    "tools/sim/sweep.cc": ("tests/tools/sim/sim_test.cc",
                           "the sweep replays through sim.cc's Replay; tested with it"),
    # policy/band_pool: tested beside the ADAPTIVE policy that consults it, with the same
    # noisy-table helpers.
    "policy/band_pool.cc": ("tests/policy/adaptive_policy_test.cc",
                            "PoolBandsTest; the pooled departure through EvaluateAdaptive"),
    # policy/throughput_table: ADAPTIVE's learned table, declared with the policy in
    # adaptive_policy.h and tested beside it.
    "policy/throughput_table.cc": ("tests/policy/adaptive_policy_test.cc",
                                   "ThroughputTableTest: sums, forgetting, change detection, "
                                   "the switch cost; the pairs in paired_evidence_test.cc"),
    # policy/exploration: the schedule EvaluateAdaptive follows, tested through it with the
    # same tables (ExplorationRisesAfterAChange..., ARareLearningBandExploresAtTheFloor).
    "policy/exploration.cc": ("tests/policy/adaptive_policy_test.cc",
                              "ExploreShareOf, BandTrafficShare, ExplorePeriod, MayExplore "
                              "and the probes EvaluateAdaptive makes from them"),
    # common/cli: the four binaries' --help and --version, which only a built binary shows.
    "common/cli.cc": ("tests/tools/spgatectl/cli_conventions_test.py",
                      "--help lists each binary's own flags, --version its version (all four)"),
    # tools/spgatectl/: the parser's tables and writers, tested through the parser and the
    # formatters that use them.
    "tools/spgatectl/command_table.cc": ("tests/tools/spgatectl/commands_test.cc",
                                         "the command table through ParseCommandLine: help, "
                                         "did-you-mean, every command's flags"),
    "tools/spgatectl/completion.cc": ("tests/tools/spgatectl/commands_test.cc",
                                      "CompletionCoversTheCommandTable; run as bash would in "
                                      "cli_conventions_test.py"),
    "tools/spgatectl/yaml.cc": ("tests/tools/spgatectl/format_test.cc",
                                "YamlIsTheJsonDocument and the YAML cases: -o yaml of every "
                                "formatter"),
    # server/: GateState is one class over four files, tested as one.
    "server/gate_state_sessions.cc": ("tests/server/gate_state_test.cc",
                                      "GateState's sessions, launches and sweep (the same class)"),
    "server/gate_state_learned.cc": ("tests/server/gate_state_test.cc",
                                     "GateState's throughput learning (the same class)"),
    "server/gate_state_views.cc": ("tests/server/gate_state_test.cc",
                                   "GateState's read views (the same class)"),
    "server/audit_log.cc": ("tests/server/operator_store_test.cc",
                            "the store's audit log: every change's entry, history, rollback"),
    "server/persistence.cc": ("tests/server/operator_store_test.cc",
                              "the state file through the store: restart, corrupt files, "
                              "stale temp files; also tests/fuzz/state_file_fuzz.cc"),
    "server/identity.cc": ("tests/server/gate_state_test.cc",
                           "incarnation, launch-credential and session-id rules, through "
                           "Register"),
    "server/raw_service.cc": ("tests/server/daemon_test.cc",
                              "raw-stream methods only exist in a running server: requests "
                              "that do not parse, calls that never send one, every RPC of "
                              "both services through a real daemon"),
    "server/job_views.cc": ("tests/server/gate_state_test.cc",
                            "proto <-> domain for the admin views, through state_harness.h "
                            "and the real services in daemon_test.cc"),
    "server/metrics.cc": ("tests/server/daemon_test.cc",
                          "the families, scraped from a real daemon's /metrics"),
    "server/services.cc": ("tests/server/daemon_test.cc",
                           "the gRPC services and stream reactors, on a real daemon on port 0"),
    "server/main.cc": ("tests/server/spgated_reload_test.py",
                       "spgated's flags and signals, through the real binary"),
    # policy/
    "policy/gate_config.cc": ("tests/policy/validate_gate_config_test.cc",
                              "the gate field table's validation and layering"),
    # kernels/
    "kernels/device_memory.cc": ("tests/gpu/device_memory_gpu_test.cc", "needs a device"),
    "kernels/linear_args.cc": ("tests/kernels/gemm_test.cc",
                               "the Linear products' GEMM mapping and argument checks"),
    "kernels/internal/cuda_common.cu": ("tests/gpu/gemm_gpu_test.cc",
                                        "cuBLAS status conversion and the ordered column "
                                        "reductions, on a device (all tests/gpu)"),
    # python/
    "python/spgate_module.cc": ("tests/python/client_test.py",
                                "the pybind module, driven from Python"),
    "python/bind_types.cc": ("tests/python/client_test.py",
                             "the module's value types, driven from Python"),
    "python/bind_client.cc": ("tests/python/client_test.py",
                              "spgate.Client, driven from Python (keywords: "
                              "stub_check_test.py)"),
    "python/bind_group_decider.cc": ("tests/python/group_decider_test.py",
                                     "spgate.GroupDecider over gloo, driven from Python"),
    # tools/
    "tools/sim/compare.cc": ("tests/tools/sim/sim_test.cc",
                             "the decision-quality comparison, over simulator runs"),
    "tools/sim/compare_report.cc": ("tests/tools/sim/compare_plot_test.cc",
                                    "the comparison's JSON and CSV, read from a compared cell "
                                    "(also pipeline_test.cc, bench_drivers_test.py)"),
    "tools/sim/summary.cc": ("tests/tools/sim/sim_test.cc",
                             "the simulator's summary, read back from its runs"),
    "tools/sim/main.cc": ("tests/tools/sim/cli_replay_test.cmake",
                          "spgate-sim's command line, through the real binary"),
    "tools/spgatectl/main.cc": ("tests/tools/spgatectl/spgatectl_e2e_test.cc",
                                "the real spgatectl against a real daemon"),
    # worker/
    "worker/main.cc": ("tests/worker/runtime/worker_cli_test.py",
                       "spgate-worker's flags, through the real binary"),
    # worker/client/
    "worker/client/client_runtime.cc": ("tests/worker/client/gate_client_test.cc",
                                        "GateClient's timer thread, through GateClient"),
    "worker/client/gate_client_stream.cc": ("tests/worker/client/gate_client_test.cc",
                                            "GateClient's connection and writes, through "
                                            "GateClient (and gate_client_protocol_test.cc)"),
    "worker/client/in_memory_broadcast.cc": ("tests/worker/client/group_decider_test.cc",
                                             "the broadcast GroupDecider's tests run over"),
    "worker/client/spgate_client.cc": ("tests/worker/client/c_api_test.cc", "the C API"),
    "worker/client/tls_flags.cc": ("tests/integration/tls_clients_test.py",
                                   "the clients' TLS flags, through the real binaries"),
    "worker/client/wire.cc": ("tests/worker/client/gate_client_test.cc",
                              "channel and messages, through GateClient against a server"),
    # worker/runtime/: the communicators and devices need ranks or a GPU.
    "worker/runtime/communicator.cc": ("tests/worker/runtime/transformer_stack_test.cc",
                                       "the one-rank communicator the tp = 1 stack runs on; "
                                       "the statistics also in worker_runtime_mpi_test.cc"),
    "worker/runtime/mpi_communicator.cc": ("tests/worker/runtime/worker_runtime_mpi_test.cc",
                                           "needs MPI ranks: runs under mpirun (label mpi)"),
    "worker/runtime/cpu_device.cc": ("tests/worker/runtime/memory_arena_test.cc",
                                     "the CPU device under the arena and every CPU stack test"),
    "worker/runtime/cuda_device.cc": ("tests/worker/runtime/worker_runtime_gpu_test.cc",
                                      "needs a device (label gpu)"),
    "worker/runtime/nccl_communicator.cc": ("tests/worker/runtime/worker_runtime_gpu_test.cc",
                                            "needs devices (label gpu)"),
    "worker/runtime/cuda_stub.cc": ("tests/worker/runtime/worker_runtime_gpu_test.cc",
                                    "a build without CUDA: one UNIMPLEMENTED, which the GPU "
                                    "test's skip reads"),
    "worker/runtime/nccl_stub.cc": ("tests/worker/runtime/worker_runtime_gpu_test.cc",
                                    "a build without NCCL: one UNIMPLEMENTED"),
    # worker/runtime/: worker.h's API over three files, tested as one.
    "worker/runtime/worker_options.cc": ("tests/worker/runtime/worker_test.cc",
                                         "ValidateWorkerOptions' refusals; DescribeRun "
                                         "through the summary's layout in pipeline_test.py"),
    "worker/runtime/launch_agreement.cc": ("tests/worker/runtime/worker_runtime_mpi_test.cc",
                                           "AgreeOnLaunch is collective: AgreeOnLaunchTest "
                                           "under mpirun (label mpi)"),
}

KERNEL_SUFFIXES = ("_ref", "_cpu")


def units(folder):
    """{unit: [source files]} for the .cc/.cu files directly in folder."""
    out = {}
    for name in sorted(os.listdir(os.path.join(ROOT, folder))):
        stem, ext = os.path.splitext(name)
        if ext not in (".cc", ".cu"):
            continue
        unit = stem
        if folder == "kernels":
            for suffix in KERNEL_SUFFIXES:
                if unit.endswith(suffix):
                    unit = unit[: -len(suffix)]
        out.setdefault(unit, []).append(f"{folder}/{name}")
    return out


def exists(path):
    return os.path.exists(os.path.join(ROOT, path))


def unknown_folders():
    """Folders with .cc/.cu files that are neither in SOURCE_FOLDERS nor under NOT_SOURCE."""
    found = []
    for dirpath, dirnames, filenames in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        # Hidden folders, build trees and the not-source folders are not walked.
        dirnames[:] = [d for d in dirnames if not d.startswith(".")
                       and not os.path.exists(os.path.join(dirpath, d, "CMakeCache.txt"))
                       and not (rel == "." and d in NOT_SOURCE)]
        if rel == "." or rel in SOURCE_FOLDERS:
            continue
        if any(f.endswith((".cc", ".cu")) for f in filenames):
            found.append(rel)
    return found


def problems():
    out = []
    for folder in unknown_folders():
        out.append(f"{folder}/: C++ sources in a folder the check does not know; add it to "
                   "SOURCE_FOLDERS (and give its units tests) or to NOT_SOURCE with a reason")
    seen_exceptions = set()
    for folder in SOURCE_FOLDERS:
        if not exists(folder):
            out.append(f"{folder}/: listed in SOURCE_FOLDERS but missing")
            continue
        mirror = f"tests/{folder}"
        for unit, sources in units(folder).items():
            tests = [f"{mirror}/{unit}_test{ext}" for ext in (".cc", ".py")]
            has_test = any(exists(t) for t in tests)
            excepted = [s for s in sources if s in EXCEPTIONS]
            seen_exceptions.update(excepted)
            if has_test:
                for s in excepted:
                    out.append(f"{s}: has its own test now; drop its entry in EXCEPTIONS")
            elif not excepted:
                out.append(f"{', '.join(sources)}: no {tests[0]} (or .py); write it, or add "
                           "an entry to EXCEPTIONS naming the test that covers it and why")
    for source, (covering, _why) in EXCEPTIONS.items():
        if source not in seen_exceptions:
            out.append(f"{source}: in EXCEPTIONS but not a unit of a SOURCE_FOLDERS folder "
                       "(gone or moved); drop or fix the entry")
        if not exists(covering):
            out.append(f"{source}: EXCEPTIONS names {covering} as its test, which does not "
                       "exist")
    return out


def main():
    global ROOT
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--root", default=ROOT, help="the source tree to check")
    ROOT = os.path.abspath(parser.parse_args().root)
    found = problems()
    for p in found:
        print(f"tree_mirror_test: {p}")
    if found:
        print(f"tree_mirror_test: {len(found)} problem(s); tests mirror the source tree "
              "(docs/design.md §8)")
        return 1
    print("tree_mirror_test: every unit has its test beside its mirror or a named exception")
    return 0


if __name__ == "__main__":
    sys.exit(main())
