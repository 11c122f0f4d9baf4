"""Type stubs for spgate._spgate (python/spgate_module.cc): the C++ worker client."""
from typing import (Any, Callable, ClassVar, Dict, List, Mapping, Optional, Sequence, Tuple,
                    Union, overload)

__version__: str


class Error(RuntimeError):
    """A failed spgate call."""
    code: int          # absl/gRPC status code (3 INVALID_ARGUMENT, 9 FAILED_PRECONDITION, ...)
    code_name: str     # e.g. "INVALID_ARGUMENT"
    message: str


class InvalidArgumentError(Error, ValueError): ...
class FailedPreconditionError(Error): ...
class DeadlineExceededError(Error): ...
class UnavailableError(Error): ...


# Mode, Reason and DecisionSource are pybind11 enums with py::arithmetic() over C++ enum
# classes: a member converts to int (int(), operator.index) and hashes as its int, but it
# equals only members (Mode.SEQUENCE_PARALLEL == 1 is False; compare int(mode) == 1, or
# with the member) and orders only against members of its own class (Mode.SEQUENCE_PARALLEL
# < 2 raises TypeError). The classes are not enum.Enum / enum.IntEnum subclasses (the class
# is not iterable; __members__ maps the names to the members). The bitwise operators
# pybind11 also adds to arithmetic enums are left out: they mean nothing here.
class Mode:
    """How a step runs: sequence parallel or TP-only."""
    SEQUENCE_PARALLEL: ClassVar[Mode]  # value 1
    TENSOR_PARALLEL_ONLY: ClassVar[Mode]  # value 2
    __members__: ClassVar[Dict[str, Mode]]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    @property
    def label(self) -> str: ...  # "sp" / "tp_only"
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...  # members only: Mode(1) == Mode.SEQUENCE_PARALLEL, not 1
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...  # hash(int(self))
    def __lt__(self, other: Mode) -> bool: ...
    def __le__(self, other: Mode) -> bool: ...
    def __gt__(self, other: Mode) -> bool: ...
    def __ge__(self, other: Mode) -> bool: ...


class Reason:
    """Why a step runs in its mode."""
    GATES_PASSED: ClassVar[Reason]  # value 1
    LENGTH_CV: ClassVar[Reason]  # value 2
    RS_WAIT: ClassVar[Reason]  # value 3
    PROBE: ClassVar[Reason]  # value 4
    MEMORY_REQUIRES_SP: ClassVar[Reason]  # value 5
    MEMORY_OVER_BUDGET: ClassVar[Reason]  # value 6
    PINNED: ClassVar[Reason]  # value 7
    CONTROLLER_UNAVAILABLE: ClassVar[Reason]  # value 8
    ADAPTIVE: ClassVar[Reason]  # value 9
    LENGTHS_UNKNOWN: ClassVar[Reason]  # value 10
    SP_REQUIRED: ClassVar[Reason]  # value 11
    __members__: ClassVar[Dict[str, Reason]]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    @property
    def label(self) -> str: ...  # the metric label, e.g. "length_cv"
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...  # members only: Mode(1) == Mode.SEQUENCE_PARALLEL, not 1
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...  # hash(int(self))
    def __lt__(self, other: Reason) -> bool: ...
    def __le__(self, other: Reason) -> bool: ...
    def __gt__(self, other: Reason) -> bool: ...
    def __ge__(self, other: Reason) -> bool: ...


