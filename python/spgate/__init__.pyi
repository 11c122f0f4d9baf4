from spgate._spgate import (BatchPlan as BatchPlan, Client as Client, ClientStats as ClientStats,
                            DeadlineExceededError as DeadlineExceededError,
                            DecisionSource as DecisionSource, Error as Error,
                            FailedPreconditionError as FailedPreconditionError,
                            GateDecision as GateDecision, GroupDecider as GroupDecider,
                            InvalidArgumentError as InvalidArgumentError, Mode as Mode,
                            Reason as Reason, StepTelemetry as StepTelemetry,
                            UnavailableError as UnavailableError, __version__ as __version__,
                            wire_failure as wire_failure)
