"""Runtime: compile a model to a Plan, plan its memory, execute it, profile it.

    plan = compile(model, "native", num_threads=2)   # quanta.runtime.compile
    print(plan)                                       # steps, kernels, slots, memory
    exe = Executor(plan)                              # quanta.runtime.execute
    outs = exe.run(feeds, ["y"])

See docs/runtime.md.
"""

from __future__ import annotations

from quanta.runtime.compile import compile
from quanta.runtime.execute import Executor
from quanta.runtime.memory import MemoryPlan, plan_arena
from quanta.runtime.plan import Plan, PlanStep
from quanta.runtime.profile import Profiler, ProfileSummary

__all__ = ["Executor", "MemoryPlan", "Plan", "PlanStep", "ProfileSummary", "Profiler", "compile", "plan_arena"]
