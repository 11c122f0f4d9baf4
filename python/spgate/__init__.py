"""spgate: the worker client for Python (pybind11 over the C++ client library,
worker/client/gate_client.h), with the same names as in C++: Client (GateClient),
BatchPlan, GateDecision, StepTelemetry, Mode, Reason, DecisionSource; for pipelined jobs
(docs/design.md §12) JobLayout, StageCoordinates, MicrobatchPlan, MicrobatchDecision,
MicrobatchTelemetry and stage_schedule; and the launch's
identity (worker/client/identity.h): new_launch_credential,
launch_credential_from_environment, incarnation_from_environment,
job_id_from_environment, default_hardware_id and gpu_hardware_id; and
read_worker_token_file (worker/client/tls.h). Errors raise
spgate.Error (its .code is the absl/gRPC status code, .code_name e.g. "INVALID_ARGUMENT")
or its subclasses InvalidArgumentError, FailedPreconditionError, DeadlineExceededError.

spgate.torch.connect is the one call a PyTorch trainer makes (the TP group's decider on
every rank); spgate.torch.parallel is plain PyTorch and imports without the native module;
spgate.torch.GroupDecider needs it. Install: `pip install ./python`. See docs/pytorch.md.
"""
try:
    from spgate._spgate import *  # noqa: F401,F403
    from spgate._spgate import __version__  # noqa: F401
    _native_error = None
except ImportError as e:  # e.g. only spgate.torch.parallel is used
    _native_error = e

    def __getattr__(name):
        raise ImportError("spgate's native module (_spgate) is not available: %s" % _native_error)
