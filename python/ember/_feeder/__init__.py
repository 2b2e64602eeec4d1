"""The feeder's room: what a feeding Spark task runs (InputMode.SPARK; train and inference).

* ``task``  Arrow record batches of a partition to the nodes through the core's producers, and
            inference results back, paired with their inputs

The driver's room (ember._driver.feed) plans the feeding jobs and closes epochs; the node reads
with ember.feed.DataFeed.  Shared with them: ember._arrow_rows (RDD rows <-> Arrow batches).
"""
