"""A PyTorch model as ember.ml.TorchModel carries it: a ``torch.export`` program (``.pt2``: the
graph and the weights, the batch dimension dynamic; no Python class needed where it is loaded,
nothing unpickled).  Exporting on the driver, loading and running in a Spark Python worker, and
reading the program's shapes.  Imports torch only when called, through `import_torch`."""
from __future__ import annotations

import io
import sys
from typing import Any, Dict, List, Optional, Tuple

import numpy as np


def import_torch() -> Any:
    """torch, imported so that it cannot abort a process that has loaded TensorFlow.  Loading or
    exporting a torch.export program imports Triton, whose LLVM registers command-line options
    TensorFlow's LLVM already registered: "LLVM ERROR: inconsistency in registered CommandLine
    options" and an abort (Triton first, then TensorFlow, is fine).  A Spark Python worker that
    ran a KerasModel, or a driver that imported Keras, would die.  So where TensorFlow is loaded
    and Triton is not, Triton is marked missing (torch then runs without it: it compiles nothing
    here); importing it there could only abort."""
    if "tensorflow" in sys.modules and "triton" not in sys.modules:
        sys.modules["triton"] = None  # `import triton` now raises ImportError, which torch handles
    import torch

    return torch


class Predictor:
    """A loaded program in a Python worker: float32 matrices in (as tensors sharing their
    memory: torch.from_numpy copies nothing), the outputs out as numpy, no autograd."""

    def __init__(self, module: Any):
        import warnings

        self.module = module
        # The matrix is a view of Arrow's buffer, which numpy marks read-only; torch warns once per
        # process that it cannot mark a tensor so.  Nothing writes to it: the batch is never reused.
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable", category=UserWarning)

    def predict_on_batch(self, x: np.ndarray) -> np.ndarray:
        torch = import_torch()
        with torch.inference_mode():
            y = self.module(torch.from_numpy(np.ascontiguousarray(x)))
        if not isinstance(y, torch.Tensor):
            raise TypeError(f"TorchModel: the model returned a {type(y).__name__}; it must return one tensor")
        return y.float().numpy()


def load(data: bytes) -> Predictor:
    """A program's bytes (``.pt2``) as a predictor."""
    return Predictor(import_torch().export.load(io.BytesIO(data)).module())


def export(module: Any, input_shape: List[int]) -> Tuple[bytes, Dict[str, Any]]:
    """(the ``.pt2`` bytes, the shapes) of `module`, a ``torch.nn.Module`` taking one float32
    tensor of ``(batch, *input_shape)``, exported in evaluation mode with the batch dimension
    dynamic; the module gets its mode back."""
    torch = import_torch()
    if isinstance(input_shape, int):
        input_shape = [input_shape]
    example = torch.zeros([2] + [int(d) for d in input_shape], dtype=torch.float32)
    was_training = module.training
    module.eval()
    try:
        program = torch.export.export(module, (example,), dynamic_shapes=({0: torch.export.Dim.DYNAMIC},))
    finally:
        module.train(was_training)
    buf = io.BytesIO()
    torch.export.save(program, buf)
    return buf.getvalue(), _shapes(program)


def shapes(data: bytes) -> Dict[str, Any]:
    """``{"input_shape": [None, ...], "output_shape": [None, ...]}`` of a program's bytes."""
    return _shapes(import_torch().export.load(io.BytesIO(data)))


def _static_shape(shape: Any) -> List[Optional[int]]:
    """A traced shape with every symbolic (dynamic) size as None: the batch dimension."""
    return [d if isinstance(d, int) else None for d in shape]


def _shapes(program: Any) -> Dict[str, Any]:
    user_inputs = list(program.graph_signature.user_inputs)
    user_outputs = list(program.graph_signature.user_outputs)
    if len(user_inputs) != 1 or len(user_outputs) != 1:
        raise ValueError(f"TorchModel: the model takes {len(user_inputs)} inputs and gives {len(user_outputs)} "
                         f"outputs; it must take one tensor and return one")
    nodes = {n.name: n for n in program.graph.nodes}
    out_node = next(n for n in program.graph.nodes if n.op == "output")
    out_arg = out_node.args[0][0] if isinstance(out_node.args[0], (tuple, list)) else out_node.args[0]
    in_shape = _static_shape(nodes[user_inputs[0]].meta["val"].shape)
    out_shape = _static_shape(out_arg.meta["val"].shape)
    return {"input_shape": [None] + in_shape[1:], "output_shape": [None] + out_shape[1:]}