class DecisionSource:
    """Who decided a step."""
    DAEMON: ClassVar[DecisionSource]  # value 1
    FALLBACK: ClassVar[DecisionSource]  # value 2
    LOCAL_ONLY: ClassVar[DecisionSource]  # value 3
    MEMORY_OVERRIDE: ClassVar[DecisionSource]  # value 4
    __members__: ClassVar[Dict[str, DecisionSource]]
    def __init__(self, value: int) -> None: ...
    @property
    def name(self) -> str: ...
    @property
    def value(self) -> int: ...
    @property
    def label(self) -> str: ...  # "daemon" / "fallback" / "local" / "memory_override"
    def __int__(self) -> int: ...
    def __index__(self) -> int: ...
    def __eq__(self, other: object) -> bool: ...  # members only: Mode(1) == Mode.SEQUENCE_PARALLEL, not 1
    def __ne__(self, other: object) -> bool: ...
    def __hash__(self) -> int: ...  # hash(int(self))
    def __lt__(self, other: DecisionSource) -> bool: ...
    def __le__(self, other: DecisionSource) -> bool: ...
    def __gt__(self, other: DecisionSource) -> bool: ...
    def __ge__(self, other: DecisionSource) -> bool: ...


class JobLayout:
    """A pipelined job's shape (docs/design.md §12), the same on every rank: tp (= the
    Client's group_size), pp stages, vp model chunks per stage, cp, dp, micro-batches per
    optimizer step, schedule "1f1b" (vp 1) or "interleaved_1f1b" (vp >= 2)."""
    tp: int
    pp: int
    vp: int
    cp: int
    dp: int
    microbatches: int
    schedule: str
    def __init__(self, *, tp: int = 1, pp: int = 1, vp: int = 1, cp: int = 1, dp: int = 1,
                 microbatches: int = 1, schedule: str = "1f1b") -> None: ...
    def validate(self) -> None: ...  # InvalidArgumentError naming the field
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]


class StageCoordinates:
    """Where a TP group sits in a JobLayout; its group index is
    (dp_index * pp + stage) * cp + cp_rank (group())."""
    dp_index: int
    stage: int
    cp_rank: int
    def __init__(self, *, dp_index: int = 0, stage: int = 0, cp_rank: int = 0) -> None: ...
    def group(self, layout: JobLayout) -> int: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]


class MicrobatchPlan:
    """One micro-batch of a step plan: its id, its lengths (empty: this stage does not know
    them; it runs SP with reason LENGTHS_UNKNOWN) and what it costs this stage in each mode
    (activations kept for its backward, workspace of one forward or backward), in bytes."""
    id: int
    lengths: List[int]
    activation_sp: int
    activation_tp: int
    workspace_sp: int
    workspace_tp: int
    def __init__(self, id: int, lengths: Sequence[int] = [], *, activation_sp: int = 0,
                 activation_tp: int = 0, workspace_sp: int = 0,
                 workspace_tp: int = 0) -> None: ...


class BatchPlan:
    """A plain plan (lengths, predicted peaks), or with a Client that has a layout a step
    plan: every micro-batch of the step in `microbatches` and the stage's resident bytes,
    with `lengths` and the predicted peaks left empty."""
    step: int
    lengths: List[int]
    predicted_peak_bytes_sp: int
    predicted_peak_bytes_tp: int
    memory_budget_bytes: int
    microbatches: List[MicrobatchPlan]
    resident_bytes: int
    def __init__(self, step: int, lengths: Sequence[int] = [], predicted_peak_bytes_sp: int = 0,
                 predicted_peak_bytes_tp: int = 0, memory_budget_bytes: int = 0,
                 microbatches: Sequence[MicrobatchPlan] = [],
                 resident_bytes: int = 0) -> None: ...


class MicrobatchDecision:
    """A step plan's decision for one micro-batch."""
    @property
    def mode(self) -> Mode: ...
    @property
    def reason(self) -> Reason: ...
    def __init__(self, mode: Mode, reason: Reason) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]


class GateDecision:
    @property
    def step(self) -> int: ...
    @property
    def mode(self) -> Mode: ...
    @property
    def reason(self) -> Reason: ...
    @property
    def policy_reason(self) -> Reason: ...
    @property
    def source(self) -> DecisionSource: ...
    @property
    def config_version(self) -> int: ...
    @property
    def microbatches(self) -> List[MicrobatchDecision]: ...  # a step plan's, by id
    @property
    def stage_peak_bytes(self) -> int: ...  # a step plan's predicted stage peak (leader)
    @property
    def sequence_parallel(self) -> bool: ...
    def __init__(self, step: int, mode: Mode, reason: Reason,
                 policy_reason: Optional[Reason] = None,
                 source: DecisionSource = DecisionSource.DAEMON,
                 config_version: int = 0) -> None: ...
    def to_wire(self) -> bytes: ...
    @staticmethod
    def from_wire(wire: bytes) -> "GateDecision": ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]  # __eq__ without __hash__: unhashable


