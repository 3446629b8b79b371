"""One run: the recipe validated once into a plan, the run's parts, a step's rollouts and rewards,
batching, the update passes, stages, evaluation, checkpoints, run directory, signals, tracking; the
`Trainer` orchestrates them.
"""
