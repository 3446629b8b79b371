"""Composite policies: one episode made of two policies' units, a thinker's tokens followed by a
generator's units (`task: composite`, `policy.py`); how one rollout holds both (`units.py`), the
parts built apart or as one shared module (`build.py`), the module that holds both (`model.py`), the
settings (`config.py`) and their checks (`checks.py`)."""

from . import policy  # noqa: F401  (registration)
