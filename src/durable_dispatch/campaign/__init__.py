"""The master's durable campaign state and its rules: the state directory, the journals' replay,
the submissions, the delivery of commits to the user's callbacks, dependencies, operator
commands and offline maintenance. It may import ``core``, ``storage`` and the small modules at
the package's top, never ``views``, ``mpi``, ``futures``, ``testing`` or ``cli``.

User code runs at one point only, the delivery point: :meth:`CampaignState.deliver
<durable_dispatch.campaign.state.CampaignState.deliver>`. The library's steps (a turn of the
master's loop: ``on_ready``, ``on_results``, ``next_send``, ``tick`` ...; an open; an operator's
command; the close) change the state and queue what the user must hear (``delivery.py``); the
master's loop calls ``deliver`` once a turn, and the close once more. It first does the library's
part with no user code: it closes in the core the commits an fsync covers (which releases what
waits for them) and persists what follows. Then, on that consistent state, it runs the user's:
the commits a crash left undelivered, each commit's ``on_commit``, the notices (``on_defer``,
``on_cancel``, ``on_dispatch``, ``on_worker_up``, ``on_worker_gone``) and the per-turn hooks (a
work source's refill, a progress report). What a hook returns or does (children, a submit, a
cancel) is a new input of its own: it never re-enters the step that queued it.
"""
