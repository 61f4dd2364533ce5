"""What operators read from a state directory, live or not: one computed view of a campaign and
the faces that show it (``stats``, ``watch``, ``report``, the joblog, the history, ``verify``).
Read-only. It may import ``campaign``, ``core``, ``storage`` and the small modules at the
package's top, never ``mpi``, ``futures``, ``testing`` or ``cli``.
"""
