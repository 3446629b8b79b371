"""The run and its step: the recipe validated once into a plan, the parts built from it, each step's
phases (collect, batch, update), evaluation, the warm start and the export; the `Trainer` orchestrates."""
