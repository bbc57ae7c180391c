"""gpumem._cuda_home: a CUDA home laid out from an NVIDIA runtime wheel,
for building the native allocator without a CUDA toolkit (no PyTorch or
GPU needed: a stand-in wheel in a temporary folder)."""

import os
import sys
import types

from gpumem import _cuda_home


def fake_nvidia(tmp_path, monkeypatch, sub="cu13", with_lib=True):
    base = tmp_path / "site" / "nvidia"
    inc = base / sub / "include"
    inc.mkdir(parents=True)
    (inc / "cuda_runtime_api.h").write_text("/* stand-in */\n")
    lib = base / sub / "lib"
    lib.mkdir()
    if with_lib:
        (lib / "libcudart.so.13").write_bytes(b"\x7fELF")
    module = types.ModuleType("nvidia")
    module.__path__ = [str(base)]
    monkeypatch.setitem(sys.modules, "nvidia", module)
    return inc, lib


def test_a_home_is_laid_out_from_the_wheel(tmp_path, monkeypatch):
    inc, lib = fake_nvidia(tmp_path, monkeypatch)
    home = _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache"))
    assert os.path.realpath(os.path.join(home, "include")) == os.path.realpath(inc)
    cudart = os.path.join(home, "lib64", "libcudart.so")
    assert os.path.realpath(cudart) == os.path.realpath(lib / "libcudart.so.13")
    assert os.path.exists(os.path.join(home, "lib64", "libcudart.so.13"))
    # Laid out again (another process, a later build): the same home.
    assert _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache")) == home


def test_cuda_12_wheels_are_found_too(tmp_path, monkeypatch):
    fake_nvidia(tmp_path, monkeypatch, sub="cuda_runtime")
    assert _cuda_home.wheel_runtime() is not None


def test_no_wheel_or_no_library_is_none(tmp_path, monkeypatch):
    fake_nvidia(tmp_path, monkeypatch, with_lib=False)
    assert _cuda_home.wheel_runtime() is None
    assert _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache")) is None
    monkeypatch.setitem(sys.modules, "nvidia", None)  # import nvidia fails
    assert _cuda_home.wheel_runtime() is None
