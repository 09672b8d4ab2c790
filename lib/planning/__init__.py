"""The plan, from request to last change: kfit's one owner of the training plan.

    request.py        PlanRequest (config, hardware, model, world size, Settings), ChooseArgs
    decisions.py      device, precision, compile, TF32, cuDNN; the batch split; FSDP's gradient sync
    memory_policy.py  the memory planner: the largest micro-batch whose predicted peak fits the budget
    tiers.py          the tier policy, and which policy a config selects
    throughput.py     the fastest micro-batch under the cap (lib.steptime); every plan's predicted time
    strategy.py       DDP or which FSDP strategy
    ladder.py         the out-of-memory ladder: halving and rungs, before training and during it
    edits.py          the plan's other changes: the probe's result, the evaluation batch, a resumed micro-batch
    resolver.py       the resolver: a PlanRequest -> Plan
    door.py           the one door every caller plans through: make_plan (the model and processes derived
                      from the config), confirm (the probe on the device, re-predicted)
    render.py         the lines a plan prints

Imports are light: torch is imported where a prediction needs it.
"""

from .door import Planned, confirm, make_plan, process_count, processes, received
from .request import ChooseArgs, PlanRequest, Settings, settings_or_environment

__all__ = ["ChooseArgs", "PlanRequest", "Planned", "Settings", "confirm", "make_plan", "process_count",
           "processes", "received", "settings_or_environment"]
