"""A rank whose launching process dies stops itself, instead of waiting ``timeout_s`` for
messages that will never come (with popen, rank 0 is the parent of the other ranks)."""

from __future__ import annotations

import os
import sys
import threading
import time


def exit_when_parent_dies(
    who: str, parent_role: str = "its launching process", poll_s: float = 1.0
) -> threading.Thread:
    """Start a daemon thread that ends this process (exit code 1, a message on stderr) within
    ``poll_s`` seconds of its parent process exiting for any reason, SIGKILL included."""
    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(poll_s)
            if os.getppid() != parent:
                sys.stderr.write(
                    f"{who}: {parent_role} (pid {parent}) has exited; stopping this rank instead of waiting "
                    f"for its messages\n"
                )
                sys.stderr.flush()
                os._exit(1)

    thread = threading.Thread(target=watch, name="repro-parent-watchdog", daemon=True)
    thread.start()
    return thread