class MicrobatchTelemetry:
    """One micro-batch of a step plan on this stage: its forward and backward compute
    (p2p waits and the bubble excluded), the time inside reduce-scatters and all-gathers,
    its tokens (docs/design.md §12)."""
    id: int
    mode: Mode
    forward_s: float
    backward_s: float
    rs_wait_s: float
    all_gather_s: float
    effective_tokens: int
    all_reduce_s: float  # inside all-reduce calls (TP-only's): the straggler rule reads it
    def __init__(self, id: int, mode: Mode, forward_s: float, backward_s: float,
                 rs_wait_s: float = 0.0, all_gather_s: float = 0.0,
                 effective_tokens: int = 0, all_reduce_s: float = 0.0) -> None: ...
    def __eq__(self, other: object) -> bool: ...
    __hash__: ClassVar[None]  # type: ignore[assignment]


class StepTelemetry:
    step: int
    mode: Mode
    reason: Reason
    step_time_s: float
    rs_wait_s: float
    all_gather_s: float
    norm_stall_s: float
    effective_tokens: int
    padding_tokens: int
    peak_memory_bytes: int
    microbatches: List[MicrobatchTelemetry]
    # Inside all-reduce calls (TP-only's): with the waits above, what a rank's busy time
    # leaves out, so ADAPTIVE's straggler rule sees TP-only's stragglers (docs/design.md §11).
    all_reduce_s: float
    def __init__(self, step: int, mode: Mode, reason: Reason, step_time_s: float,
                 rs_wait_s: float = 0.0, all_gather_s: float = 0.0, norm_stall_s: float = 0.0,
                 effective_tokens: int = 0, padding_tokens: int = 0,
                 peak_memory_bytes: int = 0,
                 microbatches: Sequence[MicrobatchTelemetry] = ...,
                 all_reduce_s: float = 0.0) -> None: ...


class ClientStats:
    """Client.stats(): a snapshot; every field is read-only."""
    @property
    def connected(self) -> bool: ...
    @property
    def registrations(self) -> int: ...
    @property
    def streams_opened(self) -> int: ...
    @property
    def stream_failures(self) -> int: ...
    @property
    def plans_submitted(self) -> int: ...
    @property
    def plans_sent(self) -> int: ...
    @property
    def plans_rejected(self) -> int: ...
    @property
    def decisions_received(self) -> int: ...
    @property
    def daemon_decisions(self) -> int: ...
    @property
    def late_decisions(self) -> int: ...
    @property
    def local_decisions(self) -> int: ...
    @property
    def memory_overrides(self) -> int: ...  # daemon TP-only answers the memory gate forbade
    @property
    def config_updates(self) -> int: ...
    @property
    def telemetry_reported(self) -> int: ...
    @property
    def telemetry_sent(self) -> int: ...
    @property
    def telemetry_acked(self) -> int: ...
    @property
    def telemetry_dropped(self) -> int: ...
    # The daemon's last decided step for this group at the last Register (-1: none):
    # where a restarted rank resumes; not a count of this client's decisions.
    @property
    def last_decided_step(self) -> int: ...
    @property
    def session_replaced(self) -> bool: ...  # another process holds this rank's seat
    @property
    def last_error(self) -> str: ...


# tls=: a dict with the keys ca / cert / key (PEM file paths: str or os.PathLike) and
# server_name (str), any of them None or left out, or an object with those attributes;
# another key, or a value of another type, is InvalidArgumentError naming it. A
# typing-only alias: there is no TlsOptions in the module.
_TlsOptions = Union[Mapping[str, Optional[str]], Any]


