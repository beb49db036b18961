"""Naive float64 reference operators: the oracle for the BF16 kernels' tests.

Every function loops over the kernel taps (or output cells) in plain numpy
float64, written for obviousness rather than speed, and follows the
definitions of the matching ``torch.nn.functional`` operator (NCHW).  Tests
round the inputs to BF16 first (``bf16_round``) so the oracle sees exactly
the values the kernel multiplies; the only remaining difference is fp32
accumulation.
"""

import numpy as np

from pycds.bf16.convert import to_bf16, to_float32


def bf16_round(a):
    """float array -> float64 array of the nearest BF16 values (ties to even)."""
    return to_float32(to_bf16(np.asarray(a, dtype=np.float32))).astype(np.float64)


def out_size(H, K, S, P, D=1):
    """``(H + 2*P - D*(K-1) - 1)//S + 1``."""
    return (H + 2 * P - D * (K - 1) - 1) // S + 1


def conv2d(x, w, b=None, S=1, P=0, D=1, groups=1):
    """x (N, C, H, W), w (K, C/groups, KH, KW), b (K,) -> (N, K, OH, OW) float64.

    ``out[n,k,oh,ow] = b[k] + sum_{c,i,j} xpad[n, g*Cg+c, oh*S + i*D, ow*S + j*D] * w[k,c,i,j]``.
    """
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    N, C, H, W = x.shape
    K, Cg, KH, KW = w.shape
    OH, OW = out_size(H, KH, S, P, D), out_size(W, KW, S, P, D)
    xp = np.zeros((N, C, H + 2 * P, W + 2 * P))
    xp[:, :, P:P + H, P:P + W] = x
    Kg = K // groups
    out = np.zeros((N, K, OH, OW))
    for g in range(groups):
        for i in range(KH):
            for j in range(KW):
                patch = xp[:, g * Cg:(g + 1) * Cg,
                           i * D:i * D + S * (OH - 1) + 1:S,
                           j * D:j * D + S * (OW - 1) + 1:S]  # (N, Cg, OH, OW)
                out[:, g * Kg:(g + 1) * Kg] += np.einsum("nchw,kc->nkhw", patch,
                                                         w[g * Kg:(g + 1) * Kg, :, i, j])
    if b is not None:
        out += np.asarray(b, np.float64)[None, :, None, None]
    return out


def linear(x, w, b=None):
    """x (N, IN), w (OUT, IN), b (OUT,) -> (N, OUT) float64."""
    out = np.asarray(x, np.float64) @ np.asarray(w, np.float64).T
    if b is not None:
        out = out + np.asarray(b, np.float64)
    return out


def relu(x):
    return np.maximum(x, 0.0)


def max_pool2d(x, K, S=None, P=0, D=1):
    """x (N, C, H, W) -> (N, C, OH, OW), -inf padding."""
    S = K if S is None else S
    x = np.asarray(x, np.float64)
    N, C, H, W = x.shape
    OH, OW = out_size(H, K, S, P, D), out_size(W, K, S, P, D)
    xp = np.full((N, C, H + 2 * P, W + 2 * P), -np.inf)
    xp[:, :, P:P + H, P:P + W] = x
    out = np.full((N, C, OH, OW), -np.inf)
    for oh in range(OH):
        for ow in range(OW):
            win = xp[:, :, oh * S:oh * S + D * (K - 1) + 1:D, ow * S:ow * S + D * (K - 1) + 1:D]
            out[:, :, oh, ow] = win.max(axis=(2, 3))
    return out


def avg_pool2d(x, K, S=None, P=0, count_include_pad=True):
    """x (N, C, H, W) -> (N, C, OH, OW), zero padding."""
    S = K if S is None else S
    x = np.asarray(x, np.float64)
    N, C, H, W = x.shape
    OH, OW = out_size(H, K, S, P), out_size(W, K, S, P)
    xp = np.zeros((N, C, H + 2 * P, W + 2 * P))
    xp[:, :, P:P + H, P:P + W] = x
    valid = np.zeros((H + 2 * P, W + 2 * P))
    valid[P:P + H, P:P + W] = 1
    out = np.zeros((N, C, OH, OW))
    for oh in range(OH):
        for ow in range(OW):
            hs, ws = slice(oh * S, oh * S + K), slice(ow * S, ow * S + K)
            n = K * K if count_include_pad else valid[hs, ws].sum()
            out[:, :, oh, ow] = xp[:, :, hs, ws].sum(axis=(2, 3)) / n
    return out


