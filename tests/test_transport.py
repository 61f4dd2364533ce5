"""MpiTransport under a real mpiexec: a WORK posted without waiting (``post``) ends once its
worker reads it, ``unsent`` names no failure, and ``stop`` delivers the posted WORK before the
STOP (a worker reads its WORK first)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from durable_dispatch.mpi.launcher import find_mpiexec, mpiexec_command, run_mpiexec

pytestmark = pytest.mark.mpi

if find_mpiexec() is None:  # the mpi extra is part of the test install; fail loudly without it
    raise RuntimeError("mpiexec not found: install the project with '.[test,mpi]'")

SCRIPT = """
import time
from mpi4py import MPI
from durable_dispatch.mpi.transport import MpiTransport
comm = MPI.COMM_WORLD
if comm.Get_rank() == 0:
    link = MpiTransport(comm)
    big = b"x" * 100_000  # far over any eager limit: a blocking Send would wait for rank 1
    print("posted", link.post(1, 7, big, "k1"), link.post(1, 7, big[:5000], "k2"), flush=True)
    comm.Barrier()  # rank 1 receives only after this: both posts returned before
    failures = []
    for _ in range(500):
        failures += link.unsent()
        time.sleep(0.01)
    print("unsent", failures, flush=True)
    print("posted", link.post(1, 7, b"third", "k3"), flush=True)  # small: a blocking Send
    print("stop", link.stop([1], b"{}", 9, 30.0), flush=True)
else:
    comm.Barrier()
    sizes = []
    while True:
        st = MPI.Status()
        comm.Probe(0, MPI.ANY_TAG, st)
        buf = bytearray(st.Get_count(MPI.BYTE))
        comm.Recv([buf, MPI.BYTE], 0, st.Get_tag())
        sizes.append((st.Get_tag(), len(buf)))
        if st.Get_tag() == 9:
            break
    print("worker", sizes, flush=True)
"""


def test_posted_work_ends_unsent_is_empty_and_stop_comes_after_it(tmp_path: Path) -> None:
    script = tmp_path / "post.py"
    script.write_text(SCRIPT)
    res = run_mpiexec(mpiexec_command(2, [sys.executable, str(script)]), timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = res.stdout.splitlines()
    assert "posted None None" in lines
    assert "unsent []" in lines
    assert "posted None" in lines
    assert "stop True" in lines
    assert "worker [(7, 100000), (7, 5000), (7, 5), (9, 2)]" in lines
