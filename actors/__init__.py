"""fractor's LLM agents, built as actors on the ``runtime`` kernel."""

__all__: list[str] = []
