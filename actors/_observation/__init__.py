"""Observation: an execution's events, the stream of an ask, and traces (the live view is
the command line's, ``fractor.actors.cli``).

- ``_events.py``: The events of the agent layer: one frozen Struct per kind, defined
  here once.
- ``_stream.py``: Streaming an ask.
- ``_subtree.py``: What the agent layer keeps with a subtree, in its top node's
  ``Node.layer``: where its executions leave themselves, who watches its events.
- ``_traces.py``: Execution traces outside the actor: export, load, collect from a
  store, render.
- ``_lines.py``: What the live views write in words (the latest streamed line of each
  execution, progress lines): the terminal's (``fractor.actors.cli``) and the web
  view's (``fractor.actors.ui``) alike.

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors``.
"""
