/* spgate worker client, C API: for trainers that are not C++ (Python via ctypes,
 * PyTorch extensions). A thin layer over spgate::client::GateClient and GroupDecider
 * (gate_client.h, group_decider.h) with the same semantics: plans and telemetry only
 * queue; a decision never takes longer than its deadline, falling back to the local
 * policy (reason SPGATE_REASON_CONTROLLER_UNAVAILABLE) when the daemon is late or away;
 * spgate_decider_decide gives every rank of a TP group the same decision through the
 * broadcast callback you provide.
 *
 * One session per TP group (option group_session, the default): only the group's leader
 * (rank_in_group 0) creates a client; the other ranks create none (spgate_client_create
 * refuses a follower with a controller and group_session) and make their decider with
 * client NULL. Every rank gives its own telemetry to spgate_decider_report_telemetry,
 * which reduces it in the group with your max-reduce callback (spgate_decider_create_group)
 * into the leader, which sends one record per step for the group. With
 * spgate_options_set(o, "group_session", "false") every rank has a client and a session
 * of its own and reports its own records (per-rank sessions).
 *
 * Errors: every function that can fail returns an spgate_status (0 = OK; otherwise the
 * absl/gRPC status code) and sets a per-thread message readable with
 * spgate_last_error(). Handles are opaque; each *_create has a matching *_destroy.
 * Thread-safety: as in C++ — a client may be used from several threads; a decider
 * belongs to one rank's training thread. Built as libspgate_client.so.
 *
 * Usage:
 *   spgate_options* o = spgate_options_create();
 *   spgate_options_set(o, "controller", "127.0.0.1:50061");
 *   spgate_options_set(o, "job_id", "demo");
 *   spgate_options_set(o, "incarnation", run_id);          equal on every rank
 *   char cred[SPGATE_LAUNCH_CREDENTIAL_BUFFER];
 *   spgate_new_launch_credential(cred, sizeof(cred));      world rank 0, then broadcast
 *   spgate_options_set(o, "launch_credential", cred);
 *   spgate_client* c;
 *   if (spgate_client_create(o, &c) != SPGATE_OK) puts(spgate_last_error());
 *   spgate_options_destroy(o);
 *   int64_t lengths[] = {4096, 4000, 4100};
 *   spgate_client_submit_plan(c, 1, lengths, 3, 0, 0, 0);
 *   spgate_decision d;
 *   spgate_client_await_decision(c, 1, 20000, &d);   // 20 ms
 *   spgate_client_destroy(c);
 *
 * A TP group (one thread or process per rank; `leader` = rank_in_group == 0):
 *   spgate_client* c = NULL;
 *   if (leader) spgate_client_create(o, &c);          followers: no client
 *   spgate_decider* d;
 *   spgate_decider_create_group(c, rank_in_group, my_bcast, my_reduce_max, comm, &d);
 *   spgate_decider_submit_plan(d, n + 1, next, k, 0, 0, 0);   no-op on followers
 *   spgate_decider_decide(d, n, -1, &dec);            every rank
 *   ... run step n ...
 *   spgate_telemetry t = {.step = n, .mode = dec.mode, .reason = dec.reason, ...};
 *   spgate_decider_report_telemetry(d, &t);           every rank: one record for the group
 *
 * A pipeline stage's TP group (docs/design.md §12): the layout and coordinates on the
 * options, one step plan per step with every micro-batch, a decision per micro-batch:
 *   spgate_options_set_layout(o, &layout, &at);
 *   spgate_decider_submit_step_plan(d, n + 1, mbs, m, resident, budget);   leader only
 *   spgate_decider_decide_microbatches(d, n, -1, &dec, md, m, NULL);       every rank
 */
#ifndef SPGATE_WORKER_CLIENT_SPGATE_CLIENT_H_
#define SPGATE_WORKER_CLIENT_SPGATE_CLIENT_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define SPGATE_EXPORT __attribute__((visibility("default")))
#else
#define SPGATE_EXPORT
#endif

