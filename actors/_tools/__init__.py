"""Tools: typed Python functions a model can call, their schemas, the toolbox of an agent
and the approvals of a person in the loop.

- ``_approval.py``: Tool calls a person approves first: a human in the loop.
- ``_schema.py``: From a typed Python function to a tool's JSON schema (used by
  ``@tool``).
- ``_tool.py``: Tools: typed Python functions that a model can call, and the toolbox
  that runs them.
- ``_toolbox.py``: ``Toolbox``.

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors``.
"""
