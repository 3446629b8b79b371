"""Where rollouts and their scoring run: the rollout worker process, the weights sent to it, and
scoring overlapped with generation (served rollouts and launchers that place them belong here)."""
