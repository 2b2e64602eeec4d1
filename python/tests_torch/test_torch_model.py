"""ember.ml.TorchModel, KerasModel's twin for PyTorch models, on a real local Spark session
without Ember's extension (Spark's array hand-over to a scalar-iterator pandas UDF; the packed,
joined-by-position path is tested in python/tests_spark_ext).  Predictions are checked against
the torch module run in this process, row by row."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from ember.ml import TorchModel

WIDTH = 6


def _module():
    torch.manual_seed(7)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))


def _rows(n: int):
    from pyspark.ml.linalg import Vectors
    out = []
    for i in range(n):
        x = [float((i * 7 + j * 3) % 11) / 10 - 0.5 for j in range(WIDTH)]
        v = Vectors.dense(x) if i % 3 else Vectors.sparse(WIDTH, {j: x[j] for j in range(0, WIDTH, 2)})
        out.append((i, f"row{i}", x, v))
    return out


def test_transform_predicts_what_torch_does_in_input_order(spark):
    module = _module()
    rows = _rows(200)
    df = spark.createDataFrame(rows, ["id", "name", "f", "v"]).repartition(3).cache()
    order = [r["id"] for r in df.select("id").collect()]
    tm = TorchModel.from_torch(module, input_shape=[WIDTH], outputCol="p", predictBatchSize=32)
    assert tm.input_shape == [None, WIDTH] and tm.output_shape == [None, 3]
    assert module.training  # from_torch exported it in eval mode and put it back
    for column in ("f", "v"):
        x = np.array([rows[i][3].toArray() if column == "v" else rows[i][2] for i in range(len(rows))], np.float32)
        with torch.no_grad():
            want = module.eval()(torch.from_numpy(x)).numpy()
        module.train()
        out = tm.copy({tm.inputCol: column}).transform(df)
        got = out.collect()
        assert out.columns == ["id", "name", "f", "v", "p"]
        assert [r["id"] for r in got] == order and all(r["name"] == f"row{r['id']}" for r in got)
        np.testing.assert_allclose(np.array([r["p"] for r in got]), want[order], rtol=1e-5, atol=1e-6)
    top = TorchModel.from_torch(module, input_shape=[WIDTH], inputCol="f", outputMode="argmax").transform(df)
    assert dict(top.dtypes)["prediction"] == "double"
    logits = module.eval()(torch.from_numpy(np.array([r[2] for r in rows], np.float32))).detach().numpy()
    np.testing.assert_array_equal([r["prediction"] for r in top.orderBy("id").collect()], np.argmax(logits, axis=1))


def test_a_saved_torch_model_loads_back_and_reads_its_shapes_from_the_program(spark, tmp_path):
    module = _module().eval()
    tm = TorchModel.from_torch(module, input_shape=[WIDTH], inputCol="f", outputMode="argmax", predictBatchSize=5)
    tm.save(str(tmp_path / "tm"))
    assert (tmp_path / "tm" / "model.pt2").is_file()
    back = TorchModel.load(str(tmp_path / "tm"))
    assert back.uid == tm.uid and back.getOutputMode() == "argmax" and back.getPredictBatchSize() == 5
    assert back.model_bytes == tm.model_bytes
    bare = TorchModel(model_bytes=tm.model_bytes, inputCol="f")  # no model_info: read from the program
    assert bare.input_shape == [None, WIDTH] and bare.output_shape == [None, 3]
    df = spark.createDataFrame([(i, [float(i + j) / 10 for j in range(WIDTH)]) for i in range(40)],
                               "id long, f array<float>")
    x = np.array([r["f"] for r in df.orderBy("id").collect()], np.float32)
    with torch.no_grad():
        want = module(torch.from_numpy(x)).numpy()
    assert [r["prediction"] for r in back.transform(df).orderBy("id").collect()] == list(np.argmax(want, axis=1))
    np.testing.assert_allclose(np.array([r["prediction"] for r in bare.transform(df).orderBy("id").collect()]),
                               want, rtol=1e-5, atol=1e-6)
    assert back.torch_module()(torch.from_numpy(x)).shape == (40, 3)


class _Pair(torch.nn.Module):
    def forward(self, x):
        return x, x


def test_bad_models_and_rows_are_named(spark):
    with pytest.raises(ValueError, match="gives 2 outputs; it must take one tensor and return one"):
        TorchModel.from_torch(_Pair(), input_shape=[WIDTH])
    tm = TorchModel.from_torch(_module(), input_shape=[WIDTH], inputCol="f")
    short = spark.createDataFrame([(1, [0.0] * WIDTH), (2, [0.0] * (WIDTH - 1))], "id long, f array<float>").coalesce(1)
    with pytest.raises(Exception, match=f"column 'f': a row has {WIDTH - 1} values but the model's input "
                                        f"takes {WIDTH}"):
        tm.transform(short).collect()
    with pytest.raises(ValueError, match="TorchModel: input column 'nope'"):
        tm.copy({tm.inputCol: "nope"}).transform(short)


def test_a_process_that_loaded_tensorflow_exports_and_runs_a_torch_model():
    """TensorFlow then Triton in one process aborts it (their LLVMs clash); torch.export imports
    Triton.  A Spark Python worker that ran a KerasModel, or a driver with Keras imported, must
    still run a TorchModel (ember._torch_program.import_torch)."""
    import os
    import subprocess
    import sys

    code = ("import tensorflow, numpy as np, torch\n"
            "from ember import _torch_program\nfrom ember.ml import TorchModel\n"
            "tm = TorchModel.from_torch(torch.nn.Linear(4, 2), input_shape=[4])\n"
            "y = _torch_program.load(tm.model_bytes).predict_on_batch(np.ones((3, 4), np.float32))\n"
            "print('shape', y.shape)\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "shape (3, 2)" in done.stdout, done.stderr[-2000:]
