"""Ember's settings that come from the environment or the Spark configuration.

This is the only module that reads environment variables or Spark conf; the
values travel from here to the nodes inside the Spark closure and to the
native core as option arguments.  An explicit argument to ``Cluster.run``
wins over the Spark conf key, which wins over the environment variable, which
wins over the default.

=========================  ================================  ================  ==========================================
setting                    Spark conf / environment           default           meaning
=========================  ================================  ================  ==========================================
slot_timeout               spark.ember.slotTimeout            30                seconds Cluster.run waits for enough task
                           EMBER_SLOT_TIMEOUT                                   slots on a cluster whose executors are
                                                                                still registering (local[N] never waits)
coordinator_host           spark.ember.coordinator.host       spark.driver.host address executors use to reach the driver's
                           EMBER_COORDINATOR_HOST                               coordinator
coordinator_bind           spark.ember.coordinator.bind       see meaning       address the coordinator listens on; by
                           EMBER_COORDINATOR_BIND                               default spark.driver.bindAddress if set,
                                                                                else coordinator_host (Spark's own rule
                                                                                for the driver); 0.0.0.0 = every interface
node_bind                  spark.ember.node.bind              see meaning       address a node's listeners (feed server,
                           EMBER_NODE_BIND                                      collective ring, TensorBoard) bind; by
                                                                                default the node's own address, the one
                                                                                it publishes to its peers; 0.0.0.0 = every
                                                                                interface (docs/network.md)
coordinator_port           spark.ember.coordinator.port       0 (any free)      port the coordinator listens on
                           EMBER_COORDINATOR_PORT
coordinator_placement      spark.ember.coordinator.placement  auto              where the nodes reach the coordinator:
                           EMBER_COORDINATOR_PLACEMENT                          "client" (they dial this process),
                                                                                "job" (they dial a relay on an executor
                                                                                that this process dials out to), "auto"
                                                                                (client under a classic session; under
                                                                                Spark Connect client if an executor can
                                                                                dial it, else job)
connect_timeout            spark.ember.connectTimeout         30                seconds a node may take to connect to the
                           EMBER_CONNECT_TIMEOUT                                coordinator (connect + handshake)
executor_check_timeout     spark.ember.executorCheckTimeout   120               seconds the check that the executors' Python
                           EMBER_EXECUTOR_CHECK_TIMEOUT                         imports this Ember may take (one tiny Spark
                                                                                job before the first nodes of an application)
feed_source                spark.ember.feed.source            auto              InputMode.SPARK: what cluster.train feeds
                           EMBER_FEED_SOURCE                                    from a DataFrame: "auto" (a plain Parquet
                                                                                scan's files, which the nodes read in place;
                                                                                any other DataFrame's rows) or "spark"
                                                                                (always its rows, through Spark)
feed_cache_dir             spark.ember.feed.cacheDir          None              InputMode.SPARK: a directory every node can
                           EMBER_FEED_CACHE_DIR                                 read (HDFS, shared storage) where
                                                                                cluster.train writes a DataFrame that is
                                                                                not a plain Parquet scan once as Parquet
                                                                                when it trains >= 2 epochs; the nodes
                                                                                read it in place; removed at the job's end
kill_grace_secs            spark.ember.killGraceSecs          3                 seconds a stopped node gets between SIGTERM
                           EMBER_KILL_GRACE_SECS                                and SIGKILL
feed_ring_bytes            spark.ember.feed.ringBytes         67108864          InputMode.SPARK: size of each training node's
                           EMBER_FEED_RING_BYTES                                shared-memory feed ring (64 MiB)
feed_transport             spark.ember.feed.transport         auto              InputMode.SPARK: "auto" (shared memory when the
                           EMBER_FEED_TRANSPORT                                 node is on the task's host, else TCP), "shm"
                                                                                or "tcp"
spark_progress             spark.ember.console.sparkProgress  hide              Spark's console progress bar while a job's
                           EMBER_CONSOLE_SPARK_PROGRESS                         nodes print: "hide" (held off, drawn again
                                                                                after the job) or "show" (drawn, and node
                                                                                lines start on a line of their own);
                                                                                spark.ui.showConsoleProgress=false removes
                                                                                the bar for good
=========================  ================================  ================  ==========================================
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Optional


@dataclasses.dataclass(frozen=True)
class Setting:
    name: str
    conf_key: str
    env_var: str
    default: Any
    parse: Callable[[str], Any]
    doc: str


def _choice(*choices: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ValueError(f"expected one of {', '.join(choices)}")
        return value
    return parse


SETTINGS = {
    s.name: s
    for s in [
        Setting("slot_timeout", "spark.ember.slotTimeout", "EMBER_SLOT_TIMEOUT", 30.0, float,
                "seconds Cluster.run waits for enough task slots (not in local mode)"),
        Setting("coordinator_host", "spark.ember.coordinator.host", "EMBER_COORDINATOR_HOST", None,
                str, "address executors use to reach the driver's coordinator"),
        Setting("coordinator_bind", "spark.ember.coordinator.bind", "EMBER_COORDINATOR_BIND",
                None, str, "address the coordinator listens on (default: spark.driver.bindAddress, "
                "else coordinator_host)"),
        Setting("node_bind", "spark.ember.node.bind", "EMBER_NODE_BIND", None, str,
                "address a node's listeners bind (default: the node's own published address)"),
        Setting("coordinator_port", "spark.ember.coordinator.port", "EMBER_COORDINATOR_PORT", 0,
                int, "port the coordinator listens on (0 = any free port)"),
        Setting("coordinator_placement", "spark.ember.coordinator.placement", "EMBER_COORDINATOR_PLACEMENT",
                "auto", str, "where the nodes reach the coordinator: auto, client or job (a relay in the job)"),
        Setting("connect_timeout", "spark.ember.connectTimeout", "EMBER_CONNECT_TIMEOUT", 30.0,
                float, "seconds a node may take to connect to the coordinator"),
        Setting("executor_check_timeout", "spark.ember.executorCheckTimeout", "EMBER_EXECUTOR_CHECK_TIMEOUT",
                120.0, float, "seconds the check that the executors' Python imports this Ember may take"),
        Setting("feed_ring_bytes", "spark.ember.feed.ringBytes", "EMBER_FEED_RING_BYTES", 64 << 20, int,
                "bytes of each training node's shared-memory feed ring"),
        Setting("feed_transport", "spark.ember.feed.transport", "EMBER_FEED_TRANSPORT", "auto", str,
                "how feeding tasks reach nodes: auto, shm or tcp"),
        Setting("feed_source", "spark.ember.feed.source", "EMBER_FEED_SOURCE", "auto", _choice("auto", "spark"),
                "what cluster.train feeds from a DataFrame: auto (a plain Parquet scan's files, read by the "
                "nodes in place; else its rows) or spark (its rows)"),
        Setting("feed_cache_dir", "spark.ember.feed.cacheDir", "EMBER_FEED_CACHE_DIR", None, str,
                "a directory every node can read (HDFS or shared storage) where cluster.train writes a "
                "DataFrame that is not a plain Parquet scan once as Parquet, when it trains >= 2 epochs, for "
                "the nodes to read in place; removed when the job ends (unset: its rows are fed)"),
        Setting("kill_grace_secs", "spark.ember.killGraceSecs", "EMBER_KILL_GRACE_SECS", 3.0,
                float, "seconds between SIGTERM and SIGKILL when a node is stopped"),
        Setting("spark_progress", "spark.ember.console.sparkProgress", "EMBER_CONSOLE_SPARK_PROGRESS", "hide",
                _choice("hide", "show"), "Spark's console progress bar while nodes print: hide or show"),
    ]
}


def _spark_conf(spark: Any, key: str) -> Optional[str]:
    """Setting `key` of a SparkSide (ember._driver.spark_side: classic or Spark Connect), a
    classic SparkSession or a SparkContext; None if unset."""
    if callable(getattr(spark, "conf", None)):  # a SparkSide
        return spark.conf(key)
    return getattr(spark, "sparkContext", spark).getConf().get(key, None)


def get(name: str, sc: Any = None, explicit: Optional[Any] = None) -> Any:
    """The value of setting `name`: `explicit` if not None, else Spark conf, env, default.

    Args:
        name: a key of SETTINGS.
        sc: a SparkSide (ember._driver.spark_side), SparkSession or SparkContext whose
            application settings are consulted, or None.
        explicit: a value passed by the caller (e.g. an argument of Cluster.run).

    Raises:
        ValueError: the configured text does not parse; the message names the source.
    """
    setting = SETTINGS[name]
    if explicit is not None:
        return explicit
    sources = []
    if sc is not None:
        sources.append((f"Spark conf {setting.conf_key}", _spark_conf(sc, setting.conf_key)))
    sources.append((f"environment variable {setting.env_var}", os.environ.get(setting.env_var)))
    for where, text in sources:
        if text is None or text == "":
            continue
        try:
            return setting.parse(text)
        except ValueError as e:
            raise ValueError(f"{where}={text!r} is not a valid {setting.name} ({setting.doc}): {e}") from e
    return setting.default
