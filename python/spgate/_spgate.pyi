"""Type stubs for spgate._spgate (python/spgate_module.cc): the C++ worker client."""
import enum
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

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


class Mode(enum.IntEnum):
    SEQUENCE_PARALLEL = 1
    TENSOR_PARALLEL_ONLY = 2
    @property
    def label(self) -> str: ...  # "sp" / "tp_only"


class Reason(enum.IntEnum):
    GATES_PASSED = 1
    LENGTH_CV = 2
    RS_WAIT = 3
    PROBE = 4
    MEMORY_REQUIRES_SP = 5
    MEMORY_OVER_BUDGET = 6
    PINNED = 7
    CONTROLLER_UNAVAILABLE = 8
    ADAPTIVE = 9
    @property
    def label(self) -> str: ...  # the metric label, e.g. "length_cv"


class DecisionSource(enum.IntEnum):
    DAEMON = 1
    FALLBACK = 2
    LOCAL_ONLY = 3
    @property
    def label(self) -> str: ...  # "daemon" / "fallback" / "local"


class BatchPlan:
    step: int
    lengths: List[int]
    predicted_peak_bytes_sp: int
    predicted_peak_bytes_tp: int
    memory_budget_bytes: int
    def __init__(self, step: int, lengths: Sequence[int], predicted_peak_bytes_sp: int = 0,
                 predicted_peak_bytes_tp: int = 0, memory_budget_bytes: int = 0) -> None: ...


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
    def sequence_parallel(self) -> bool: ...
    def __init__(self, step: int, mode: Mode, reason: Reason,
                 policy_reason: Optional[Reason] = None,
                 source: DecisionSource = DecisionSource.DAEMON,
                 config_version: int = 0) -> None: ...
    def to_wire(self) -> bytes: ...
    @staticmethod
    def from_wire(wire: bytes) -> "GateDecision": ...


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
    def __init__(self, step: int, mode: Mode, reason: Reason, step_time_s: float,
                 rs_wait_s: float = 0.0, all_gather_s: float = 0.0, norm_stall_s: float = 0.0,
                 effective_tokens: int = 0, padding_tokens: int = 0,
                 peak_memory_bytes: int = 0) -> None: ...


class ClientStats:
    connected: bool
    registrations: int
    streams_opened: int
    stream_failures: int
    plans_submitted: int
    plans_sent: int
    plans_rejected: int
    decisions_received: int
    daemon_decisions: int
    late_decisions: int
    local_decisions: int
    config_updates: int
    telemetry_reported: int
    telemetry_sent: int
    telemetry_acked: int
    telemetry_dropped: int
    last_decided_step: int
    last_error: str


TlsOptions = Union[Mapping[str, str], Any]  # ca / cert / key: PEM file paths; server_name


class Client:
    """GateClient: one rank's session with spgated. Times are in seconds.

    With a controller, `incarnation` names this launch of the job and must be the same on
    every rank ("" reads the launcher's: SPGATE_INCARNATION, TORCHELASTIC_RUN_ID, ...).
    """
    def __init__(self, *, job_id: str, controller: str = "", group: int = 0,
                 rank_in_group: int = 0, group_size: int = 1, global_rank: int = 0,
                 host: str = "", memory_budget_bytes: int = 0,
                 decision_deadline: float = 0.020, rpc_timeout: float = 2.0,
                 initial_backoff: float = 0.1, max_backoff: float = 5.0,
                 telemetry_buffer: int = 4096, seed: int = 0,
                 tls: Optional[TlsOptions] = None, incarnation: str = "",
                 worker_token: str = "") -> None: ...
    def submit_plan(self, step: Union[int, BatchPlan], lengths: Sequence[int] = ..., *,
                    predicted_peak_bytes_sp: int = 0, predicted_peak_bytes_tp: int = 0,
                    memory_budget_bytes: int = 0) -> None: ...
    def await_decision(self, step: int, timeout: Optional[float] = None) -> GateDecision: ...
    def report_telemetry(self, telemetry: StepTelemetry) -> None: ...
    def observe_group_rs_wait_share(self, step: int, mode: Mode, share: float) -> None: ...
    def flush(self, timeout: float = 5.0) -> None: ...
    def wait_until_connected(self, timeout: float) -> None: ...
    def stats(self) -> ClientStats: ...
    def config_for(self, step: int) -> Dict[str, Union[int, float]]: ...
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
    def closed(self) -> bool: ...
    def close(self) -> None: ...
    def __enter__(self) -> "Client": ...
    def __exit__(self, *exc: Any) -> bool: ...


class GroupDecider:
    """The C++ GroupDecider over a Python broadcast(buf: bytearray, root: int) that fills
    buf with the root's 24 bytes on the other ranks (spgate.torch.GroupDecider wraps it)."""
    def __init__(self, client: Optional[Client], rank_in_group: int,
                 broadcast: Callable[[bytearray, int], None]) -> None: ...
    @property
    def is_leader(self) -> bool: ...
    def submit_plan(self, step: Union[int, BatchPlan], lengths: Sequence[int] = ..., *,
                    predicted_peak_bytes_sp: int = 0, predicted_peak_bytes_tp: int = 0,
                    memory_budget_bytes: int = 0) -> None: ...
    def decide(self, step: int, timeout: Optional[float] = None) -> GateDecision: ...


def wire_failure(step: int, code: int) -> bytes: ...
