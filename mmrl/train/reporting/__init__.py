"""What users see of a run: progress, the metrics file, TensorBoard and W&B, plots, held-out samples."""