typedef int32_t spgate_status;
enum {
  SPGATE_OK = 0,
  SPGATE_INVALID_ARGUMENT = 3,
  SPGATE_DEADLINE_EXCEEDED = 4,
  SPGATE_NOT_FOUND = 5,
  SPGATE_ALREADY_EXISTS = 6,
  SPGATE_PERMISSION_DENIED = 7,
  SPGATE_FAILED_PRECONDITION = 9,
  SPGATE_UNIMPLEMENTED = 12,
  SPGATE_INTERNAL = 13,
  SPGATE_UNAVAILABLE = 14,
  SPGATE_UNAUTHENTICATED = 16
};

/* Values match spgate.v1.Mode / spgate.v1.Reason. */
enum { SPGATE_MODE_SEQUENCE_PARALLEL = 1, SPGATE_MODE_TENSOR_PARALLEL_ONLY = 2 };
enum {
  SPGATE_REASON_GATES_PASSED = 1,
  SPGATE_REASON_LENGTH_CV = 2,
  SPGATE_REASON_RS_WAIT = 3,
  SPGATE_REASON_PROBE = 4,
  SPGATE_REASON_MEMORY_REQUIRES_SP = 5,
  SPGATE_REASON_MEMORY_OVER_BUDGET = 6,
  SPGATE_REASON_PINNED = 7,
  SPGATE_REASON_CONTROLLER_UNAVAILABLE = 8,
  SPGATE_REASON_ADAPTIVE = 9,
  SPGATE_REASON_LENGTHS_UNKNOWN = 10,
  SPGATE_REASON_SP_REQUIRED = 11
};
/* MEMORY_OVERRIDE: the daemon said TP-only, the worker's memory gate forbade it, SP ran. */
enum {
  SPGATE_SOURCE_DAEMON = 1,
  SPGATE_SOURCE_FALLBACK = 2,
  SPGATE_SOURCE_LOCAL_ONLY = 3,
  SPGATE_SOURCE_MEMORY_OVERRIDE = 4
};

/* Bytes spgate_new_launch_credential needs: 32 hex digits and the NUL. */
enum { SPGATE_LAUNCH_CREDENTIAL_BUFFER = 33 };

typedef struct spgate_decision {
  int64_t step;
  int64_t config_version;
  int32_t mode;
  int32_t reason;        /* as run and reported */
  int32_t policy_reason; /* the gate that decided */
  int32_t source;
} spgate_decision;

typedef struct spgate_telemetry {
  int64_t step;
  int32_t mode;
  int32_t reason;
  double step_time_s;
  double rs_wait_s;
  double all_gather_s;
  double norm_stall_s;
  int64_t effective_tokens;
  int64_t padding_tokens;
  uint64_t peak_memory_bytes;
  /* Inside all-reduce calls (TP-only's): the straggler rule (docs/design.md §11) reads a
   * TP-only step's stragglers from it; leave it 0 and the rule stays off for the job. */
  double all_reduce_s;
} spgate_telemetry;

typedef struct spgate_client_stats {
  int32_t connected;
  int64_t registrations;
  int64_t daemon_decisions;
  int64_t local_decisions;
  int64_t late_decisions;
  int64_t telemetry_reported;
  int64_t telemetry_sent;
  int64_t telemetry_acked;
  int64_t telemetry_dropped;
  /* Appended (earlier fields keep their offsets): */
  int64_t memory_overrides; /* daemon TP-only answers the memory gate forbade; SP ran */
  int32_t session_replaced; /* 1: another process holds this rank's seat; all local now */
} spgate_client_stats;

/* Pipelined jobs (docs/design.md §12). The job's shape, the same on every rank; schedule
 * is SPGATE_SCHEDULE_1F1B (vp 1) or SPGATE_SCHEDULE_INTERLEAVED_1F1B (vp >= 2). tp must
 * be the option group_size, and the option group (dp_index * pp + stage) * cp + cp_rank. */
