"""The maths and contracts of the engine, torch only: the rollout record, the policy contract, seeding,
reward scoring and combination, advantage estimators, regularisers, objectives and losses, rollout
correction. Imports config and the leaves.
"""
