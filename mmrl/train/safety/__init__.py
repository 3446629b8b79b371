"""What keeps a run's work safe: its output directory and lock, signals, atomic checkpoints, and the
health checks that stop a run which trains on nothing."""
