"""Entry point of a prefork executor process: ``python -m ackwise.worker._child APP JOB_FD RESULT_FD PID``."""

from __future__ import annotations

import signal
import sys

if __name__ == "__main__":
    # Stopping belongs to the supervisor (child_main says why): taken first thing, before the
    # imports below, so that a SIGTERM sent to the whole process group while this child
    # still starts does not kill it either.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)

    from ackwise.contract._logconfig import configure_from_env
    from ackwise.worker._executors import child_main

    # Log as the worker does (its level and format, handed down by the executor), marked
    # as a child so that a task's own lines can be told from the supervisor's.
    configure_from_env(
        text_format="%(asctime)s %(levelname)s [child %(process)d] %(name)s: %(message)s"
    )
    app_path, job_fd, result_fd, parent = sys.argv[1:5]
    child_main(app_path, int(job_fd), int(result_fd), int(parent))
