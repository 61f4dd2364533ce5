"""The master's durable campaign state and its rules: the state directory, the journals' replay,
the submissions, the delivery of commits to the user's callbacks, dependencies, operator
commands and offline maintenance. It may import ``core``, ``storage`` and the small modules at
the package's top, never ``views``, ``mpi``, ``futures``, ``testing`` or ``cli``.

User code runs at one point only, the delivery point: ``Delivery._complete_commits`` in
``delivery.py``, which the master's loop reaches once a turn, in ``CampaignState.tick`` (step 4
of the turn, before the watchdog's sweep), and again at the end of a run and at the close. It
first does the library's part with no user code: it takes the commits an fsync covers off the
pending list, closes them in the core (which releases what waits for them) and persists what
follows. Then, on that consistent state, it runs the user's: each commit's ``on_commit``, then
the ``on_defer`` and ``on_cancel`` notices that waited for it (``_apply`` only persists and
queues them). What a callback returns or does (children, a submit, a cancel) is a new input of
its own: it never re-enters the walk that called it, which holds only the records it took.
"""
