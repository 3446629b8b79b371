"""The recipe checked whole before any model, data set or reward model loads, and the stage plan the
run follows: `validate` (validate.py) gathers every problem of every concern (ranges, registry names,
the method's settings, the rewards) into one error, or returns the `StagePlan`."""
