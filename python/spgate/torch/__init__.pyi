from spgate.torch.group_decider import GroupDecider as GroupDecider
from spgate.torch import parallel as parallel
