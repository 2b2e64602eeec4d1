"""An unchanged torch.distributed program, run as an executable node:
``Cluster.run(spark, [python, "torch_dist_program.py", out_dir])``.

It knows nothing of Ember: ``init_process_group("gloo")`` reads MASTER_ADDR, MASTER_PORT, RANK
and WORLD_SIZE from the environment; each rank allreduces rank + 1 and writes the sum (and the
variables it read) to ``<out_dir>/dist-<rank>.json``.
"""
import json
import os
import sys

import torch
import torch.distributed as dist


def main() -> None:
    dist.init_process_group("gloo")
    t = torch.tensor([float(dist.get_rank() + 1)])
    dist.all_reduce(t)
    env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    with open(os.path.join(sys.argv[1], f"dist-{dist.get_rank()}.json"), "w") as f:
        json.dump({"sum": t.item(), "env": env}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
