"""Elephas 7.3.0 serving an embedding table, for bench/ps_sparse.py: run with the interpreter of
bench/.elephas-venv (Elephas pins its own TensorFlow, numpy and pyspark), never imported by
Ember.  Elephas has no sparse path: its asynchronous worker gets the whole model and sends a
delta of the whole model for every update (``AsynchronousSparkWorker.train``, ``frequency="batch"``:
``get_parameters()``, ``train_on_batch``, ``subtract_params(before, after)``,
``update_parameters(deltas)``).  Two commands:

  server --mode http|socket --port P --vocab V --dim D
      serves a Keras model holding one Embedding(V, D) (float32) with Elephas's HttpServer or
      SocketServer, mode asynchronous; prints "ready"
  worker --mode http|socket --port P --vocab V --dim D --batch B --zipf A --seed S --seconds T
      draws its batches of B skewed ids (bench/ps_sparse.py's distribution, folded into V), gets
      the parameters, gathers the batch's rows (what the model reads), scatters the batch's
      row updates into a zero delta of the table's shape (what subtract_params gives: the rows
      the batch touched, zeros elsewhere) and sends it; prints "ready", waits for a line on
      stdin, loops for T seconds, prints {"steps", "secs", "cpu", "pull_s", "push_s", "distinct"}
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # Elephas's determine_master: this host's loopback

from _elephas_ps import client as elephas_client, serve  # noqa: E402  (this directory, run as a script)

SCRAMBLE = 2654435761  # a prime: rank -> id is a bijection of [0, V) (ps_sparse.py uses the same)


def skewed_ids(rng, n: int, vocab: int, a: float):
    """n ids in [0, vocab): Zipf(a) ranks folded into the vocabulary, then scattered over it as
    hashed feature ids are (bench/ps_sparse.py's draw, repeated here: no shared module between
    the two interpreters)."""
    import numpy as np
    ranks = (rng.zipf(a, size=n) - 1) % vocab
    return (ranks * SCRAMBLE % vocab).astype(np.int64)


def server(args) -> None:
    import keras
    from elephas.utils.serialization import model_to_dict

    model = keras.Sequential([keras.Input((1,), dtype="int32"), keras.layers.Embedding(args.vocab, args.dim)])
    serve(model_to_dict(model), args.mode, args.port)


def worker(args) -> None:
    import numpy as np

    client = elephas_client(args.mode, args.port)
    rng = np.random.default_rng(args.seed)
    batches = skewed_ids(rng, args.pool * args.batch, args.vocab, args.zipf).reshape(args.pool, args.batch)
    grad = rng.standard_normal((args.batch, args.dim)).astype(np.float32) * 1e-4
    distinct = float(np.mean([np.unique(b).size for b in batches]))

    def step(ids):
        t0 = time.perf_counter()
        weights = client.get_parameters()
        rows = weights[0][ids]  # the batch's rows, what the model reads
        t1 = time.perf_counter()
        delta = np.zeros_like(weights[0])
        delta[ids] = grad  # the touched rows; zeros elsewhere
        client.update_parameters([delta])
        del rows
        return t1 - t0, time.perf_counter() - t1

    step(batches[0])  # warm-up
    print("ready", flush=True)
    sys.stdin.readline()
    n, pull_s, push_s = 0, 0.0, 0.0
    start, cpu = time.perf_counter(), time.process_time()
    while time.perf_counter() - start < args.seconds:
        p, q = step(batches[n % args.pool])
        pull_s += p
        push_s += q
        n += 1
    print(json.dumps({"steps": n, "secs": time.perf_counter() - start, "cpu": time.process_time() - cpu,
                      "pull_s": pull_s, "push_s": push_s, "distinct": distinct}), flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["server", "worker"])
    p.add_argument("--mode", choices=["http", "socket"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--vocab", type=int, default=100_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=4096)
    p.add_argument("--zipf", type=float, default=1.2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--pool", type=int, default=8)
    p.add_argument("--seconds", type=float, default=5.0)
    args = p.parse_args()
    server(args) if args.command == "server" else worker(args)


if __name__ == "__main__":
    main()
