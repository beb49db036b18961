"""Train the LeNet-style digits CNN and write pycds.bf16's shipped data files.

Run with an interpreter that has numpy, ml_dtypes, safetensors and
scikit-learn (scikit-learn is needed only here, for the data set)::

    PYTHONPATH=. python scripts/train_lenet_digits.py [--out pycds/bf16/data]

Data: scikit-learn's handwritten digits (``sklearn.datasets.load_digits``,
1797 real 8x8 scans, intensities 0..16), split 80/20 stratified with a fixed
seed.  Model: :class:`pycds.bf16.models.LeNetDigits` (LeCun et al. 1998,
scaled to 8x8): conv3x3 1->16, relu, maxpool 2, conv3x3 16->32, relu,
maxpool 2, fc 128->64, relu, fc 64->10.

Training is plain fp32 numpy with the backward pass written by hand
(im2col/col2im from :mod:`pycds.bf16.im2col`), Adam, softmax
cross-entropy, a fixed seed and a fixed number of epochs, so reruns give the
same weights on the same machine.  The script then rounds the weights to
BF16, rebuilds the model with :mod:`pycds.bf16` and reports both
accuracies on the held-out split.

Writes
------
lenet_digits.safetensors
    ``conv1/conv2/fc1/fc2 .weight`` as BF16, biases float32; the header
    metadata key ``pycds.training`` holds a sorted JSON record of the
    accuracies, seed and split (one key, so the file is byte-reproducible).
digits_test.npz
    ``images`` uint8 (N, 8, 8) 0..16, ``labels`` uint8 (N,), ``indices``
    int64 (N,) into ``load_digits()``.
"""

import argparse
import json
import os
import sys

import numpy as np

from pycds.bf16.convert import to_bf16, to_float32
from pycds.bf16.im2col import col2im, im2col
from pycds.bf16.models import (DIGITS_TEST_FILE, LENET_DIGITS_FILE, TRAINING_KEY, LeNetDigits,
                               save_state_dict)

SEED = 0
TEST_FRACTION = 0.2
EPOCHS = 60
BATCH = 32
LR = 2e-3
WEIGHT_DECAY = 1e-4
MAX_BF16_DROP = 0.5  # accuracy points


# --------------------------------------------------------------------------
# fp32 forward/backward, NCHW


def conv_forward(x, w, b):
    # x (N, C, H, W), w (K, C, 3, 3), pad 1 stride 1 -> (N, K, H, W) + cache
    N, C, H, W = x.shape
    K = w.shape[0]
    cols = im2col(x, 3, 1, 1)  # (N*H*W, C*9)
    out = cols @ w.reshape(K, -1).T + b  # (N*H*W, K)
    return out.reshape(N, H, W, K).transpose(0, 3, 1, 2), (x.shape, cols)


def conv_backward(dout, w, cache):
    # dout (N, K, H, W) -> dx (N, C, H, W), dw (K, C, 3, 3), db (K,)
    x_shape, cols = cache
    K = w.shape[0]
    d = dout.transpose(0, 2, 3, 1).reshape(-1, K)  # (N*H*W, K)
    dw = (d.T @ cols).reshape(w.shape)
    db = d.sum(axis=0)
    dcols = d @ w.reshape(K, -1)  # (N*H*W, C*9)
    return col2im(dcols, x_shape, 3, 1, 1), dw, db