enum { SPGATE_SCHEDULE_1F1B = 0, SPGATE_SCHEDULE_INTERLEAVED_1F1B = 1 };
typedef struct spgate_layout {
  int32_t tp, pp, vp, cp, dp;
  int32_t microbatches; /* per optimizer step */
  int32_t schedule;
} spgate_layout;
/* Where this rank's TP group sits in the layout. */
typedef struct spgate_stage_coordinates {
  int32_t dp_index, stage, cp_rank;
} spgate_stage_coordinates;

/* One micro-batch of a step plan: its id (0 .. microbatches - 1, any order), its lengths
 * (count 0: this stage does not know them, and the micro-batch runs SP with reason
 * SPGATE_REASON_LENGTHS_UNKNOWN) and what it costs this stage in each mode: the
 * activations it keeps for its backward and the workspace of one forward or backward. */
typedef struct spgate_microbatch_plan {
  int32_t id;
  const int64_t* lengths;
  size_t count;
  uint64_t activation_sp, activation_tp;
  uint64_t workspace_sp, workspace_tp;
} spgate_microbatch_plan;

/* A step plan's decision for one micro-batch. */
typedef struct spgate_microbatch_decision {
  int32_t mode;
  int32_t reason;
} spgate_microbatch_decision;

typedef struct spgate_options spgate_options;
typedef struct spgate_client spgate_client;
typedef struct spgate_decider spgate_decider;

/* Broadcast `size` bytes at `buf` from rank `root` of the TP group; on the other ranks
 * overwrite `buf` with the root's bytes. Return 0 on success. One call per decision:
 * `size` is 24 (the decision's head) plus, for a step plan, one byte per micro-batch
 * (spgate_decider_decide_microbatches); every rank calls with the same size. */
typedef int32_t (*spgate_broadcast_fn)(void* buf, size_t size, int32_t root, void* user_data);

/* Element-wise maximum of `count` doubles at `values` over the ranks of the TP group into
 * rank `root`'s `values` (MPI_Reduce with MPI_MAX, or an all-reduce with MAX: the other
 * ranks' values may be left as they were). One call per step's telemetry: count is 16 (the
 * 128-byte in-group payload, TelemetryWire in group_decider.h) plus, after a step plan,
 * 8 per micro-batch, then one per rank of the group (its busy time) and, while
 * micro-batches x ranks is at most 4,096, one per rank per micro-batch; every rank calls
 * with the same count, and only the leader decodes the result. Return 0 on success. */
typedef int32_t (*spgate_reduce_max_fn)(double* values, size_t count, int32_t root,
                                        void* user_data);

/* The message of the last failed call on this thread ("" if none). Valid until the next
 * spgate call on this thread. */
SPGATE_EXPORT const char* spgate_last_error(void);
SPGATE_EXPORT const char* spgate_version(void);
SPGATE_EXPORT const char* spgate_mode_name(int32_t mode);     /* "sp", "tp_only" */
SPGATE_EXPORT const char* spgate_reason_name(int32_t reason); /* "gates_passed", ... */

/* A new launch credential (128 bits from the kernel's random source, 32 hex digits and a
 * NUL) into `buf` of `size` >= SPGATE_LAUNCH_CREDENTIAL_BUFFER bytes. World rank 0 makes
 * one and broadcasts it over the job's communicator; every rank sets it as the option
 * "launch_credential". */
SPGATE_EXPORT spgate_status spgate_new_launch_credential(char* buf, size_t size);

