"""The runner: ``mpiexec -n N python -m durable_dispatch.futures [--state-dir D] TARGET``.

``TARGET`` is ``script.py [args]``, ``-m module [args]`` or ``-c command [args]``, as for
``python`` and mpi4py's ``python -m mpi4py.futures``. Rank 0 runs it as ``__main__``; every
other rank imports the script (or module) as ``__mp_main__``, as ``multiprocessing`` does, so
the functions it defines can be found by name, then serves every executor rank 0 makes,
several at once when several are open (:func:`~durable_dispatch.futures._serve.serve`). When
the target ends, the executors it left open finish their calls, the workers are told to exit,
and the job ends with the target's status. An exception in the target ends the whole job
non-zero within seconds, never a hang.

``--state-dir D``: executors made without ``state_dir=`` keep their state in ``D/executor-<k>``
(also ``$DURABLE_DISPATCH_STATE_DIR``).
"""

from __future__ import annotations

import os
import runpy
import sys

_USAGE = (
    "usage: mpiexec -n N python -m durable_dispatch.futures [--state-dir D] "
    "(script.py | -m module | -c command) [args ...]"
)


def _parse(argv: list[str]) -> tuple[str | None, str, str, list[str]]:
    """``(state_dir, kind, target, args)``; kind is ``path``, ``module`` or ``command``."""
    state_dir = None
    i = 0
    while i < len(argv):
        a = argv[i]
        if a in ("-h", "--help"):
            print(_USAGE)
            sys.exit(0)
        if a == "--state-dir" and i + 1 < len(argv):
            state_dir, i = argv[i + 1], i + 2
        elif a.startswith("--state-dir="):
            state_dir, i = a.split("=", 1)[1], i + 1
        elif a in ("-m", "-c") and i + 1 < len(argv):
            kind = "module" if a == "-m" else "command"
            return state_dir, kind, argv[i + 1], argv[i + 2 :]
        elif a.startswith("-"):
            break
        else:
            return state_dir, "path", a, argv[i + 1 :]
    print(_USAGE, file=sys.stderr)
    sys.exit(2)


def main(argv: list[str] | None = None) -> int:
    """Run the target on rank 0 and serve its executors on the others; the exit status."""
    state_dir, kind, target, args = _parse(list(sys.argv[1:] if argv is None else argv))
    from mpi4py import MPI

    from .. import mpi  # noqa: F401 - U8: an exception on any rank ends the job
    from ..mpi.master import finish
    from . import _executor, _serve

    comm = MPI.COMM_WORLD
    if kind == "path":
        sys.argv = [target, *args]
        sys.path[0] = os.path.dirname(os.path.abspath(target))
    elif kind == "module":
        sys.argv = [target, *args]
    else:
        sys.argv = ["-c", *args]
    if comm.Get_rank() != 0:
        import multiprocessing.spawn as spawn

        if kind == "path":
            spawn.import_main_path(target)
        elif kind == "module":
            spawn._fixup_main_from_name(target)  # type: ignore[attr-defined]
        _serve.serve(comm)
        finish(comm)
        return 0
    _executor.JOB["runner"] = True
    _executor.JOB["state_dir"] = state_dir
    code: int | str | None = 0
    try:
        if kind == "path":
            runpy.run_path(target, run_name="__main__")
        elif kind == "module":
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            import types

            module = types.ModuleType("__main__")
            saved, sys.modules["__main__"] = sys.modules["__main__"], module
            try:
                exec(compile(target, "<string>", "exec"), module.__dict__)
            finally:
                sys.modules["__main__"] = saved
    except SystemExit as e:
        code = e.code
    _executor.shutdown_all()
    _serve.exit_workers(comm)
    status = code if isinstance(code, int) else (0 if code is None else 1)
    if isinstance(code, str):
        print(code, file=sys.stderr)
    finish(comm, status)
    return status


if __name__ == "__main__":
    sys.exit(main())
