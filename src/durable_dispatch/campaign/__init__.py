"""The master's durable campaign state and its rules: the state directory, the journals' replay,
the submissions, the delivery of commits to the user's callbacks, dependencies, operator
commands and offline maintenance. It may import ``core``, ``storage`` and the small modules at
the package's top, never ``views``, ``mpi``, ``futures``, ``testing`` or ``cli``.

User code runs at one point only: :meth:`CampaignState.deliver
<durable_dispatch.campaign.state.CampaignState>`'s delivery point in the master's loop, after the
state is consistent; what a callback returns enters the next step as input.
"""
