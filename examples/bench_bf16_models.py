"""Forward latency of pycds.bf16's ResNet-50 and AlexNet, against PyTorch when importable.

    python examples/bench_bf16_models.py [--reps 9] [--batches 1 8] [--models resnet50 alexnet]

Both sides run the same random weights (torchvision names, He-scaled) at
224x224.  Contenders are timed in rounds (so drift and neighbours' load hit
all of them alike), after two warm-up calls; in each round each contender
runs a block of ``--block`` back-to-back forwards (the order rotates from
round to round) and the first forward of every block is not counted: it
pays for the previous contender's worker threads, which keep spinning for
a while after their last call (PyTorch's OpenMP threads; OpenBLAS's), as
docs/bf16.md describes for the sbgemm benchmark.  ``--block 1`` times
strictly interleaved single forwards instead, counting every one:

* ``pycds.bf16``: BF16 weights and activations, fp32 accumulation
  (``sbgemm``), batch norms folded at load, NHWC inside.
* ``torch fp32``: ``torch.nn`` eval mode under ``torch.inference_mode()``.
* ``torch bf16``: the same module and input converted with
  ``.to(torch.bfloat16)``.

PyTorch is optional (the script only reports pycds.bf16 without it) and is
never a pycds dependency; the PyTorch modules are written out here, with
torchvision's topology, so torchvision is not needed either.  The script
also checks that pycds.bf16 and PyTorch fp32 agree (relative L2 difference
of the logits, same top-1) before timing.  Reported: median (and minimum)
milliseconds per forward and the ratio pycds.bf16 / PyTorch (lower is
better for pycds), plus the load average, since on a shared machine other
jobs' load skews everything (PyTorch's OpenMP threads the most).
``--threads 1`` compares single-threaded kernels.
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np

from pycds.bf16 import kernel_name
from pycds.bf16 import models as M


# --------------------------------------------------------------------------
# PyTorch twins (torchvision topology and names)


def torch_models():
    import torch
    from torch import nn

    class Bottleneck(nn.Module):
        def __init__(self, inplanes, width, stride, down):
            super().__init__()
            self.conv1 = nn.Conv2d(inplanes, width, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3 = nn.Conv2d(width, width * 4, 1, bias=False)
            self.bn3 = nn.BatchNorm2d(width * 4)
            self.relu = nn.ReLU(inplace=True)
            self.downsample = (nn.Sequential(nn.Conv2d(inplanes, width * 4, 1, stride, bias=False),
                                             nn.BatchNorm2d(width * 4)) if down else None)

        def forward(self, x):
            out = self.relu(self.bn1(self.conv1(x)))
            out = self.relu(self.bn2(self.conv2(out)))
            out = self.bn3(self.conv3(out))
            return self.relu(out + (x if self.downsample is None else self.downsample(x)))

    class ResNet50(nn.Module):
        def __init__(self, num_classes=1000):
            super().__init__()
            self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
            self.bn1 = nn.BatchNorm2d(64)
            self.relu = nn.ReLU(inplace=True)
            self.maxpool = nn.MaxPool2d(3, 2, 1)
            inplanes = 64
            for li, (blocks, width) in enumerate(zip((3, 4, 6, 3), (64, 128, 256, 512)), 1):
                stride = 1 if li == 1 else 2
                layer = []
                for bi in range(blocks):
                    layer.append(Bottleneck(inplanes, width, stride if bi == 0 else 1, bi == 0))
                    inplanes = width * 4
                setattr(self, f"layer{li}", nn.Sequential(*layer))
            self.avgpool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(2048, num_classes)

        def forward(self, x):
            x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
            x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
            return self.fc(torch.flatten(self.avgpool(x), 1))

    class AlexNet(nn.Module):
        def __init__(self, num_classes=1000):
            super().__init__()
            self.features = nn.Sequential(
                nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(True), nn.MaxPool2d(3, 2),
                nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(True), nn.MaxPool2d(3, 2),
                nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(True),
                nn.Conv2d(384, 256, 3, padding=1), nn.ReLU(True),
                nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(True), nn.MaxPool2d(3, 2))
            self.avgpool = nn.AdaptiveAvgPool2d((6, 6))
            self.classifier = nn.Sequential(
                nn.Dropout(), nn.Linear(9216, 4096), nn.ReLU(True),
                nn.Dropout(), nn.Linear(4096, 4096), nn.ReLU(True), nn.Linear(4096, num_classes))

        def forward(self, x):
            return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))

    return torch, {"resnet50": ResNet50, "alexnet": AlexNet}


# --------------------------------------------------------------------------


def build(name, torch_mods):
    shapes = M.resnet50_shapes() if name == "resnet50" else M.alexnet_shapes()
    sd = M.random_state_dict(shapes, seed=0)
    ours = (M.ResNet50 if name == "resnet50" else M.AlexNet)(sd)
    contenders = {"pycds.bf16": lambda x: ours(x)}
    if torch_mods is not None:
        torch, classes = torch_mods
        net = classes[name]().eval()
        net.load_state_dict({k: torch.from_numpy(v) for k, v in sd.items()}, strict=False)
        net16 = classes[name]().eval()
        net16.load_state_dict(net.state_dict())
        net16 = net16.to(torch.bfloat16)

        def t32(x):
            with torch.inference_mode():
                return net(x["t32"])

        def t16(x):
            with torch.inference_mode():
                return net16(x["t16"])

        contenders["torch fp32"] = t32
        contenders["torch bf16"] = t16
    return contenders


def inputs(batch, torch_mods):
    x = np.random.default_rng(batch).standard_normal((batch, 3, 224, 224)).astype(np.float32)
    feeds = {"pycds.bf16": x}
    if torch_mods is not None:
        torch = torch_mods[0]
        t = torch.from_numpy(x)
        feeds["torch fp32"] = {"t32": t}
        feeds["torch bf16"] = {"t16": t.to(torch.bfloat16)}
    return feeds


def agreement(contenders, feeds):
    # relative L2 difference of the logits vs torch fp32, and top-1 agreement.
    ref = contenders["torch fp32"](feeds["torch fp32"]).float().numpy().astype(np.float64)
    out = {}
    for name in ("pycds.bf16", "torch bf16"):
        y = contenders[name](feeds[name])
        y = y if isinstance(y, np.ndarray) else y.float().numpy()
        rel = np.linalg.norm(y - ref) / np.linalg.norm(ref)
        out[name] = (rel, float((y.argmax(1) == ref.argmax(1)).mean()))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9, help="rounds")
    ap.add_argument("--block", type=int, default=3,
                    help="forwards per contender per round; the first of each block is not "
                         "counted (1: strict interleaving, all counted)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--models", nargs="+", default=["resnet50", "alexnet"], choices=["resnet50", "alexnet"])
    ap.add_argument("--no-torch", action="store_true", help="time pycds.bf16 only")
    ap.add_argument("--threads", type=int, default=0,
                    help="worker threads for both sides (0: each library's default, all CPUs); "
                         "1 is steadier on a shared machine")
    args = ap.parse_args(argv)
    if args.threads > 0:
        from pycds.bf16 import gemm

        gemm._set_num_threads(args.threads)  # the kernel's pthread count (private hook)

    torch_mods = None
    if not args.no_torch:
        try:
            torch_mods = torch_models()
            if args.threads > 0:
                torch_mods[0].set_num_threads(args.threads)
            print(f"torch {torch_mods[0].__version__}, {torch_mods[0].get_num_threads()} threads")
        except ImportError:
            print("torch not importable: timing pycds.bf16 only")
    print(f"pycds.bf16 sbgemm kernel: {kernel_name()}; {args.reps} rounds of blocks of "
          f"{args.block} forward(s) per contender, median ms")
    load0 = os.getloadavg()[0]

    rows = []
    for name in args.models:
        contenders = build(name, torch_mods)
        for batch in args.batches:
            feeds = inputs(batch, torch_mods)
            if torch_mods is not None:
                for who, (rel, top1) in agreement(contenders, feeds).items():
                    print(f"  {name} b{batch}: {who} vs torch fp32: rel L2 {rel:.2e}, top-1 agree {top1:.0%}")
            for fn_name, fn in contenders.items():  # warm-up
                fn(feeds[fn_name]), fn(feeds[fn_name])
            times = {k: [] for k in contenders}
            names = list(contenders)
            for r in range(args.reps):
                for fn_name in names[r % len(names):] + names[:r % len(names)]:
                    fn = contenders[fn_name]
                    for i in range(args.block):
                        t0 = time.perf_counter()
                        fn(feeds[fn_name])
                        if args.block == 1 or i > 0:
                            times[fn_name].append((time.perf_counter() - t0) * 1e3)
            rows.append((name, batch, {k: statistics.median(v) for k, v in times.items()},
                         {k: min(v) for k, v in times.items()}))
            print(f"  {name} b{batch}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms"
                                                  for k, v in times.items()), flush=True)

    print(f"load average (1 min): {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end "
          f"on {os.cpu_count()} CPUs (others' load skews the timings, PyTorch's OpenMP most)")
    for title, col in (("median", 2), ("minimum (least disturbed run)", 3)):
        print(f"\n{title} ms per forward")
        head = "| model | batch | pycds.bf16 ms |"
        if torch_mods is not None:
            head += " torch fp32 ms | torch bf16 ms | bf16/torch-fp32 | bf16/torch-bf16 |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for row in rows:
            name, batch, med = row[0], row[1], row[col]
            line = f"| {name} | {batch} | {med['pycds.bf16']:.1f} |"
            if torch_mods is not None:
                line += (f" {med['torch fp32']:.1f} | {med['torch bf16']:.1f} | "
                         f"{med['pycds.bf16'] / med['torch fp32']:.2f} | "
                         f"{med['pycds.bf16'] / med['torch bf16']:.2f} |")
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
