"""`forge run`: trials (provision -> oracle -> state checks -> logs -> teardown), results on disk.

Layout: ``lifecycle`` (the trial state machine, pure), ``events`` (append-only log and the one fold),
``grading`` (pure arithmetic), ``checks`` and ``oracle`` (observing and acting on a stack), ``results``
(files on disk), ``execute`` (the orchestrator), ``cli`` (``main_run``).
"""
