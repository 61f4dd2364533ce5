"""The design note's experiments (issue 19), by job: :mod:`.stats` (means and confidence
intervals), :mod:`.accounting` (what a campaign's journal says happened), :mod:`.plan` (the
cells and items of a sweep), :mod:`.campaign` (one campaign under ``mpiexec``), :mod:`.run`
(the driver) and :mod:`.report` (tables, figures, the docs). ``benchmarks/experiments.py`` is
the command; see its docs."""

from .accounting import Attempt, account, attempts_of
from .campaign import role_campaign, task
from .plan import ADAPTIVE, ADAPTIVE_LABEL, Cell, make_plan
from .report import (
    _MEASURES,
    BEGIN,
    END,
    figure,
    summarize_group1,
    table_group1,
    table_group2,
    write_docs,
)
from .run import LAUNCH_TRIES, Setup, _ended_well, _launch_failed, _started, _tries, sweep
from .stats import Estimate, mean_ci, spread, t_critical

__all__ = [
    "ADAPTIVE",
    "ADAPTIVE_LABEL",
    "Attempt",
    "BEGIN",
    "Cell",
    "END",
    "Estimate",
    "LAUNCH_TRIES",
    "Setup",
    "account",
    "attempts_of",
    "figure",
    "make_plan",
    "mean_ci",
    "role_campaign",
    "spread",
    "summarize_group1",
    "sweep",
    "t_critical",
    "table_group1",
    "table_group2",
    "task",
    "write_docs",
    "_MEASURES",
    "_ended_well",
    "_launch_failed",
    "_started",
    "_tries",
]