def adaptive_avg_pool2d(x, OH, OW):
    """x (N, C, H, W) -> (N, C, OH, OW) with PyTorch's floor/ceil bins."""
    x = np.asarray(x, np.float64)
    N, C, H, W = x.shape
    out = np.zeros((N, C, OH, OW))
    for i in range(OH):
        h0, h1 = (i * H) // OH, -(-(i + 1) * H // OH)
        for j in range(OW):
            w0, w1 = (j * W) // OW, -(-(j + 1) * W // OW)
            out[:, :, i, j] = x[:, :, h0:h1, w0:w1].mean(axis=(2, 3))
    return out


def batch_norm(x, mean, var, gamma, beta, eps=1e-5):
    """x (N, C, H, W) or (N, C); per-channel inference batch norm, float64."""
    x = np.asarray(x, np.float64)
    shape = (1, -1) + (1,) * (x.ndim - 2)
    m, v, g, b = (np.asarray(a, np.float64).reshape(shape) for a in (mean, var, gamma, beta))
    return (x - m) / np.sqrt(v + eps) * g + b


def softmax(x, axis=-1):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


# --------------------------------------------------------------------------
# error bounds

U_BF16 = 2.0 ** -8  # unit roundoff of BF16 (8-bit significand, round to nearest)
U_FP32 = 2.0 ** -24  # unit roundoff of float32


def gamma(n, u=U_FP32):
    """Higham's gamma_n = n*u / (1 - n*u): bound on the relative error of an n-term fp sum."""
    return n * u / (1 - n * u)


def dot_bound(mag, n, rounded_inputs):
    """Elementwise error bound for a BF16 dot-product kernel with fp32 accumulation.

    mag : float64 array, ``sum |x||w|`` per output (the reference run on |x|, |w|,
    plus |bias|).  n : terms per output.  With `rounded_inputs`, the reference saw
    the same BF16 values, so only fp32 summation error remains: ``gamma_{2n+6} * mag``
    (sbgemm documents at most 2K + 4 fp32 roundings per entry; +2 for the bias add
    and the float64 reference).
    Otherwise each product also carries the rounding of both inputs:
    ``(2u + u^2) * mag`` with ``u = 2^-8``.
    """
    b = gamma(2 * n + 6) * mag
    if not rounded_inputs:
        b = b + (2 * U_BF16 + U_BF16 ** 2) * mag
    return b + 1e-30


def assert_within(actual, expected, bound, what=""):
    """Assert ``|actual - expected| <= bound`` elementwise, reporting the worst case."""
    actual = np.asarray(actual, np.float64)
    expected = np.asarray(expected, np.float64)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual - expected)
    ratio = err / np.broadcast_to(bound, err.shape)
    worst = np.unravel_index(np.argmax(ratio), ratio.shape) if ratio.size else ()
    assert ratio.size == 0 or ratio.max() <= 1.0, (
        f"{what}: error {err[worst]:.3g} exceeds bound {np.broadcast_to(bound, err.shape)[worst]:.3g} "
        f"at {worst} (actual {actual[worst]!r}, expected {expected[worst]!r})"
    )


# --------------------------------------------------------------------------
# whole networks (NCHW, float64, batch norms applied unfolded)


def _bn(sd, name, x):
    return batch_norm(x, sd[name + ".running_mean"], sd[name + ".running_var"],
                      sd[name + ".weight"], sd[name + ".bias"])


