"""Names every process of a job shares: roles and coordinator keys.

The lowest module of the package: it imports only the native core, so both sides can use it
without importing each other.  The roles are the core's (include/ember/roles.h).
"""
from __future__ import annotations

from ember._ember import ROLES, TRAINING_ROLES

# Roles that train and are fed (TFoS counts these as "workers"), in rank order.
WORKER_ROLES = TRAINING_ROLES
# Roles that do not train: their nodes run until the driver stops them.
SUPPORT_ROLES = tuple(role for role in ROLES if role not in TRAINING_ROLES)

# Keys in the coordinator's key/value store: every key the Python layer uses, here and nowhere
# else (docs/wire.md "Key/value namespace"; those C++ builds are in src/coordinator/kv_keys.h).
TENSORBOARD_URL_KEY = "ember/tensorboard_url"      # the URL of the TensorBoard a launcher started
FEED_ENDPOINT_KEY = "ember/feed/{executor_id}"     # NodeEndpoint.encode() of a training node's feed
NODE_END_KEY = "ember/node-end/{executor_id}"      # how a fed node ended, as its feed was told
GPUS_KEY = "ember/gpus/{executor_id}"              # JSON of a node's GPUs (ember._launcher.gpus.published)
PS_SHARD_KEY = "ember/ps/{task_index}"             # "host:port" of ps node task_index's shard (ember.ps.serve)
RUN_RESULT_KEY = "ember/run/result/{executor_id}"  # a run_parallel node's encoded return value
MODEL_KEY = "ember/ml/model"                       # ember.ml: the trained model's .keras bytes (chief)
MODEL_INFO_KEY = "ember/ml/model-info"             # ember.ml: JSON of the model's input and output shapes
TUNE_TASK_KEY = "ember/tune/task/{n}"              # tune: a warm runner's n-th trial, or quit
TUNE_VERDICT_KEY = "ember/tune/verdict/{n}/{k}"    # tune: the answer to report k of task n
TUNE_VALUE_KEY = "ember/tune/value"                # tune: the last trial's encoded value
TUNE_OUTCOME_KEY = "ember/tune/outcome/{n}"        # tune: how task n ended
