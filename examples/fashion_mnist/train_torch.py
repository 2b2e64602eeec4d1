"""Fashion-MNIST in PyTorch on 2 Ember nodes: the twin of main.py (same CNN, same data, same
global batch), trained with ember.torch's synchronous data parallelism.

    python examples/fashion_mnist/train_torch.py                  # Spark local[2], 2 nodes
    python examples/fashion_mnist/train_torch.py --master spark://127.0.0.1:7077

PyTorch comes from .torch-site/ (`make setup-torch`).  Each node reads the Debian IDX files
itself (InputMode.TENSORFLOW) and trains on its share (every num_workers-th image); gradients
are averaged every step by ember.torch.DistributedOptimizer; the chief evaluates on the 10,000
test images and prints ``test_accuracy=<value>``.
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
TORCH_SITE = HERE.parents[1] / ".torch-site"
sys.path.insert(0, str(HERE))
import data  # noqa: E402  (examples/fashion_mnist/data.py)
import ember  # noqa: E402


def build_model(nn):
    """The CNN of train_single.py, in PyTorch."""
    return nn.Sequential(
        nn.Conv2d(1, 32, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 5 * 5, 128), nn.ReLU(), nn.Dropout(0.3),
        nn.Linear(128, data.NUM_CLASSES))


def to_tensors(torch, images, labels):
    x = torch.from_numpy(images.reshape(-1, 1, 28, 28).astype("float32") / 255.0)
    return x, torch.from_numpy(labels.astype("int64"))


def main_fun(args, ctx):
    sys.path.append(str(TORCH_SITE))
    import torch
    import torch.nn as nn

    import ember.torch

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    images, labels = data.load_split("train")
    x, y = to_tensors(torch, images[ctx.training_rank::ctx.num_workers], labels[ctx.training_rank::ctx.num_workers])
    batch = args.batch_size // ctx.num_workers
    model = build_model(nn)
    ember.torch.broadcast_parameters(model)  # every node starts from the chief's weights
    optimizer = ember.torch.DistributedOptimizer(torch.optim.Adam(model.parameters(), lr=args.learning_rate))
    loss_fn = nn.CrossEntropyLoss()
    generator = torch.Generator().manual_seed(args.seed + ctx.training_rank)
    steps = len(x) // batch  # the same on every node: the shares differ by at most one image
    steps = int(ctx.allreduce(torch.tensor([steps]), op="min")[0])
    start = time.monotonic()
    for epoch in range(args.epochs):
        model.train()
        order = torch.randperm(len(x), generator=generator)
        total = torch.zeros(2)
        for i in range(steps):
            idx = order[i * batch:(i + 1) * batch]
            optimizer.zero_grad()
            logits = model(x[idx])
            loss = loss_fn(logits, y[idx])
            loss.backward()
            optimizer.step()
            total += torch.tensor([loss.item(), (logits.argmax(1) == y[idx]).float().mean().item()])
        loss, accuracy = (ctx.allreduce(total / steps)).tolist()
        if ctx.is_chief:
            print(f"epoch {epoch + 1}/{args.epochs}: loss={loss:.4f} accuracy={accuracy:.4f} "
                  f"({time.monotonic() - start:.0f}s)", flush=True)
        ctx.report(step=(epoch + 1) * steps, loss=loss, samples=(epoch + 1) * steps * args.batch_size)

    if ctx.is_chief:
        model.eval()
        test_x, test_y = to_tensors(torch, *data.load_split("test"))
        with torch.no_grad():
            correct = sum(int((model(test_x[i:i + 1000]).argmax(1) == test_y[i:i + 1000]).sum())
                          for i in range(0, len(test_x), 1000))
        torch.save(model.state_dict(), Path(args.model_dir) / "fashion_mnist_torch.pt")
        print(f"test_accuracy={correct / len(test_x):.4f} (trained {time.monotonic() - start:.1f}s, "
              f"{ctx.num_workers} nodes)", flush=True)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--master", default="local[2]", help="Spark master URL")
    p.add_argument("--num-nodes", type=int, default=2)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--batch-size", type=int, default=128, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--threads", type=int, default=1, help="torch threads per node")
    p.add_argument("--model-dir", default=str(HERE.parents[1] / "data" / "fashion_mnist_model"))
    args = p.parse_args(argv)
    Path(args.model_dir).mkdir(parents=True, exist_ok=True)
    args.model_dir = str(Path(args.model_dir).resolve())
    return args


if __name__ == "__main__":
    if not (TORCH_SITE / ".installed").exists():
        sys.exit(f"PyTorch is not installed in {TORCH_SITE}: run `make setup-torch` first")
    args = parse_args()
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(args.master).appName("ember-fashion-mnist-torch")
             .config("spark.ui.showConsoleProgress", "false").config("spark.submit.pyFiles", data.__file__)
             .getOrCreate())
    try:
        ember.Cluster.run(spark, main_fun, args, num_executors=args.num_nodes).shutdown(timeout=1800)
    finally:
        spark.stop()
