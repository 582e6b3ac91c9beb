"""One execution: a task in, steps of model requests and parallel tool calls, one
``Result`` out.

- ``_answering.py``: How an execution of an agent with an ``output_type`` takes its
  answer (``Answers``, a part the ``Execution`` holds; the definition's side is
  ``OutputSpec`` in ``actors._execution._output``).
- ``_calling.py``: How an execution runs the tool calls of one step (``ToolRunner``, a
  part the ``Execution`` holds).
- ``_children.py``: How a step's subagent calls start, as the agent core sees it.
- ``_delegation.py``: The subagent calls of one step.
- ``_execution.py``: One execution.
- ``_output.py``: Typed answers: ``Agent(output_type=T)`` (DESIGN.md section 7, issue
  17).
- ``_recording.py``: What an execution keeps of itself as it runs (``Recorder``, a part
  the ``Execution`` holds).

Each model request goes down the stages of ``actors._requests`` (built once per agent).

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors``.
"""
