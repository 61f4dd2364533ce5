"""mpi4py.futures' documented API beyond the executor, under the runner (``python -m
durable_dispatch.futures``, 3 ranks): ``get_comm_workers()`` inside a call run in a worker rank
(``isolate=False``) and its refusal elsewhere; mpi4py's constructor keywords (``path``, ``wdir``,
``env`` and ``globals`` applied where the calls run, the others accepted); re-entering an
``MPICommExecutor``; ``MPI4PY_FUTURES_MAX_WORKERS``. Prints one line per check."""

import os
import sys

from mpi4py import MPI

from durable_dispatch.futures import MPICommExecutor, MPIPoolExecutor, get_comm_workers


def comm_workers():
    comm = get_comm_workers()  # rank i of it is worker rank i + 1
    return comm.Get_size(), comm.Get_rank() == MPI.COMM_WORLD.Get_rank() - 1


def where(name):
    return (
        os.getcwd(),
        os.environ.get("FROM_ENV"),
        sys.path[-1],
        globals().get(name),
    )


def mark(where):
    open(os.path.join(where, str(os.getpid())), "w").close()


def refused():
    try:
        get_comm_workers()
    except RuntimeError as e:
        return str(e)
    return "not refused"


if __name__ == "__main__":
    tmp = sys.argv[1]
    with MPIPoolExecutor(isolate=False) as ex:
        print("comm", ex.submit(comm_workers).result(), flush=True)
    try:
        get_comm_workers()
    except RuntimeError:
        print("rank 0 refused", flush=True)
    with MPIPoolExecutor() as ex:
        print("isolated", "isolated child" in ex.submit(refused).result(), flush=True)
    for isolate in (False, True):
        with MPIPoolExecutor(
            isolate=isolate,
            python_exe=sys.executable,
            python_args=["-B"],
            mpi_info={"soft": "0:1"},
            main=False,
            use_pkl5=True,
            backoff=0.001,
            path=[os.path.join(tmp, "extra")],
            wdir=tmp,
            env={"FROM_ENV": "yes"},
            globals={"the_answer": 42},
        ) as ex:
            cwd, env, path, answer = ex.submit(where, "the_answer").result()
            print("kw", isolate, cwd == tmp, env, path == os.path.join(tmp, "extra"), answer)
    m = MPICommExecutor(MPI.COMM_WORLD, 0)
    with m as ex:
        try:
            with m:
                pass
        except RuntimeError:
            print("re-entry refused", flush=True)
        print("inside", ex.submit(abs, -3).result(), flush=True)
    with m as ex:  # once left, the same instance may be entered again
        print("again", ex.submit(abs, -4).result(), flush=True)
    os.environ["MPI4PY_FUTURES_MAX_WORKERS"] = "1"
    with MPIPoolExecutor() as ex:
        print("max workers", ex.num_workers, flush=True)
    # bootup(wait=True) returns once the workers are up: their isolated children started,
    # and ran the initializer (which each runs when it starts)
    del os.environ["MPI4PY_FUTURES_MAX_WORKERS"]
    marks = os.path.join(tmp, "marks")
    os.mkdir(marks)
    ex = MPIPoolExecutor(initializer=mark, initargs=(marks,)).bootup(wait=True)
    print("booted", len(os.listdir(marks)), flush=True)
    ex.shutdown()