/* Options, by name: every row of the client's option table (worker/client/client_options.h,
 * SPGATE_CLIENT_OPTIONS) exposed to the C API — controller, job_id, incarnation (one launch
 * of the job, equal on every rank; required with a controller), launch_credential (the
 * launch's secret, 16-128 printable ASCII characters, equal on every rank; required with a
 * controller), worker_token, group,
 * rank_in_group, group_size, global_rank, group_session ("true", the default: the leader's
 * session speaks for the group and the other ranks create no client; "false": a session
 * per rank), host, memory_budget_bytes, telemetry_buffer,
 * seed, the model's layers, hidden, heads, ffn_hidden, and the durations as integer
 * milliseconds: decision_deadline_ms, rpc_timeout_ms, initial_backoff_ms, max_backoff_ms —
 * every GateConfig field of the initial config (max_length_cv, ...), and TLS as
 * spgate-worker's flags: tls_ca (PEM roots; turns TLS on), tls_cert + tls_key (client
 * certificate for mTLS; together), tls_server_name (name checked in the daemon's
 * certificate). The TLS files are read by spgate_client_create, which refuses a cert
 * without its key or an unreadable or empty file with SPGATE_INVALID_ARGUMENT naming the
 * option. */
SPGATE_EXPORT spgate_options* spgate_options_create(void);
SPGATE_EXPORT spgate_status spgate_options_set(spgate_options* options, const char* name,
                                               const char* value);
/* A pipelined job: the layout and this rank's coordinates (checked by
 * spgate_client_create: the layout valid, tp = group_size, group = the coordinates'
 * group, INVALID_ARGUMENT naming the field otherwise). With a layout the leader submits
 * step plans (spgate_client_submit_step_plan) and gets a decision per micro-batch. */
SPGATE_EXPORT spgate_status spgate_options_set_layout(spgate_options* options,
                                                      const spgate_layout* layout,
                                                      const spgate_stage_coordinates* at);
/* A feature this rank runs that needs SP for the whole job ([a-z0-9_], at most 8): every
 * decision is then SP with reason SPGATE_REASON_SP_REQUIRED. Call once per feature. */
SPGATE_EXPORT spgate_status spgate_options_add_sp_required(spgate_options* options,
                                                           const char* feature);
SPGATE_EXPORT void spgate_options_destroy(spgate_options* options);

SPGATE_EXPORT spgate_status spgate_client_create(const spgate_options* options,
                                                 spgate_client** out);
SPGATE_EXPORT void spgate_client_destroy(spgate_client* client);
SPGATE_EXPORT spgate_status spgate_client_submit_plan(spgate_client* client, int64_t step,
                                                      const int64_t* lengths, size_t count,
                                                      uint64_t predicted_peak_bytes_sp,
                                                      uint64_t predicted_peak_bytes_tp,
                                                      uint64_t memory_budget_bytes);
/* timeout_us < 0: the client's decision_deadline. The head only:
 * spgate_client_await_microbatches with count 0. */
SPGATE_EXPORT spgate_status spgate_client_await_decision(spgate_client* client, int64_t step,
                                                         int64_t timeout_us,
                                                         spgate_decision* out);
/* A step plan (a client with a layout): one entry per micro-batch of the step, the
 * stage's resident bytes (parameters, gradients, optimizer state) and the memory budget
 * (0: the option memory_budget_bytes). Refused naming the id when ids repeat or skip. */
SPGATE_EXPORT spgate_status spgate_client_submit_step_plan(spgate_client* client, int64_t step,
                                                           const spgate_microbatch_plan* mbs,
                                                           size_t count, uint64_t resident_bytes,
                                                           uint64_t memory_budget_bytes);
/* A decision: `out` its head (for a step plan micro-batch 0's mode and reason), and the
 * decision of each of its `count` micro-batches by id in `mbs` (count must be the step's
 * micro-batches, the layout's; 0: the head only, as for a plain plan); `stage_peak_bytes`
 * (may be NULL): the stage's predicted peak with those modes. */
SPGATE_EXPORT spgate_status spgate_client_await_microbatches(
    spgate_client* client, int64_t step, int64_t timeout_us, spgate_decision* out,
    spgate_microbatch_decision* mbs, size_t count, uint64_t* stage_peak_bytes);
/* spgate_client_report_step_telemetry with no micro-batches. */
SPGATE_EXPORT spgate_status spgate_client_report_telemetry(spgate_client* client,
                                                           const spgate_telemetry* telemetry);
