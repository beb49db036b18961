"""Classify the held-out handwritten digits with the shipped BF16 LeNet.

    python examples/bf16_infer.py

Loads ``pycds/bf16/data/lenet_digits.safetensors`` (BF16 weights) and the
held-out split ``digits_test.npz`` (360 real 8x8 scans from scikit-learn's
digits, never seen in training), runs :class:`pycds.bf16.models.LeNetDigits`
in BF16 (fp32 accumulation), and prints the predictions, a SHA-256 digest of
them, and the accuracy.

stdout is deterministic (no timings), so a plain run and a pycds-accelerated
run can be compared byte for byte::

    python examples/bf16_infer.py > plain.txt
    PYCDSMODE=SHARE PYCDSARCHIVE=... python examples/bf16_infer.py > shared.txt
    cmp plain.txt shared.txt
"""

import hashlib
import sys

import numpy as np

from pycds.bf16.models import load_digits_test, load_lenet_digits

ROW = 60  # predicted digits per output line


def main():
    model, record = load_lenet_digits()
    images, labels = load_digits_test()  # (N, 1, 8, 8) float32, (N,) int64
    pred = model.predict(images)  # (N,) int64
    text = "".join(str(int(d)) for d in pred)
    for i in range(0, len(text), ROW):
        print(f"{i:4d}  {text[i:i + ROW]}")
    wrong = np.flatnonzero(pred != labels)
    print("misclassified (index:label->pred): "
          + (" ".join(f"{i}:{labels[i]}->{pred[i]}" for i in wrong) or "none"))
    print(f"predictions sha256: {hashlib.sha256(text.encode()).hexdigest()}")
    acc = float((pred == labels).mean() * 100)
    print(f"accuracy: {acc:.2f}% ({len(labels) - len(wrong)}/{len(labels)}) in bf16; "
          f"recorded at training: fp32 {record.get('fp32_accuracy', '?')}%, "
          f"bf16 {record.get('bf16_accuracy', '?')}%")
    return 0


if __name__ == "__main__":
    sys.exit(main())
