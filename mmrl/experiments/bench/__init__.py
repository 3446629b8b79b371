"""`mmrl bench`: a checkpoint of any family scored on a registered benchmark by its published protocol
(docs/bench.md): the harness's stages and shards (harness.py), the policy it generates with
(policy_source.py), the samples on disk (sample_files.py), the summary and report (report.py)."""