/* GateClient::ObserveGroupRsWaitShare: SPGATE_INVALID_ARGUMENT naming share unless it is
 * in [0, 1], or naming mode unless it is 1 (SP) or 2 (TP-only). */
SPGATE_EXPORT spgate_status spgate_client_observe_group_rs_wait(spgate_client* client,
                                                                int64_t step, int32_t mode,
                                                                double share);
/* GateClient::Flush and WaitUntilConnected (docs/client.md): SPGATE_DEADLINE_EXCEEDED when
 * the timeout passes; SPGATE_PERMISSION_DENIED or SPGATE_UNAUTHENTICATED at once while the
 * daemon refuses this client's credential, SPGATE_INVALID_ARGUMENT at once while it
 * refuses a field of its Register, SPGATE_UNIMPLEMENTED at once while the controller
 * address answers without spgated's worker API (spgate_last_error says which). */
SPGATE_EXPORT spgate_status spgate_client_flush(spgate_client* client, int64_t timeout_ms);
SPGATE_EXPORT spgate_status spgate_client_wait_connected(spgate_client* client,
                                                         int64_t timeout_ms);
SPGATE_EXPORT spgate_status spgate_client_get_stats(spgate_client* client,
                                                    spgate_client_stats* out);

/* spgate_decider_create_group without a max-reduce. client: required on rank 0 of the
 * group, may be NULL elsewhere. The callback is called from spgate_decider_decide and
 * spgate_decider_decide_microbatches on the calling thread. Without a max-reduce: for a
 * leader whose client speaks for a group of more than one rank with a controller
 * (group_session, the default) this is SPGATE_INVALID_ARGUMENT; use
 * spgate_decider_create_group, or group_session "false". */
SPGATE_EXPORT spgate_status spgate_decider_create(spgate_client* client, int32_t rank_in_group,
                                                  spgate_broadcast_fn broadcast,
                                                  void* user_data, spgate_decider** out);
/* A decider whose spgate_decider_report_telemetry reduces the group's telemetry with
 * `reduce` into the leader's client (group session). client: required on rank 0; NULL
 * elsewhere in a group session; with per-rank sessions (group_session "false") each
 * rank's own client, and `reduce` NULL. `reduce` is required when the leader's client has
 * group_session, group_size > 1 and a controller, and must then be given on every rank;
 * with a leader whose group_session is "false" it is SPGATE_INVALID_ARGUMENT. Both
 * callbacks get `user_data` and are called on the calling thread: broadcast from
 * spgate_decider_decide(_microbatches) and here, reduce from
 * spgate_decider_report(_step)_telemetry. Collective, like spgate_decider_create: every rank
 * of the group calls it; each checks its own arguments and the leader broadcasts its
 * outcome (256 bytes), so a leader's refusal fails every rank with the leader's status and
 * message, and a follower whose rank or max-reduce disagrees with the leader's fails.
 * A follower's own refusal (or a NULL `out`) is its alone; a rank without `broadcast`
 * cannot take part. */
SPGATE_EXPORT spgate_status spgate_decider_create_group(spgate_client* client,
                                                        int32_t rank_in_group,
                                                        spgate_broadcast_fn broadcast,
                                                        spgate_reduce_max_fn reduce,
                                                        void* user_data, spgate_decider** out);
SPGATE_EXPORT void spgate_decider_destroy(spgate_decider* decider);
SPGATE_EXPORT spgate_status spgate_decider_submit_plan(spgate_decider* decider, int64_t step,
                                                       const int64_t* lengths, size_t count,
                                                       uint64_t predicted_peak_bytes_sp,
                                                       uint64_t predicted_peak_bytes_tp,
                                                       uint64_t memory_budget_bytes);
/* Collective over the group; timeout_us as in spgate_client_await_decision. The head only:
 * spgate_decider_decide_microbatches with count 0. */
