"""The agent and its actor: an ``Agent`` definition, the ``AgentActor`` running it, the
``AgentRef`` handle, its supervision policies and what it keeps in a store.

- ``_actor.py``: ``AgentActor``: an ``Agent`` definition running, one task at a time.
- ``_agent.py``: ``Agent``: the immutable definition of an agent, checked when it is
  made.
- ``_definition.py``: ``AgentDefinition``: what an agent is, checked when it is made;
  the bottom of the agent core.
- ``_persistence.py``: What an agent keeps in the runtime's store, and how it is
  encoded.
- ``_policy.py``: Supervision policies of an agent (DESIGN.md section 4).
- ``_ref.py``: ``AgentRef``: the handle to a running agent, and the questions it asks.

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors``.
"""
