"""The feeder's room: what a feeding Spark task runs (InputMode.SPARK; train and inference).

* ``task``  Arrow record batches of a partition to the nodes through the core's producers, and
            inference results back, paired with their inputs
* ``worker``  once per Spark Python worker that runs Ember's code: Spark's per-task re-read of
            every zip on sys.path and the cyclic collector's walks of the loaded modules made
            small (also used by ember.ml's transform)

The driver's room (ember._driver.feed) plans the feeding jobs and closes epochs; the node reads
with ember.feed.DataFeed.  Shared with them: ember._arrow_rows (RDD rows <-> Arrow batches).
"""
