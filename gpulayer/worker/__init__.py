"""The worker agent and the in-job runners (``process``: a task's process tree;
``function_runner``: the stdlib-only script that calls a FunctionJob's function)."""