class Client:
    """GateClient: one rank's session with spgated. Times are in seconds.

    With `group_session` (the default) the session of the TP group's leader
    (rank_in_group 0) speaks for the whole group: with a controller, the other ranks create
    no Client (a Client for rank_in_group != 0 is refused) and give their telemetry to
    GroupDecider.report_telemetry, which reduces it into the leader. group_session=False:
    every rank has a session of its own and reports its own records.

    With a controller, `incarnation` names this launch of the job and must be the same on
    every rank ("" reads the launcher's: SPGATE_INCARNATION, TORCHELASTIC_RUN_ID, ...), and
    `launch_credential` is the launch's secret, also the same on every rank ("" reads
    SPGATE_LAUNCH_CREDENTIAL; spgate.torch.agree_on_launch has rank 0 make one).

    Bad arguments raise at construction, naming the keyword: an unknown keyword or a value
    of the wrong type TypeError (never showing a value: no secret ends up in a log), a
    value the client or the daemon would refuse InvalidArgumentError (`controller` not
    host:port with a port in 1..65535, a Register field by the daemon's rules, an int
    outside its option's range: "group: 1099511627776 is out of the 32-bit range [...]").

    close() may be called from any thread, a GroupDecider callback or a signal handler: it
    ends the waits of calls in progress (wait_until_connected and flush raise
    FailedPreconditionError) without waiting for them; the client is freed when the last
    of them returns. Every later call raises FailedPreconditionError.
    """
    # The keywords are the rows of the client's option table (worker/client/
    # client_options.h) that Python takes, in its order, then tls;
    # tests/python/stub_check_test.py fails when this signature and the module's drift.
    def __init__(self, *, job_id: str, controller: str = "", incarnation: str = "",
                 launch_credential: str = "", worker_token: str = "", group: int = 0,
                 rank_in_group: int = 0, group_size: int = 1, global_rank: int = 0,
                 group_session: bool = True, host: str = "", hardware_id: str = "",
                 memory_budget_bytes: int = 0,
                 decision_deadline: float = 0.02,
                 rpc_timeout: float = 2.0, initial_backoff: float = 0.1,
                 max_backoff: float = 5.0, telemetry_buffer: int = 4096, seed: int = 0,
                 layout: Optional[JobLayout] = None,
                 coordinates: Optional[StageCoordinates] = None,
                 sp_required: Sequence[str] = [],
                 tls: Optional[_TlsOptions] = None) -> None: ...
    @overload
    def submit_plan(self, plan: BatchPlan) -> None: ...
    # lengths: any iterable of integers; a float or a bool is InvalidArgumentError naming
    # its index (lengths[3]), never truncated.
    @overload
    def submit_plan(self, step: int, lengths: Sequence[int], *,
                    predicted_peak_bytes_sp: int = 0, predicted_peak_bytes_tp: int = 0,
                    memory_budget_bytes: int = 0) -> None: ...
    def await_decision(self, step: int, timeout: Optional[float] = None) -> GateDecision: ...
    # A StepTelemetry, or its fields as keywords (step, mode, reason, step_time_s,
    # rs_wait_s, all_gather_s, norm_stall_s, effective_tokens, padding_tokens,
    # peak_memory_bytes, microbatches); TypeError for both.
    def report_telemetry(self, telemetry: Optional[StepTelemetry] = None,
                         **kwargs: Any) -> None: ...
    # share in [0, 1]; InvalidArgumentError naming it otherwise (NaN included).
    def observe_group_rs_wait_share(self, step: int, mode: Mode, share: float) -> None: ...
    def flush(self, timeout: float = 5.0) -> None: ...
    def wait_until_connected(self, timeout: float) -> None: ...
    def stats(self) -> ClientStats: ...
    # Every gate field of the config in force at `step` (policy is a name, e.g. "STATIC";
    # the rest numbers), plus version and effective_from_step.
    def config_for(self, step: int) -> Dict[str, Union[int, float, str]]: ...
    def take_decision_latencies(self) -> List[Tuple[float, float]]: ...
    @property
    def is_leader(self) -> bool: ...
    @property
    def job_id(self) -> str: ...
    @property
    def group(self) -> int: ...
    @property
    def rank_in_group(self) -> int: ...
    @property
    def group_size(self) -> int: ...
    @property
    def group_session(self) -> bool: ...
    @property
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: Any) -> bool: ...


