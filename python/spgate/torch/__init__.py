"""spgate.torch: spgate in a PyTorch trainer. connect does it in one call (the launch
agreed, the TP group leader's session opened, the group's decider returned on every
rank); underneath it, agree_on_launch gives every rank the launch's
incarnation and credential (world rank 0's, broadcast); GroupDecider gives every rank of a
TP group the same decision over its torch.distributed group (gloo or NCCL); parallel holds
the Megatron-style TP transformer layers whose sequence parallelism is chosen per forward;
pipeline the pipeline stages (the grid, PipelineDecider - a decision per micro-batch -, the
sequence-sharded stage boundary and the 1F1B schedule; docs/design.md §12)."""


__all__ = ["connect", "GroupDecider", "PipelineGrid", "PipelineDecider", "StageLink",
           "StageBoundaryError", "agree_on_launch", "LaunchIdentity"]


def __dir__():
    # The lazy names and the submodules too (tab completion, help()).
    return sorted(set(globals()) | set(__all__) | {"parallel", "pipeline"})


def __getattr__(name):
    # Lazy, so that spgate.torch.parallel works without the native module.
    if name == "connect":
        from spgate.torch.session import connect
        return connect
    if name == "GroupDecider":
        from spgate.torch.group_decider import GroupDecider
        return GroupDecider
    if name in ("PipelineGrid", "PipelineDecider", "StageLink", "StageBoundaryError"):
        from spgate.torch import pipeline
        return getattr(pipeline, name)
    if name in ("agree_on_launch", "LaunchIdentity"):
        from spgate.torch import launch
        return getattr(launch, name)
    raise AttributeError(name)
