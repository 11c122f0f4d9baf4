from spgate.torch.session import connect as connect
from spgate.torch.group_decider import GroupDecider as GroupDecider
from spgate.torch import parallel as parallel
from spgate.torch.launch import LaunchIdentity as LaunchIdentity, agree_on_launch as agree_on_launch
from spgate.torch import pipeline as pipeline
from spgate.torch.pipeline import (PipelineDecider as PipelineDecider, PipelineGrid as PipelineGrid,
                                   StageBoundaryError as StageBoundaryError,
                                   StageLink as StageLink)
