"""The launcher's room: what a node-launching Spark task runs (one barrier task per node).

* ``task``       the task's body: register the node, start its process with its start-up
                 message, forward its output, report how it ended (``run_partition``)
* ``proc``       child processes in a group of their own that die with the launcher
* ``ring_owner`` the node's feed ring in /dev/shm goes with its launcher, even on SIGKILL

It imports the node's environment rule (ember._node.env) but never the driver's room.
"""
