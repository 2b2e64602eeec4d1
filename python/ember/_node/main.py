"""A node's own process: ``python -m ember._node.main``, started by the launcher.

Protocol with the launcher (ember/_launcher/task.py), the same for every node program:
  * the descriptor named by EMBER_STARTUP_FD carries one typed start-up message
    (docs/wire.md, "Node start-up"; decoded by the C++ core) up to end of file:
    the node's context, including the coordinator address and secret, which
    therefore never appear in argv or the environment.  Its opaque ``payload``
    is the cloudpickled ``(main_fun, args)``, the only pickle: it is user code;
  * stdin is /dev/null; stdout/stderr are pipes the launcher forwards line by
    line to the driver;
  * exit code 0 means main_fun returned; otherwise the traceback is in the
    message's ``traceback_path`` (absent if the process was killed).
"""
from __future__ import annotations

import atexit
import os
import pickle  # the payload only: cloudpickled user code
import sys
import threading
import traceback


def _read_startup():
    """The NodeContext from the launcher's pipe; the descriptor is closed and its
    variable removed, so that processes main_fun starts do not inherit either."""
    from ember import _ember

    name = _ember.STARTUP_FD_ENV
    value = os.environ.pop(name, "")
    if not value.isdigit():
        raise SystemExit(f"ember._node.main: {name} is not set; nodes are started by ember.Cluster.run")
    fd = int(value)
    try:
        return _ember.read_node_startup(fd)
    finally:
        os.close(fd)


def _run() -> int:
    node = _read_startup()

    from ember.context import Context

    ctx = Context.from_node_context(node)
    from ember import context
    context._current = ctx  # ember.data and friends find the node's context
    from ember import collective, summary
    if ctx.log_dir:
        summary.set_default(ctx.summary_writer)  # ember.keras / ember.torch metrics writers
        if ctx.gpus:  # TensorBoard's Text tab names each node's GPUs (its run is the node's directory)
            ctx.summary_writer().text("ember/gpus", f"{ctx.job_name}:{ctx.task_index}: CUDA_VISIBLE_DEVICES="
                                      f"{','.join(ctx.gpus)} (cuda:0..{len(ctx.gpus) - 1} inside the node)", 0)
    if ctx.training_rank is not None:
        collective.set_default(ctx.communicator)  # ember.keras / ember.torch find the job's nodes
    # MASTER_ADDR, RANK, WORLD_SIZE... are in the environment already: the launcher sets them for
    # every node program (ember/_node/env.py).
    try:
        main_fun, args = pickle.loads(node.payload)
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
    with open(node.traceback_path, "w", encoding="utf-8") as f:
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
