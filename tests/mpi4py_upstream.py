"""mpi4py's own futures test file, run against the durable executor (tests/test_mpi4py_suite.py).

:func:`sdist` downloads the sdist of the installed mpi4py version from the package index
(``pip download --no-deps --no-binary mpi4py mpi4py==V``) once into a cache directory;
:func:`prepare` copies its ``demo/futures/test_futures.py`` and ``test/mpitestutil.py`` with the
file's two import lines pointed at ``durable_dispatch.futures`` (through
``tests/children/mpi4py_futures_shim.py``) and nothing else changed; :func:`run` runs it as ONE
job under ``mpiexec -n 2 python -m durable_dispatch.futures --state-dir S`` (unittest ``-v``),
and :func:`outcomes` reads what each test did from unittest's report.

Run by hand: ``python tests/mpi4py_upstream.py [--n 2] [--timeout 1200]`` prints the count and
every test that did not pass.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from durable_dispatch.mpi.launcher import MpiexecResult, mpiexec_command, run_mpiexec

HERE = Path(__file__).resolve().parent
SHIM = HERE / "children" / "mpi4py_futures_shim.py"
#: the two import lines of the file, and what they become
IMPORTS = {
    "from mpi4py import MPI, futures\n": (
        "from mpi4py import MPI; import mpi4py_futures_shim as futures  # durable_dispatch\n"
    ),
    "from mpi4py.futures.aplus import ThenableFuture  # noqa: E402\n": (
        "from durable_dispatch.futures.aplus import ThenableFuture  # noqa: E402\n"
    ),
}


class Unreachable(Exception):
    """The package index could not give the sdist (the reason is the message)."""


def cache_dir() -> Path:
    """Where sdists are kept: ``$DURABLE_DISPATCH_TEST_CACHE``, else
    ``~/.cache/durable-dispatch``."""
    base = os.environ.get("DURABLE_DISPATCH_TEST_CACHE")
    return Path(base) if base else Path.home() / ".cache" / "durable-dispatch"


def installed_version() -> str:
    from importlib.metadata import version

    return version("mpi4py")


def sdist(version: str, cache: Path | None = None) -> Path:
    """The unpacked sdist of mpi4py ``version`` (downloaded once into the cache).

    Raises:
        Unreachable: pip could not download it (no index, no network).
    """
    cache = cache or cache_dir()
    tree = cache / f"mpi4py-{version}"
    if (tree / "demo" / "futures" / "test_futures.py").is_file():
        return tree
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache) as tmp:
        # (--no-binary mpi4py, not :all:, which would build the backend's own requirements,
        # setuptools and others, from their sdists too before it reads the metadata)
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", "mpi4py"]
        cmd += ["-d", tmp, f"mpi4py=={version}"]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            raise Unreachable("pip download of the mpi4py sdist took over 600 s") from None
        archives = list(Path(tmp).glob("mpi4py-*.tar.gz"))
        if not archives:
            tail = (res.stderr or res.stdout).strip().splitlines()[-3:]
            raise Unreachable(f"pip download mpi4py=={version} failed: {' | '.join(tail)}")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")
        shutil.rmtree(tree, ignore_errors=True)
        os.replace(Path(tmp) / f"mpi4py-{version}", tree)
    return tree


def prepare(src: Path, dest: Path) -> Path:
    """Copy the test file and its helper from the sdist ``src`` into ``dest`` (the same layout)
    with only the import lines changed; returns the test file's path."""
    (dest / "demo" / "futures").mkdir(parents=True, exist_ok=True)
    (dest / "test").mkdir(parents=True, exist_ok=True)
    shutil.copy(src / "test" / "mpitestutil.py", dest / "test" / "mpitestutil.py")
    text = (src / "demo" / "futures" / "test_futures.py").read_text()
    for old, new in IMPORTS.items():
        if text.count(old) != 1:
            raise AssertionError(f"the import line {old.strip()!r} is not in the file once")
        text = text.replace(old, new)
    target = dest / "demo" / "futures" / "test_futures.py"
    target.write_text(text)
    shutil.copy(SHIM, dest / "demo" / "futures" / SHIM.name)
    return target


def run(target: Path, state: Path, *, n: int = 2, timeout: float = 1200) -> MpiexecResult:
    """The file as one job: ``mpiexec -n N python -m durable_dispatch.futures --state-dir S``."""
    argv = [sys.executable, "-m", "durable_dispatch.futures", "--state-dir", str(state)]
    cmd = mpiexec_command(n, [*argv, str(target), "-v"])
    return run_mpiexec(cmd, timeout=timeout, cwd=target.parent)


def _name(dotted: str) -> str:
    """``Class.test`` from unittest's ``__main__.Class.test``."""
    return ".".join(dotted.split(".")[-2:])


_OUTCOME = re.compile(r"\b(ok|FAIL|ERROR|skipped '[^'\n]*'|expected failure|unexpected success)$")


def outcomes(report: str) -> dict[str, str]:
    """``{"Class.test": outcome}`` from unittest's ``-v`` report: ``ok``, ``FAIL``, ``ERROR``,
    ``skipped '...'``, ``expected failure``. A line the job's other output split (a log line
    between a test's name and its outcome) is read up to the next outcome."""
    out: dict[str, str] = {}
    starts = list(re.finditer(r"^(test_\w+) \(([\w.]+)\)[^\n]*?\.\.\. ?", report, re.M))
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(report)
        for line in report[m.end() : end].splitlines():
            found = _OUTCOME.search(line.strip())
            if found:
                out[_name(m.group(2))] = found.group(1)
                break
    return out


def passed(result: dict[str, str]) -> list[str]:
    """The tests that passed (``ok``, or skipped by the file itself as not for a shared pool)."""
    return [t for t, o in result.items() if o == "ok" or o.startswith("skipped")]


def errors_of(report: str) -> dict[str, str]:
    """``{"Class.test": last line of its traceback}`` from unittest's failure report."""
    out: dict[str, str] = {}
    blocks = re.split(r"^={50,}\n", report, flags=re.M)
    for b in blocks[1:]:
        m = re.match(r"(?:ERROR|FAIL): (test_\w+) \(([\w.]+)\)", b)
        if not m:
            continue
        body = b.split("-" * 70)[1] if "-" * 70 in b else b
        lines = [x for x in body.strip().splitlines() if x.strip()]
        out[_name(m.group(2))] = lines[-1] if lines else ""
    return out


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=2)
    p.add_argument("--timeout", type=float, default=1200)
    p.add_argument("--keep", help="keep the prepared file and state here")
    a = p.parse_args(argv)
    tree = sdist(installed_version())
    work = Path(a.keep) if a.keep else Path(tempfile.mkdtemp(prefix="mpi4py-suite-"))
    target = prepare(tree, work)
    res = run(target, work / "state", n=a.n, timeout=a.timeout)
    report = res.stdout + res.stderr
    result, why = outcomes(report), errors_of(report)
    ok = passed(result)
    print(f"timed out: {res.timed_out}; exit {res.returncode}")
    print(f"passed {len(ok)} of {len(result)}")
    for t, o in sorted(result.items()):
        if t not in ok:
            print(f"  {t}: {o}: {why.get(t, '')}")
    if a.keep:
        (work / "report.txt").write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
