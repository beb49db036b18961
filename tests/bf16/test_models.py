"""AlexNet, ResNet-50 and the shipped LeNet: names, shapes, accuracy, weight files.

The big models are built from random state dicts with torchvision's names and
He-scaled weights (batch-norm statistics near 1/0), at small inputs (ResNet-50
32x32, AlexNet 64x64) and batch 1-2 to keep the suite fast.

Whole-network tolerance: every BF16 GEMM rounds its inputs (activations and
folded weights) with relative error <= u = 2^-8, i.e. <= 2u per product.  A
first-order bound over L GEMMs on the longest path is L*2u (0.42 for
ResNet-50, L = 54); independent roundings add like a random walk, so we assert
the norm-wise relative error ``||y - ref|| / ||ref|| <= 2u*sqrt(L)``
(ResNet-50 0.057, AlexNet 0.022).  The reference is the float64 chain in
reference.py on the *unfolded* fp32 state dict, so batch-norm folding is
checked too.  (Measured: about 0.002 and 0.005.)
"""

import os
import subprocess
import sys

import numpy as np
import pytest

import reference as R
from pycds.bf16 import models as M
from pycds.bf16.convert import to_bf16

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))

LENET_MIN_ACCURACY = 97.0  # percent, held-out digits; the record says 98.06
MAX_BF16_DROP = 0.5  # points


def empty_file_unmappable(path):
    """Why mmap(2) of one byte of the empty file ``path`` fails, or None:
    Linux maps it, whatever its page size, and safetensors' load_file
    (both backends) then reports the short header.  qemu-user with a guest
    page larger than the host's (the emulated arm64 chroot at 16 or 64 KiB
    pages) maps a file only up to its end, rounded to a host page: none of
    an empty one, and mmap fails with EINVAL, an OSError."""
    import ctypes
    import mmap

    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    fd = os.open(path, os.O_RDONLY)
    try:
        m = libc.mmap(None, 1, mmap.PROT_READ, mmap.MAP_PRIVATE, fd, 0)
        if m is None or m == ctypes.c_void_p(-1).value:
            return f"mmap: {os.strerror(ctypes.get_errno())}"
        libc.munmap(m, 1)
        return None
    finally:
        os.close(fd)


def rel_err(y, ref):
    return float(np.linalg.norm(np.asarray(y, np.float64) - ref) / np.linalg.norm(ref))


@pytest.fixture(scope="module")
def resnet_sd():
    sd = M.random_state_dict(M.resnet50_shapes(), seed=1)
    sd.update({k[:-len("running_mean")] + "num_batches_tracked": np.array(7)
               for k in list(sd) if k.endswith("running_mean")})  # torchvision has these; ignored
    return sd


@pytest.fixture(scope="module")
def resnet(resnet_sd):
    return M.ResNet50(resnet_sd)


@pytest.fixture(scope="module")
def alexnet_sd():
    return M.random_state_dict(M.alexnet_shapes(), seed=2)


