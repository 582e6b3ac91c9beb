"""Models: the protocol a provider implements (the providers themselves are in
``fractor.actors.providers``), the fake models and their turns, and ReAct.

- ``_fakes.py``: The fake models: ``ScriptedModel``, ``FunctionModel`` and
  ``CycleModel``.
- ``_fallback.py``: A model that falls back: a chain of models, the first that answers
  wins.
- ``_protocol.py``: Models: the protocol a provider implements.
- ``_react.py``: ReAct: tool use for models without native tool calling.
- ``_turns.py``: The turns a fake model serves, and the functions that build them.

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors``.
"""
