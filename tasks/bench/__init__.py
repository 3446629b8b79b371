"""The built-in benchmarks (docs/bench.md), registered in `mmrl.registry.BENCHMARKS`, and their scorers,
registered rewards (so `mmrl serve-reward SCORER` serves a benchmark's scoring): GSM8K and MATH500
(`math_text`), LibriSpeech (`speech`), MMMU and MMAU (`choice_benchmarks`, parsing in `choices`),
MathVista (`mathvista`), RefCOCO / RefCOCO+ / RefCOCOg (`grounding`);
GenEval (`geneval`, its rules in `geneval_rules`, detectors and colour classifier in `geneval_detectors`);
VBench (`vbench`, its dimensions in `vbench_dimensions`); HPSv2's benchmark, Pick-a-Pic's PickScore and
ImageReward's benchmark (`preference`); GenEval 2 (`geneval2`) and DPG-Bench (`dpg_bench`), their judge in
`vqa_judge`."""

from . import (  # noqa: F401  (registration)
    choice_benchmarks,
    dpg_bench,
    geneval,
    geneval2,
    grounding,
    math_text,
    mathvista,
    preference,
    speech,
    vbench,
)