class TestResNet50:
    def test_names_and_structure(self, resnet):
        shapes = M.resnet50_shapes()
        assert len([k for k in shapes if k.endswith(".weight") and len(shapes[k]) == 4]) == 53
        assert shapes["layer1.0.conv1.weight"] == (64, 64, 1, 1)
        assert shapes["layer3.5.bn3.running_var"] == (1024,)
        assert shapes["layer4.0.downsample.0.weight"] == (2048, 1024, 1, 1)
        assert shapes["fc.weight"] == (1000, 2048)
        assert [len(resnet.layer1), len(resnet.layer2), len(resnet.layer3), len(resnet.layer4)] == [3, 4, 6, 3]
        assert resnet.layer2[0].conv2.stride == (2, 2) and resnet.layer2[0].conv1.stride == (1, 1)  # v1.5
        conv = resnet.layer1[0].conv1
        assert conv.weight.dtype == np.uint16 and conv.bias.dtype == np.float32  # folded BN -> bias
        assert resnet.layer1[1].downsample is None

    def test_forward_shape_and_against_reference(self, resnet, resnet_sd):
        N, C, H, W = 1, 3, 32, 32
        x = np.random.default_rng(3).standard_normal((N, C, H, W)).astype(np.float32)
        y = resnet(x)
        assert y.shape == (N, 1000) and y.dtype == np.float32
        sd = {k: v for k, v in resnet_sd.items() if not k.endswith("num_batches_tracked")}
        ref = R.resnet50(sd, x)
        L = 54
        assert rel_err(y, ref) <= 2 * R.U_BF16 * np.sqrt(L)
        assert y.argmax() == ref.argmax()

    def test_batch_and_size(self, resnet, resnet_sd):
        # N > 1 and a non-square size; each image against the reference.  (Rows of a batch
        # are not bitwise equal to single-image runs: sbgemm's summation order may depend
        # on M, and a last-bit fp32 difference can flip a later BF16 rounding.)
        N, C, H, W = 2, 3, 48, 40
        x = np.random.default_rng(4).standard_normal((N, C, H, W)).astype(np.float32)
        y = resnet(x)
        assert y.shape == (N, 1000)
        sd = {k: v for k, v in resnet_sd.items() if not k.endswith("num_batches_tracked")}
        ref = R.resnet50(sd, x)
        for n in range(N):
            assert rel_err(y[n], ref[n]) <= 2 * R.U_BF16 * np.sqrt(54)
        assert rel_err(resnet(x[1:]), ref[1:]) <= 2 * R.U_BF16 * np.sqrt(54)

    def test_threads_share_a_model(self, resnet):
        # each thread gets its own im2col workspace (and the kernels release the GIL)
        import threading
        xs = [np.random.default_rng(10 + i).standard_normal((1, 3, 32, 32)).astype(np.float32)
              for i in range(4)]
        want = [resnet(x) for x in xs]
        got = [None] * 4

        def run(i):
            for _ in range(3):
                got[i] = resnet(xs[i])
        ts = [threading.Thread(target=run, args=(i,)) for i in range(4)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        for w, g in zip(want, got):
            np.testing.assert_array_equal(g, w)   # same chunking: same sums

    def test_num_classes_from_fc(self):
        sd = M.random_state_dict(M.resnet50_shapes(num_classes=10), seed=5)
        model = M.ResNet50(sd)
        assert model.num_classes == 10
        assert model(np.zeros((1, 3, 32, 32), np.float32)).shape == (1, 10)

    def test_bad_state_dict_reports_all_issues(self, resnet_sd):
        sd = dict(resnet_sd)
        del sd["layer2.1.bn2.running_var"]
        sd["layer1.0.conv1.weight"] = np.zeros((64, 64, 3, 3), np.float32)
        sd["extra.weight"] = np.zeros(3, np.float32)
        with pytest.raises(ValueError) as e:
            M.ResNet50(sd)
        msg = str(e.value)
        assert "missing 'layer2.1.bn2.running_var'" in msg
        assert "unexpected 'extra.weight'" in msg
        assert "'layer1.0.conv1.weight': expected shape (64, 64, 1, 1), got (64, 64, 3, 3)" in msg


    @pytest.mark.parametrize("key", ["fc.weight", "fc.bias"])
    @pytest.mark.parametrize("bad", [np.float32(1.0), np.zeros(2048, np.float32),
                                     np.zeros((10, 2048, 1), np.float32)])
    def test_misshapen_fc_is_a_value_error(self, resnet_sd, key, bad):
        sd = dict(resnet_sd)
        sd[key] = bad
        with pytest.raises(ValueError, match=f"'{key}': expected shape"):
            M.ResNet50(sd)

    @pytest.mark.parametrize("key", ["fc.bias", "fc.weight", "layer1.0.bn1.running_var",
                                     "layer3.2.conv2.weight"])
    @pytest.mark.parametrize("dtype", [np.complex64, bool, object, "U3"])
    def test_non_real_dtype_named(self, resnet_sd, key, dtype):
        sd = dict(resnet_sd)
        sd[key] = np.zeros(resnet_sd[key].shape, dtype)
        with pytest.raises(ValueError, match=f"'{key}': dtype"):
            M.ResNet50(sd)


class TestAlexNet:
    def test_names(self):
        shapes = M.alexnet_shapes()
        assert shapes["features.0.weight"] == (64, 3, 11, 11)
        assert shapes["features.10.bias"] == (256,)
        assert shapes["classifier.1.weight"] == (4096, 9216)
        assert shapes["classifier.6.weight"] == (1000, 4096)
        assert len(shapes) == 16

    def test_forward_against_reference(self, alexnet_sd):
        model = M.AlexNet(alexnet_sd)
        N, C, H, W = 2, 3, 64, 64
        x = np.random.default_rng(6).standard_normal((N, C, H, W)).astype(np.float32)
        y = model(x)
        assert y.shape == (N, 1000) and y.dtype == np.float32
        ref = R.alexnet(alexnet_sd, x)
        assert rel_err(y, ref) <= 2 * R.U_BF16 * np.sqrt(8)
        assert (y.argmax(1) == ref.argmax(1)).all()


    @pytest.mark.parametrize("bad", [np.float32(1.0), np.zeros((7,), np.float32)])
    def test_misshapen_classifier_is_a_value_error(self, alexnet_sd, bad):
        sd = dict(alexnet_sd)
        sd["classifier.6.weight"] = bad
        with pytest.raises(ValueError, match="'classifier.6.weight': expected shape"):
            M.AlexNet(sd)
        sd = dict(alexnet_sd)
        sd["classifier.6.bias"] = np.zeros(1000, np.complex128)
        with pytest.raises(ValueError, match="'classifier.6.bias': dtype complex128"):
            M.AlexNet(sd)


class TestWeightFiles:
    @pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
    def test_round_trip_resnet(self, tmp_path, resnet, resnet_sd, suffix):
        # BF16 weights (uint16) + fp32 norms/biases survive a file round trip bit for bit.
        sd = {k: (to_bf16(v) if v.ndim > 1 else v) for k, v in resnet_sd.items()}
        path = tmp_path / f"resnet50{suffix}"
        M.save_state_dict(sd, path)
        loaded = M.load_state_dict(path)
        assert loaded.keys() == sd.keys()
        for k, v in sd.items():
            np.testing.assert_array_equal(np.asarray(loaded[k]).view(v.dtype), v, err_msg=k)
        x = np.random.default_rng(7).standard_normal((1, 3, 32, 32)).astype(np.float32)
        np.testing.assert_array_equal(M.ResNet50.from_file(path)(x), M.ResNet50(sd)(x))

    def test_safetensors_bf16_dtype_and_metadata(self, tmp_path):
        import ml_dtypes
        from safetensors import safe_open

        sd = {"w": to_bf16(np.array([[1.5, -2.0]], np.float32)), "b": np.ones(2, np.float32)}
        path = tmp_path / "t.safetensors"
        M.save_state_dict(sd, path, metadata={"k": "v"})
        with safe_open(str(path), "np") as f:
            assert f.metadata() == {"k": "v"}
        assert M.load_state_dict(path)["w"].dtype == ml_dtypes.bfloat16

    def test_ml_dtypes_imported_only_for_bf16_files(self, tmp_path):
        # Importing ml_dtypes costs about 0.4 s: an fp32 file does without it,
        # a BF16 file gets it (in a fresh interpreter, nothing imported before).
        M.save_state_dict({"w": np.ones((2, 2), np.float32)}, tmp_path / "f.safetensors")
        M.save_state_dict({"w": to_bf16(np.ones((2, 2), np.float32))}, tmp_path / "b.safetensors")
        src = ("import sys; from pycds.bf16.models import load_state_dict as L; "
               f"a = L({str(tmp_path / 'f.safetensors')!r})['w']; m = 'ml_dtypes' in sys.modules; "
               f"b = L({str(tmp_path / 'b.safetensors')!r})['w']; "
               "print(a.dtype, m, b.dtype.name)")
        out = subprocess.run([sys.executable, "-c", src], capture_output=True, text=True,
                             cwd=str(tmp_path), timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["float32", "False", "bfloat16"]

    @pytest.mark.parametrize("name, data", [
        ("g.npz", b"garbage" * 10), ("e.npz", b""), ("t.npz", b"PK\x03\x04" + b"\0" * 40),
        ("g.safetensors", b"garbage" * 10), ("e.safetensors", b""),
        ("t.safetensors", b"\x10\0\0\0\0\0\0\0{\"a\": 1}"),
    ])
    def test_corrupt_file_is_a_value_error(self, tmp_path, name, data):
        path = tmp_path / name
        path.write_bytes(data)
        if name == "e.safetensors":
            why = empty_file_unmappable(path)
            if why:
                pytest.skip(f"this system cannot map an empty file, which safetensors "
                            f"does before reading its header: {why}")
        with pytest.raises(ValueError, match=f"not a valid .* file: {str(path)!r}") as e:
            M.load_state_dict(path)
        assert e.value.__cause__ is not None

    def test_npy_named_npz_is_a_value_error(self, tmp_path):
        path = tmp_path / "x.npz"
        with open(path, "wb") as f:
            np.save(f, np.zeros(3))
        with pytest.raises(ValueError, match="not a valid .npz file"):
            M.load_state_dict(path)

    @pytest.mark.parametrize("suffix", [".npz", ".safetensors"])
    def test_missing_file_is_an_os_error(self, tmp_path, suffix):
        with pytest.raises(FileNotFoundError):
            M.load_state_dict(tmp_path / f"missing{suffix}")

    def test_bad_suffix(self, tmp_path):
        with pytest.raises(ValueError, match=r"\.npz or \.safetensors"):
            M.load_state_dict(tmp_path / "w.pt")


class TestLeNetDigits:
    def test_shipped_accuracy(self):
        model, record = M.load_lenet_digits()
        images, labels = M.load_digits_test()
        assert images.shape == (360, 1, 8, 8) and images.dtype == np.float32
        assert 0 <= images.min() and images.max() <= 1
        assert np.bincount(labels).min() >= 35  # stratified: every digit present
        acc = float((model.predict(images) == labels).mean() * 100)
        fp32, bf16 = float(record["fp32_accuracy"]), float(record["bf16_accuracy"])
        assert acc == pytest.approx(bf16, abs=0.005)  # the recorded result (2 decimals) reproduces
        assert acc >= LENET_MIN_ACCURACY
        assert bf16 >= fp32 - MAX_BF16_DROP

    def test_weights_are_bf16_and_small(self):
        import ml_dtypes

        path = M._data_path(M.LENET_DIGITS_FILE)
        sd = M.load_state_dict(path)
        assert all(v.dtype == ml_dtypes.bfloat16 for k, v in sd.items() if k.endswith("weight"))
        assert os.path.getsize(path) < 300_000
        assert {k: v.shape for k, v in sd.items()} == M.lenet_digits_shapes()

    def test_example_output_is_deterministic(self):
        env = dict(os.environ)   # the installed package, as a user runs it
        cmd = [sys.executable, os.path.join(ROOT, "examples", "bf16_infer.py")]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
        assert "accuracy: 98.06% (353/360)" in out
        assert out == subprocess.run(cmd, env=env, capture_output=True, text=True, check=True).stdout
