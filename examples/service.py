"""An inference service starting up: Flask, numpy, safetensors, pycds.bf16.

    python examples/service.py WEIGHTS [--batch N]
    python examples/service.py --write-weights WEIGHTS

What a model server does before its first answer: import its stack, load
the weights (``safetensors.numpy.load_file``), build the model
(:class:`pycds.bf16.models.LeNetDigits`, BF16 with fp32 accumulation),
create the Flask app, and answer a request: here ``POST /predict`` with the
first N held-out 8x8 digit scans, sent through Flask's test client (no
socket, no server left running).  It prints the response: stdout is
deterministic, so a plain run and a pycds run compare byte for byte.

WEIGHTS is the shipped trained LeNet (``pycds/bf16/data/
lenet_digits.safetensors``) with its BF16 tensors stored as their bit
patterns (safetensors dtype ``U16``), which pycds.bf16 takes as BF16.
numpy has no bfloat16 dtype: loading the shipped file's ``BF16`` tensors
would import ml_dtypes, whose extension initialisation takes longer than the
rest of this start-up and is not Python code an import cache can serve.
``--write-weights`` writes WEIGHTS from the shipped file (without ml_dtypes).
"""

import argparse
import sys

import flask
import numpy as np
from safetensors.numpy import load_file

from pycds.bf16.models import LeNetDigits, load_digits_test

IMAGE_SHAPE = (1, 8, 8)  # (C, H, W) of one scan


def create_app(weights):
    """The Flask app serving the digits model whose weights are in `weights`.

    ``POST /predict`` takes ``{"images": [...]}``, N scans of 8x8 floats in
    [0, 1], and answers ``{"digits": [...]}``, N ints; a body that is not N
    such scans gets a 400.  Raises what ``load_file`` raises for a missing
    or damaged file, and ValueError for weights that do not fit the model.
    """
    model = LeNetDigits(load_file(weights))  # uint16 arrays are BF16 bits
    app = flask.Flask("digits")

    @app.post("/predict")
    def predict():
        body = flask.request.get_json(silent=True) or {}
        try:
            x = np.asarray(body["images"], dtype=np.float32)  # (N, 8, 8) or (N, 1, 8, 8)
            x = x.reshape(-1, *IMAGE_SHAPE)  # (N, 1, 8, 8)
        except (KeyError, TypeError, ValueError) as exc:
            return {"error": f"expected images of 8x8 floats: {exc}"}, 400
        return {"digits": model.predict(x).tolist()}

    return app


def write_weights(path):
    """Write the shipped LeNet's weights to `path`, BF16 tensors as U16 bits.

    Reads the raw tensor bytes with ``safetensors.deserialize``, so that no
    bfloat16 dtype (ml_dtypes) is needed; keeps the file's metadata.
    Raises OSError if `path` cannot be written.
    """
    from importlib.resources import as_file, files

    from safetensors import deserialize, safe_open
    from safetensors.numpy import save_file

    from pycds.bf16.models import LENET_DIGITS_FILE

    with as_file(files("pycds.bf16") / "data" / LENET_DIGITS_FILE) as src:
        with safe_open(src, "np") as f:
            metadata = f.metadata()
        tensors = deserialize(src.read_bytes())
    dtypes = {"BF16": np.uint16, "F32": np.float32}
    arrays = {name: np.frombuffer(t["data"], dtypes[t["dtype"]]).reshape(t["shape"])
              for name, t in tensors}
    save_file(arrays, path, metadata=metadata)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("weights", help="safetensors file (see --write-weights)")
    ap.add_argument("--batch", type=int, default=64, help="scans in the request (default 64)")
    ap.add_argument("--write-weights", action="store_true",
                    help="write WEIGHTS from the shipped model and exit")
    opts = ap.parse_args(argv)
    if opts.write_weights:
        write_weights(opts.weights)
        return 0

    app = create_app(opts.weights)
    images, labels = load_digits_test()  # (N, 1, 8, 8) float32, (N,) int64
    images, labels = images[:opts.batch], labels[:opts.batch]
    with app.test_client() as client:
        r = client.post("/predict", json={"images": images.tolist()})
    digits = r.get_json()["digits"]
    right = sum(int(d == y) for d, y in zip(digits, labels))
    print(f"POST /predict: {r.status_code}, {len(digits)} scans")
    print("predicted: " + "".join(map(str, digits)))
    print("expected:  " + "".join(map(str, labels)))
    print(f"correct: {right}/{len(labels)} (the model's accuracy on held-out scans, "
          "the same plain and under pycds)")
    return 0 if r.status_code == 200 else 1


if __name__ == "__main__":
    sys.exit(main())