class GroupDecider:
    """The C++ GroupDecider over a Python broadcast(buf: bytearray, root: int) that fills
    buf with the root's bytes on the other ranks (24, and one more per micro-batch of a
    step plan), and for the leader's group session a Python reduce(buf: bytearray, root:
    int) that leaves in the root's buf (little-endian float64s: 16, 8 more per micro-batch
    of a step plan, then the ranks' busy times: group_size, and group_size per micro-batch
    while micro-batches x group_size is at most 4,096) the element-wise maximum of every
    rank's buf (spgate.torch.GroupDecider wraps it).

    `client`: required on rank 0; None elsewhere in a group session; each rank's own
    Client with per-rank sessions (group_session=False), and then no `reduce`. `reduce`
    is required on every rank when the leader's Client has group_session, group_size > 1
    and a controller."""
    def __init__(self, client: Optional[Client], rank_in_group: int,
                 broadcast: Callable[[bytearray, int], None],
                 reduce: Optional[Callable[[bytearray, int], None]] = None, *,
                 group_size: int = 0) -> None: ...
    # group_size: the group's ranks (0: the client's group_size); a rank with `reduce`
    # and no Client must pass it.
    @property
    def is_leader(self) -> bool: ...
    @overload
    def submit_plan(self, plan: BatchPlan) -> None: ...
    @overload
    def submit_plan(self, step: int, lengths: Sequence[int], *,
                    predicted_peak_bytes_sp: int = 0, predicted_peak_bytes_tp: int = 0,
                    memory_budget_bytes: int = 0) -> None: ...
    def decide(self, step: int, timeout: Optional[float] = None) -> GateDecision: ...
    # A step plan's decision (a Client with a layout): decide's head and every one of its
    # `microbatches` micro-batch decisions in one broadcast (24 + microbatches bytes; 0: a
    # plain plan, as decide); the same on every rank, errors included.
    def decide_microbatches(self, step: int, microbatches: int,
                            timeout: Optional[float] = None) -> GateDecision: ...
    # This rank's own record of a step it ran. With `reduce` a collective (every rank, every
    # step it reports, in the same order): the leader sends one record for the group.
    # Without: the rank's own Client's report_telemetry.
    @overload
    def report_telemetry(self, telemetry: StepTelemetry) -> None: ...
    @overload
    def report_telemetry(self, step: int, mode: Mode, reason: Reason, step_time_s: float, *,
                         rs_wait_s: float = 0.0, all_gather_s: float = 0.0,
                         norm_stall_s: float = 0.0, effective_tokens: int = 0,
                         padding_tokens: int = 0, peak_memory_bytes: int = 0,
                         all_reduce_s: float = 0.0) -> None: ...


def wire_failure(step: int, code: int) -> bytes: ...
# (forward, micro-batch, chunk) in the order stage `stage` runs them (StageSchedule).
def stage_schedule(layout: JobLayout, stage: int) -> List[Tuple[bool, int, int]]: ...
def new_launch_credential() -> str: ...  # 32 hex digits from the kernel's random source
def launch_credential_from_environment() -> str: ...  # SPGATE_LAUNCH_CREDENTIAL or ""
def job_id_from_environment() -> str: ...  # SPGATE_JOB_ID, else SLURM_JOB_NAME, or ""
def read_worker_token_file(path: str) -> str: ...  # the token a worker token file gives
def incarnation_from_environment() -> str: ...  # the launcher's run id or ""
# SPGATE_HARDWARE_ID, else `detected` made valid, else "cpu:" and the CPU model.
def default_hardware_id(detected: str = "") -> str: ...
def gpu_hardware_id(name: str, major: int, minor: int, total_memory_bytes: int) -> str: ...
