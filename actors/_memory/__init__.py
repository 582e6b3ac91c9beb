"""Memory: an agent's conversation compacted into its summary, and the digest of earlier
attempts of a task.

- ``_compaction.py``: ``Compaction``.
- ``_digest.py``: Attempts that learn.
- ``_summarizer.py``: Compaction of an agent's conversation into its summary section
  (``Agent(memory=Compaction(...))``).

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors``.
"""