def pool_forward(x):
    # 2x2 max pool: (N, C, H, W) -> (N, C, H/2, W/2) + mask
    N, C, H, W = x.shape
    v = x.reshape(N, C, H // 2, 2, W // 2, 2)
    out = v.max(axis=(3, 5))
    mask = v == out[:, :, :, None, :, None]
    return out, mask


def pool_backward(dout, mask):
    N, C, H2, _, W2, _ = mask.shape
    return (mask * dout[:, :, :, None, :, None]).reshape(N, C, H2 * 2, W2 * 2)


def forward(p, x, keep=False):
    # x (N, 1, 8, 8) -> logits (N, 10)
    z1, c1 = conv_forward(x, p["conv1.weight"], p["conv1.bias"])  # (N, 16, 8, 8)
    a1 = np.maximum(z1, 0)
    p1, m1 = pool_forward(a1)  # (N, 16, 4, 4)
    z2, c2 = conv_forward(p1, p["conv2.weight"], p["conv2.bias"])  # (N, 32, 4, 4)
    a2 = np.maximum(z2, 0)
    p2, m2 = pool_forward(a2)  # (N, 32, 2, 2)
    f = p2.reshape(len(x), -1)  # (N, 128)
    h = np.maximum(f @ p["fc1.weight"].T + p["fc1.bias"], 0)  # (N, 64)
    logits = h @ p["fc2.weight"].T + p["fc2.bias"]  # (N, 10)
    if not keep:
        return logits
    return logits, (c1, a1, m1, c2, a2, m2, p2.shape, f, h)


def loss_and_grads(p, x, y):
    logits, (c1, a1, m1, c2, a2, m2, p2_shape, f, h) = forward(p, x, keep=True)
    N = len(x)
    z = logits - logits.max(axis=1, keepdims=True)
    prob = np.exp(z)
    prob /= prob.sum(axis=1, keepdims=True)  # (N, 10)
    loss = -np.log(prob[np.arange(N), y] + 1e-12).mean()
    g = {}
    dl = prob
    dl[np.arange(N), y] -= 1
    dl /= N  # (N, 10)
    g["fc2.weight"], g["fc2.bias"] = dl.T @ h, dl.sum(0)
    dh = (dl @ p["fc2.weight"]) * (h > 0)  # (N, 64)
    g["fc1.weight"], g["fc1.bias"] = dh.T @ f, dh.sum(0)
    dp2 = (dh @ p["fc1.weight"]).reshape(p2_shape)  # (N, 32, 2, 2)
    da2 = pool_backward(dp2, m2) * (a2 > 0)  # (N, 32, 4, 4)
    dp1, g["conv2.weight"], g["conv2.bias"] = conv_backward(da2, p["conv2.weight"], c2)
    da1 = pool_backward(dp1, m1) * (a1 > 0)  # (N, 16, 8, 8)
    _, g["conv1.weight"], g["conv1.bias"] = conv_backward(da1, p["conv1.weight"], c1)
    return loss, g


def init_params(rng):
    # PyTorch default init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
    shapes = {"conv1": ((16, 1, 3, 3), 9), "conv2": ((32, 16, 3, 3), 144),
              "fc1": ((64, 128), 128), "fc2": ((10, 64), 64)}
    p = {}
    for name, (shape, fan_in) in shapes.items():
        bound = 1 / np.sqrt(fan_in)
        p[name + ".weight"] = rng.uniform(-bound, bound, shape).astype(np.float32)
        p[name + ".bias"] = rng.uniform(-bound, bound, shape[0]).astype(np.float32)
    return p


def train(x, y, rng):
    p = init_params(rng)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    b1, b2, eps, t = 0.9, 0.999, 1e-8, 0
    for epoch in range(EPOCHS):
        order = rng.permutation(len(x))
        lr = LR * 0.5 * (1 + np.cos(np.pi * epoch / EPOCHS))  # cosine decay
        total = 0.0
        for s in range(0, len(x), BATCH):
            idx = order[s:s + BATCH]
            loss, g = loss_and_grads(p, x[idx], y[idx])
            total += loss * len(idx)
            t += 1
            for k in p:
                gk = g[k] + WEIGHT_DECAY * p[k]
                m[k] = b1 * m[k] + (1 - b1) * gk
                v[k] = b2 * v[k] + (1 - b2) * gk * gk
                mh = m[k] / (1 - b1 ** t)
                vh = v[k] / (1 - b2 ** t)
                p[k] = (p[k] - lr * mh / (np.sqrt(vh) + eps)).astype(np.float32)
        if epoch % 10 == 0 or epoch == EPOCHS - 1:
            print(f"epoch {epoch:3d}  loss {total / len(x):.4f}", file=sys.stderr)
    return p


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "pycds", "bf16", "data"))
    args = ap.parse_args(argv)

    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    digits = load_digits()
    images = digits.images.astype(np.uint8)  # (1797, 8, 8), 0..16
    labels = digits.target.astype(np.int64)  # (1797,)
    idx_train, idx_test = train_test_split(np.arange(len(labels)), test_size=TEST_FRACTION,
                                           stratify=labels, random_state=SEED)
    idx_test = np.sort(idx_test)

    def scaled(idx):
        return (images[idx].astype(np.float32) / np.float32(16.0)).reshape(-1, 1, 8, 8)

    x_train, y_train = scaled(idx_train), labels[idx_train]
    x_test, y_test = scaled(idx_test), labels[idx_test]

    rng = np.random.default_rng(SEED)
    p = train(x_train, y_train, rng)

    acc32 = float((forward(p, x_test).argmax(1) == y_test).mean() * 100)
    sd = {k: (to_bf16(a) if k.endswith("weight") else a) for k, a in p.items()}
    acc16 = float((LeNetDigits(sd).predict(x_test) == y_test).mean() * 100)
    # The same bf16-rounded weights in the fp32 reference forward, for the record.
    acc32_rw = float((forward({k: (to_float32(a) if a.dtype == np.uint16 else a) for k, a in sd.items()},
                              x_test).argmax(1) == y_test).mean() * 100)

    os.makedirs(args.out, exist_ok=True)
    meta = {
        "model": "LeNetDigits",
        "dataset": "sklearn.datasets.load_digits",
        "split": f"stratified test_size={TEST_FRACTION} random_state={SEED}",
        "n_train": str(len(idx_train)),
        "n_test": str(len(idx_test)),
        "seed": str(SEED),
        "epochs": str(EPOCHS),
        "fp32_accuracy": f"{acc32:.2f}",
        "bf16_accuracy": f"{acc16:.2f}",
        "weights": "BF16 (round to nearest even); biases float32",
    }
    model_path = os.path.join(args.out, LENET_DIGITS_FILE)
    # One metadata key holding sorted JSON: safetensors writes its metadata
    # map in hash order, so several keys would make the bytes vary per run.
    save_state_dict(sd, model_path, metadata={TRAINING_KEY: json.dumps(meta, sort_keys=True)})
    os.chmod(model_path, 0o644)  # safetensors creates files 0600; this is package data
    np.savez_compressed(os.path.join(args.out, DIGITS_TEST_FILE), images=images[idx_test],
                        labels=labels[idx_test].astype(np.uint8), indices=idx_test)
    print(f"held-out digits: {len(idx_test)} images")
    print(f"fp32 accuracy: {acc32:.2f}%")
    print(f"bf16 accuracy: {acc16:.2f}%  (pycds.bf16, BF16 weights and activations)")
    print(f"fp32 forward with BF16-rounded weights: {acc32_rw:.2f}%")
    if acc16 < acc32 - MAX_BF16_DROP:
        print(f"error: bf16 accuracy is more than {MAX_BF16_DROP} points below fp32", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
