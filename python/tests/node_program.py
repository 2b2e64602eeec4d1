"""A node program that is not ember._node.main: what Cluster.run(spark, [argv...]) starts.

    python node_program.py <out_dir> [--fail]

Reads its start-up message as any program must (the descriptor in EMBER_STARTUP_FD),
records what it learnt and what it was given (argv, environment -- the variables of
NODE_ENV_KEYS as they are --, stdin) as JSON, and,
with --fail, prints to stderr and exits with status 3.
"""
import json
import os
import sys

from ember import _ember

# What every node's environment has, whatever program it runs (ember/_node/env.py), and
# EMBER_NODE_BIND, which the launcher does not set (the bind address is in the start-up message).
NODE_ENV_KEYS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "TF_CONFIG",
                 "TF_CPP_MIN_LOG_LEVEL", "EMBER_JOB_ID", "PYTHONUNBUFFERED", "EMBER_NODE_BIND")


def main() -> int:
    out_dir, flags = sys.argv[1], sys.argv[2:]
    fd = int(os.environ["EMBER_STARTUP_FD"])
    node = _ember.read_node_startup(fd)
    os.close(fd)
    secret = node.secret.hex()
    info = dict(
        executor_id=node.executor_id, job_name=node.job_name, task_index=node.task_index,
        cluster_spec=node.cluster_spec, job_id=node.job_id, payload=node.payload.hex(),
        argv=sys.argv, stdin=sys.stdin.read(),
        tf_config=json.loads(os.environ["TF_CONFIG"]),
        env={k: os.environ.get(k) for k in NODE_ENV_KEYS},
        secret_in_env=any(secret in v or node.secret.decode("latin-1") in v for v in os.environ.values()),
        secret_in_argv=any(secret in a for a in sys.argv), secret_len=len(node.secret))
    with open(os.path.join(out_dir, f"{node.job_name}-{node.task_index}.json"), "w") as f:
        json.dump(info, f)
    if "--fail" in flags and node.task_index == 1:
        print("about to fail: the model diverged", file=sys.stderr, flush=True)
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
