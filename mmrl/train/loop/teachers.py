"""On-policy distillation's frozen teachers (`algorithm.distill`) and the routing of each row of a
micro-batch to its teacher: one teacher scores every row; several score the rows their data column
(`algorithm.distill.teacher_column`) names, and the pieces are joined back in the rows' order."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from mmrl.core.rollout import Rollout
from mmrl.serving.teacher_client import ServedTeacher

TeacherScore = Callable[[nn.Module | ServedTeacher, Rollout], Tensor]  # (teacher, rows) -> a value per unit [r, u, ...]


@dataclass
class Teachers:
    """The teachers' frozen modules (or servers) by name (as the recipe names them; "teacher" for the one
    `algorithm.distill.teacher`) and the data column routing rows among several."""

    def in_process(self) -> list[nn.Module]:
        """The teachers' modules in this process (not the served ones)."""
        return [m for m in self.modules.values() if isinstance(m, nn.Module)]

    modules: dict[str, nn.Module | ServedTeacher]  # a teacher's frozen module, or the server that scores for it
    column: str | None = None  # algorithm.distill.teacher_column; None: the one teacher scores every row

    def routed(self, mb: Rollout, score: TeacherScore, in_step: bool) -> Tensor:
        """`score(teacher, rows)` of every row of `mb` by its own teacher, [b, u, ...] in `mb`'s order.
        `in_step` (processes whose sharded forwards must run the same passes): a teacher with none of
        the rows still runs, on the first row, its piece kept in the graph at zero weight, so every
        process runs each teacher (and the student beside it) once per micro-batch."""
        if len(self.modules) == 1 and self.column is None:
            return score(next(iter(self.modules.values())), mb)
        names = mb.columns[self.column]
        out: Tensor | None = None
        for name, teacher in self.modules.items():
            rows = [i for i, n in enumerate(names) if n == name]
            if not rows and not in_step:
                continue
            piece = score(teacher, mb.select(rows or [0]))
            if out is None:
                out = piece.new_zeros(len(mb), *piece.shape[1:])
            if rows:
                out = out.index_put((torch.tensor(rows, device=piece.device),), piece)
            else:
                out = out + 0.0 * piece.sum()  # a pass only to keep the processes in step
        if out is None:
            raise ValueError(f"algorithm.distill.teacher_column={self.column!r}: no row of the micro-batch names a "
                             f"teacher among {sorted(self.modules)} (rows name {sorted(set(map(str, names)))})")
        return out
