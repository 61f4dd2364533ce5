"""What mpi4py's own futures test file (``demo/futures/test_futures.py`` of its sdist) imports as
``futures``, pointed at ``durable_dispatch.futures`` (tests/mpi4py_upstream.py rewrites its two
import lines to this module and to ``durable_dispatch.futures.aplus``).

Everything public is ``durable_dispatch.futures``' own. The file also reads
``futures._core.SharedPool`` at import, to know whether it runs under mpi4py's runner (a pool
made of the job's ranks, shared by every executor): under ``python -m durable_dispatch.futures``
it does, so ``_core`` says so, and names the module name the workers import the script under
(``__mp_main__``, as ``multiprocessing`` does; mpi4py's is ``__worker__``). Nothing else of
mpi4py's private ``_core`` is given: the tests that read it fail, and docs/futures.md lists them.
"""

from __future__ import annotations

import types

from durable_dispatch.futures import *  # noqa: F403
from durable_dispatch.futures import ProcessPoolExecutor, ThreadPoolExecutor  # noqa: F401

_core = types.SimpleNamespace(
    SharedPool="the job's ranks (python -m durable_dispatch.futures)",
    MAIN_RUN_NAME="__mp_main__",
)
