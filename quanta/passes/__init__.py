"""The graph compiler's passes: the pass manager (:mod:`.manager`), the rule engine
(:mod:`.pattern`), the rule families (:mod:`.rules`) and the named pipelines
(:mod:`.pipelines`). See docs/passes.md."""