SPGATE_EXPORT spgate_status spgate_decider_decide(spgate_decider* decider, int64_t step,
                                                  int64_t timeout_us, spgate_decision* out);
/* Step plans: spgate_client_submit_step_plan on the leader, nothing elsewhere. */
SPGATE_EXPORT spgate_status spgate_decider_submit_step_plan(spgate_decider* decider,
                                                            int64_t step,
                                                            const spgate_microbatch_plan* mbs,
                                                            size_t count, uint64_t resident_bytes,
                                                            uint64_t memory_budget_bytes);
/* Collective over the group: the step's head and its `count` micro-batch decisions (the
 * layout's; 0: a plain plan, the head only), in one call of the broadcast callback
 * (size 24 + count), identical on every rank, or the same error on every rank.
 * stage_peak_bytes (may be NULL): the leader's predicted stage peak; 0 elsewhere. */
SPGATE_EXPORT spgate_status spgate_decider_decide_microbatches(
    spgate_decider* decider, int64_t step, int64_t timeout_us, spgate_decision* out,
    spgate_microbatch_decision* mbs, size_t count, uint64_t* stage_peak_bytes);
/* This rank's measurements of a step it ran (spgate_decider_report_step_telemetry with no
 * micro-batches). With a max-reduce (group session) a collective: every rank calls it for
 * every step it reports, in the same order; the leader queues one record for the group
 * (each value the largest over the ranks, with the slowest rank and the rank of the
 * highest peak memory). A rank whose record is refused (SPGATE_INVALID_ARGUMENT) still
 * takes part, so no rank is left waiting, and the leader sends nothing for that step
 * (SPGATE_INVALID_ARGUMENT there too); ranks that reported different steps or modes are
 * SPGATE_INTERNAL on the leader. Without one: the rank's own client queues the record
 * (SPGATE_FAILED_PRECONDITION without a client). */
SPGATE_EXPORT spgate_status spgate_decider_report_telemetry(spgate_decider* decider,
                                                            const spgate_telemetry* telemetry);

/* One micro-batch of a step plan on this stage (docs/design.md §12): the wall time of its
 * forward and its backward on the stage (its TP collectives included; p2p waits and the
 * pipeline's bubble excluded), of those the time in reduce-scatters and all-gathers, and
 * its non-padding tokens. The daemon learns each stage's ADAPTIVE table from these. */
typedef struct spgate_microbatch_telemetry {
  int32_t id;
  int32_t mode;
  double forward_s;
  double backward_s;
  double rs_wait_s;
  double all_gather_s;
  int64_t effective_tokens;
  double all_reduce_s; /* of those, inside all-reduce calls */
} spgate_microbatch_telemetry;

/* A step plan's step: the record and one entry per micro-batch id of the layout (`count`
 * = its microbatches; ids any order). The client's: queued as spgate_client_report_telemetry
 * (refused naming the micro-batch and field). The decider's: after
 * spgate_decider_decide_microbatches with count > 0, with a decider from
 * spgate_decider_create_group, the record and its micro-batches are reduced in one call of
 * `reduce` (16 + 8 x count doubles, then the ranks' busy times: one a rank and, while
 * count x ranks is at most 4,096, one a rank per micro-batch) and every rank must give them; the rules of
 * spgate_decider_report_telemetry apply (a refused rank still takes part), and ranks that
 * ran a micro-batch in different modes are SPGATE_INTERNAL on the leader. */
SPGATE_EXPORT spgate_status spgate_client_report_step_telemetry(
    spgate_client* client, const spgate_telemetry* telemetry,
    const spgate_microbatch_telemetry* microbatches, size_t count);
SPGATE_EXPORT spgate_status spgate_decider_report_step_telemetry(
    spgate_decider* decider, const spgate_telemetry* telemetry,
    const spgate_microbatch_telemetry* microbatches, size_t count);

#ifdef __cplusplus
}
#endif

#endif /* SPGATE_WORKER_CLIENT_SPGATE_CLIENT_H_ */
