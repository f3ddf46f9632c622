"""The ``jupyter infer`` commands (``cli`` dispatches): ``demo``, ``loadgen``, ``soak``,
``serve``, ``bench`` and ``make-model`` (with the model builders it uses)."""
