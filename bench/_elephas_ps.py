"""Elephas 7.3.0's parameter server and client, for bench/ps.py: run with the interpreter of
bench/.elephas-venv (Elephas pins its own TensorFlow, numpy and pyspark), never imported by
Ember.  Two commands:

  server --mode http|socket --port P --floats N   serves a Keras model of N float32 weights
                                                  (Dense 1000 -> N/1000, so its kernel and bias)
                                                  with Elephas's HttpServer or SocketServer
  worker --mode http|socket --port P --seconds S  loops get_parameters + update_parameters(delta)
                                                  for S seconds; prints {"updates": n, "secs": t,
                                                  "cpu": this process's CPU seconds in the loop}
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # Elephas's determine_master: this host's loopback


def model_dict(floats: int):
    import keras
    from elephas.utils.serialization import model_to_dict

    units = max(1, floats // 1000)
    model = keras.Sequential([keras.Input((1000,)), keras.layers.Dense(units)])
    return model_to_dict(model)


def serve(spec, mode: str, port: int) -> None:
    """Serves the model `spec` (model_to_dict) with Elephas's HttpServer or SocketServer in
    asynchronous mode; prints "ready" and serves until the bench closes our stdin (also for
    bench/_elephas_sparse.py)."""
    from elephas.enums.modes import Mode

    if mode == "http":
        from elephas.parameter.server import HttpServer
        s = HttpServer(spec, port, Mode.ASYNCHRONOUS, debug=False)
    else:
        from elephas.parameter.server import SocketServer
        s = SocketServer(spec, port, Mode.ASYNCHRONOUS)
    s.start()
    print("ready", flush=True)
    try:
        sys.stdin.read()
    finally:
        s.stop()


def client(mode: str, port: int):
    """Elephas's HttpClient or SocketClient on `port`."""
    if mode == "http":
        from elephas.parameter.client import HttpClient
        return HttpClient(port=port)
    from elephas.parameter.client import SocketClient
    return SocketClient(port=port)


def server(args) -> None:
    serve(model_dict(args.floats), args.mode, args.port)


def worker(args) -> None:
    import numpy as np

    ps = client(args.mode, args.port)
    weights = ps.get_parameters()  # warm-up
    delta = [np.full_like(np.asarray(w), 1e-7) for w in weights]
    n, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < args.seconds:
        ps.get_parameters()
        ps.update_parameters(delta)
        n += 1
    print(json.dumps({"updates": n, "secs": time.perf_counter() - start, "cpu": time.process_time() - cpu}),
          flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("command", choices=["server", "worker"])
    p.add_argument("--mode", choices=["http", "socket"], required=True)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--floats", type=int, default=2_500_000)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args()
    server(args) if args.command == "server" else worker(args)


if __name__ == "__main__":
    main()
