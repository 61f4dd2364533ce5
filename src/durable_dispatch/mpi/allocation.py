"""The allocation's end, as the master reads it: :mod:`durable_dispatch.batch` (the batch
system is read outside the MPI shell; this name stays for the master's import)."""

# issue 67: the module moved to durable_dispatch/batch.py (it imports no MPI); mpi/master.py
# imports AllocationEnd from here until its import names batch (a file others edit now).
from ..batch import AllocationEnd

__all__ = ["AllocationEnd"]
