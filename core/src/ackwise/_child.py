"""Entry point of a prefork executor process: ``python -m ackwise._child APP JOB_FD RESULT_FD PID``."""

from __future__ import annotations

import logging
import sys

from ackwise._executors import child_main

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.WARNING, format="%(asctime)s %(levelname)s [child] %(message)s"
    )
    app_path, job_fd, result_fd, parent = sys.argv[1:5]
    child_main(app_path, int(job_fd), int(result_fd), int(parent))
