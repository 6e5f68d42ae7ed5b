"""How hallucination runs are shown: the judged-accuracy table after the metric table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from evalsuite.contracts import TaskView

if TYPE_CHECKING:
    from evalsuite.runs.view import RunView


class HallucinationView(TaskView):
    def report_section(self, run: RunView) -> str:
        """Judged accuracy per judge with verdicts in the run (or how to judge it)."""
        from .judges.tables import judge_table

        return judge_table([run.path])
