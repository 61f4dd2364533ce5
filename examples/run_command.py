"""Run an external program per item, its process group killed at the deadline
(docs/how-to/isolation-and-timeouts.md)."""

from durable_dispatch import run_command


def fuzz_one(payload):
    out = run_command(["./target", payload["input"]], timeout=60, max_output=1 << 20)
    return {
        "rc": out.returncode,
        "signal": out.signal,
        "timed_out": out.timed_out,
        "stderr_sha256": out.stderr_sha256,
    }


if __name__ == "__main__":
    print(run_command(["sh", "-c", "echo hello; sleep 30"], timeout=1))
