"""Runtime: compile a model to a Plan, plan its memory, execute it, profile it.

    from quanta.runtime.compile import compile
    from quanta.runtime.execute import Executor

    plan = compile(model, "native", num_threads=2)   # kernels, slots, memory plan
    print(plan)
    outs = Executor(plan).run(feeds, ["y"])

(``compile`` is deliberately not re-exported here: it would hide the module
``quanta.runtime.compile`` behind the function.) See docs/runtime.md.
"""
