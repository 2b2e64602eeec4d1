"""Names the executor side (launchers) and the driver share: roles and coordinator keys.

The lowest module of the package: it imports nothing, so both sides can use it
without importing each other.
"""
from __future__ import annotations

# Roles that train and are fed (TFoS counts these as "workers").
WORKER_ROLES = ("chief", "master", "worker")

# Keys in the coordinator's key/value store.
TENSORBOARD_URL_KEY = "ember/tensorboard_url"      # the URL of the TensorBoard a launcher started
FEED_ENDPOINT_KEY = "ember/feed/{executor_id}"     # NodeEndpoint.encode() of a training node's feed
NODE_END_KEY = "ember/node-end/{executor_id}"      # how a fed node ended, as its feed was told
