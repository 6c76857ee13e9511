"""Statistics across ranks: combining a step's statistics over the process group or shard group
(combine.py: the schema's merge as all-reduces, the layout check, timeouts) and the DDP comm hook that counts each
rank's NaN/Inf before the all-reduce (ddp.py), handed to the step's report as a ``RankOrigin``.
"""
