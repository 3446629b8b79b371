"""The run and its step: the parts built from the plan, each step's phases (collect, batch, update,
the no-grad passes before it), evaluation, the warm start, the run's checkpoints and the export; the
`Trainer` orchestrates."""
