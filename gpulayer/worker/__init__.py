"""The worker agent and the in-job runners (``process``: a task's process tree;
``function_runner``: the stdlib-only script that calls a FunctionJob's function)."""

#: environment variable each task's main process gets, set to a fresh id
#: (:func:`gpulayer.worker.process.run_process`); every descendant that keeps its environment
#: carries it, which is how escaped descendants are found. (Here, without imports: the CLI's
#: start-up reads it too.)
TREE_ID_ENV = "GPULAYER_TREE_ID"
