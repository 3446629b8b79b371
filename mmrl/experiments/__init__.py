"""Experiments above one run: demos (a recipe with its held-out evaluator and figure) and sweeps
(grids of runs, their reports)."""
