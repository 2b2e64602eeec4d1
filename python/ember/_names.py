"""Names the executor side (launchers) and the driver share: roles and coordinator keys.

The lowest module of the package: it imports only the native core, so both sides can use it
without importing each other.  The roles are the core's (include/ember/roles.h).
"""
from __future__ import annotations

from ember._ember import ROLES, TRAINING_ROLES

# Roles that train and are fed (TFoS counts these as "workers"), in rank order.
WORKER_ROLES = TRAINING_ROLES
# Roles that do not train: their nodes run until the driver stops them.
SUPPORT_ROLES = tuple(role for role in ROLES if role not in TRAINING_ROLES)

# Keys in the coordinator's key/value store.
TENSORBOARD_URL_KEY = "ember/tensorboard_url"      # the URL of the TensorBoard a launcher started
FEED_ENDPOINT_KEY = "ember/feed/{executor_id}"     # NodeEndpoint.encode() of a training node's feed
NODE_END_KEY = "ember/node-end/{executor_id}"      # how a fed node ended, as its feed was told
