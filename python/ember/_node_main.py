"""A node's own process: ``python -m ember._node_main``, started by the launcher.

Protocol with the launcher (ember/_launcher.py):
  * stdin carries one pickled dict: ``payload`` (cloudpickled ``(main_fun, args)``),
    ``ctx`` (keyword arguments of Context, including the coordinator address and
    secret, which therefore never appear in argv or the environment) and
    ``traceback_path``;
  * stdout/stderr are pipes the launcher forwards line by line to the driver;
  * exit code 0 means main_fun returned; otherwise the traceback is in
    ``traceback_path`` (absent if the process was killed).
"""
from __future__ import annotations

import atexit
import os
import pickle
import sys
import threading
import traceback


def _run() -> int:
    data = pickle.loads(sys.stdin.buffer.read())
    fd = os.open(os.devnull, os.O_RDONLY)  # user code gets an empty stdin
    os.dup2(fd, 0)
    os.close(fd)

    from ember.context import Context

    ctx = Context(**data["ctx"])
    try:
        main_fun, args = pickle.loads(data["payload"])
        main_fun(args, ctx)
        return 0
    except SystemExit as e:
        if e.code in (None, 0):
            return 0
        error = f"main_fun called sys.exit({e.code!r})\n{traceback.format_exc()}"
    except BaseException:  # noqa: BLE001 - everything a node raises goes to the driver
        error = traceback.format_exc()
    finally:
        ctx._close()
    with open(data["traceback_path"], "w", encoding="utf-8") as f:
        f.write(error)
    return 1


def main() -> None:
    code = _run()
    # Run atexit handlers, but do not let a framework thread that never ends
    # (gRPC servers of TF's collective ops are known to) keep the node alive:
    # exit hard once the handlers ran, or after a bounded wait.
    timer = threading.Timer(10.0, os._exit, args=(code,))
    timer.daemon = True
    timer.start()
    try:
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001 - a closed pipe must not change the exit code
                pass
        os._exit(code)


if __name__ == "__main__":
    main()