def resnet50(sd, x):
    """torchvision resnet50 forward (eval) on a state dict of float arrays, float64."""
    f = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    x = relu(_bn(f, "bn1", conv2d(x, f["conv1.weight"], S=2, P=3)))
    x = max_pool2d(x, 3, 2, 1)
    for li, blocks in enumerate((3, 4, 6, 3), 1):
        for bi in range(blocks):
            p = f"layer{li}.{bi}"
            s = (1 if li == 1 else 2) if bi == 0 else 1
            out = relu(_bn(f, p + ".bn1", conv2d(x, f[p + ".conv1.weight"])))
            out = relu(_bn(f, p + ".bn2", conv2d(out, f[p + ".conv2.weight"], S=s, P=1)))
            out = _bn(f, p + ".bn3", conv2d(out, f[p + ".conv3.weight"]))
            if p + ".downsample.0.weight" in f:
                x = _bn(f, p + ".downsample.1", conv2d(x, f[p + ".downsample.0.weight"], S=s))
            x = relu(out + x)
    x = x.mean(axis=(2, 3))
    return linear(x, f["fc.weight"], f["fc.bias"])


def alexnet(sd, x):
    """torchvision alexnet forward (eval) on a state dict of float arrays, float64."""
    f = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    c = lambda x, i, S, P: relu(conv2d(x, f[f"features.{i}.weight"], f[f"features.{i}.bias"], S, P))
    x = max_pool2d(c(x, 0, 4, 2), 3, 2)
    x = max_pool2d(c(x, 3, 1, 2), 3, 2)
    x = max_pool2d(c(c(c(x, 6, 1, 1), 8, 1, 1), 10, 1, 1), 3, 2)
    x = adaptive_avg_pool2d(x, 6, 6).reshape(len(x), -1)
    x = relu(linear(x, f["classifier.1.weight"], f["classifier.1.bias"]))
    x = relu(linear(x, f["classifier.4.weight"], f["classifier.4.bias"]))
    return linear(x, f["classifier.6.weight"], f["classifier.6.bias"])


def gelu(x):
    """Exact GELU ``x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))``, float64 (math.erf)."""
    import math

    x = np.asarray(x, np.float64)
    erf = np.vectorize(math.erf, otypes=[np.float64])
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def layer_norm(x, gamma, beta, eps):
    """LayerNorm over the last axis (biased variance), float64."""
    x = np.asarray(x, np.float64)
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * gamma + beta


def bert(sd, cfg, ids, mask):
    """Hugging Face ``BertModel`` last hidden state, float64: (B, T) ids -> (B, T, H).

    Written from the BERT paper and transformers' ``modeling_bert.py``:
    embeddings (word + position + token type 0) and LayerNorm; per layer,
    multi-head self-attention (scores / sqrt(d), padded keys masked, softmax),
    output projection, residual, LayerNorm, GELU MLP, residual, LayerNorm.
    GEMM weights are rounded to BF16 (what the encoder multiplies); activations
    are not, so the difference is the encoder's activation rounding.
    """
    f = {k: np.asarray(v, np.float64) for k, v in sd.items()}
    B, T = ids.shape
    H, nh, eps = cfg.hidden_size, cfg.num_attention_heads, cfg.layer_norm_eps
    d = H // nh

    def lin(x, name):
        return x @ bf16_round(f[name + ".weight"]).T + f[name + ".bias"]

    def ln(x, name):
        return layer_norm(x, f[name + ".weight"], f[name + ".bias"], eps)

    h = (f["embeddings.word_embeddings.weight"][ids] + f["embeddings.position_embeddings.weight"][:T]
         + f["embeddings.token_type_embeddings.weight"][0])
    h = ln(h, "embeddings.LayerNorm")  # (B, T, H)
    key_mask = np.where(np.asarray(mask, bool), 0.0, -np.inf)[:, None, None, :]  # (B, 1, 1, T)
    for i in range(cfg.num_hidden_layers):
        p = f"encoder.layer.{i}."

        def heads(x):
            return x.reshape(B, T, nh, d).transpose(0, 2, 1, 3)  # (B, nh, T, d)

        q, k, v = (heads(lin(h, p + "attention.self." + n)) for n in ("query", "key", "value"))
        s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(d) + key_mask  # (B, nh, T, T)
        ctx = (softmax(s) @ v).transpose(0, 2, 1, 3).reshape(B, T, H)
        h = ln(lin(ctx, p + "attention.output.dense") + h, p + "attention.output.LayerNorm")
        inter = gelu(lin(h, p + "intermediate.dense"))
        h = ln(lin(inter, p + "output.dense") + h, p + "output.LayerNorm")
    return h
