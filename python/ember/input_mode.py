"""How data reaches the nodes (TFoS's InputMode)."""
import enum


class InputMode(enum.IntEnum):
    """TENSORFLOW: main_fun reads its own data (tf.data from files).
    SPARK: the driver feeds a DataFrame/RDD to the nodes (``cluster.train``)."""

    TENSORFLOW = 0
    SPARK = 1
