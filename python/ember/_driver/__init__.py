"""The driver's room: what runs in the user's driver program, beside ``Cluster``.

* ``gang``      a job's nodes as the driver holds them: coordinator, barrier job, watcher;
                start, waits, restarts, tear-down (``Cluster`` keeps the verbs and delegates)
* ``console``   the driver's output: node lines, progress, one live line under Spark's bar
* ``watcher``   a thread draining the coordinator's events; keeps a job's first node failure
* ``spark_job`` the Spark side of a job: slots, the executors' Python check, job groups, and
                the barrier job that hosts the nodes (its tasks run ember._launcher)
* ``feed``      InputMode.SPARK from the driver: the one epoch loop (``Feed``, the owner of the
                job's epoch state), the feeding Spark jobs (their tasks run ember._feeder),
                epoch boundaries, inference, the end of the feed

Nothing here is imported by code of the other rooms (_launcher, _feeder, _node): the driver
sends them work through Spark closures, never through imports going up.
"""
