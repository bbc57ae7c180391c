"""gpumem._cuda_home: a CUDA home laid out from an NVIDIA runtime wheel,
for building the native allocator without a CUDA toolkit (no PyTorch or
GPU needed: a stand-in wheel in a temporary folder)."""

import importlib.machinery
import importlib.util
import os
import sys
import types

import pytest

from gpumem import _cuda_home


def fake_nvidia(tmp_path, monkeypatch, sub="cu13", with_lib=True, with_crt=True, extra_bases=()):
    base = tmp_path / "site" / "nvidia"
    inc = base / sub / "include"
    inc.mkdir(parents=True)
    (inc / "cuda_runtime_api.h").write_text("/* stand-in */\n")
    (inc / "cuda_runtime.h").write_text('#include "crt/host_config.h"\n')
    if with_crt:
        crt(inc)
    lib = base / sub / "lib"
    lib.mkdir()
    if with_lib:
        (lib / "libcudart.so.13").write_bytes(b"\x7fELF")
    module = types.ModuleType("nvidia")
    module.__path__ = [str(base)] + [str(b) for b in extra_bases]
    monkeypatch.setitem(sys.modules, "nvidia", module)
    return inc, lib


def crt(include):
    """A stand-in crt/ folder under ``include``; returns it."""
    folder = include / "crt"
    folder.mkdir(parents=True)
    (folder / "host_config.h").write_text("/* stand-in */\n")
    return folder


def fake_triton(tmp_path, monkeypatch, with_crt=True):
    """Triton found where ``tmp_path/triton`` is (never imported)."""
    root = tmp_path / "triton"
    root.mkdir()
    if with_crt:
        crt(root / "backends" / "nvidia" / "include")
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "triton":
            spec = importlib.machinery.ModuleSpec("triton", None, is_package=True)
            spec.submodule_search_locations = [str(root)]
            return spec
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return root


def no_triton(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a, **k: None if name == "triton" else real(name, *a, **k)
    )


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


def test_crt_headers_from_another_nvidia_wheel_join_the_include(tmp_path, monkeypatch):
    # CUDA 13: the runtime wheel lacks crt/, nvidia-cuda-crt (here installed
    # into another folder of the namespace) has it.
    other = tmp_path / "other" / "nvidia"
    crt_dir = crt(other / "cu13" / "include")
    no_triton(monkeypatch)
    inc, _ = fake_nvidia(tmp_path, monkeypatch, with_crt=False, extra_bases=[other])
    home = _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache"))
    merged = os.path.join(home, "include")
    assert not os.path.islink(merged)
    assert os.path.realpath(os.path.join(merged, "crt")) == os.path.realpath(crt_dir)
    for name in ("cuda_runtime_api.h", "cuda_runtime.h"):
        assert os.path.realpath(os.path.join(merged, name)) == os.path.realpath(inc / name)
    assert os.path.isfile(os.path.join(merged, "crt", "host_config.h"))
    assert _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache")) == home


def test_tritons_crt_headers_serve_when_no_nvidia_wheel_has_them(tmp_path, monkeypatch):
    fake_nvidia(tmp_path, monkeypatch, with_crt=False)
    root = fake_triton(tmp_path, monkeypatch)
    home = _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache"))
    assert os.path.realpath(os.path.join(home, "include", "crt")) == os.path.realpath(
        root / "backends" / "nvidia" / "include" / "crt"
    )


def test_the_wheels_own_crt_headers_come_first(tmp_path, monkeypatch):
    inc, _ = fake_nvidia(tmp_path, monkeypatch)
    fake_triton(tmp_path, monkeypatch)
    assert _cuda_home.crt_headers(str(inc)) == str(inc / "crt")


def test_no_crt_headers_anywhere_says_what_to_install(tmp_path, monkeypatch):
    fake_nvidia(tmp_path, monkeypatch, with_crt=False)
    fake_triton(tmp_path, monkeypatch, with_crt=False)
    with pytest.raises(RuntimeError, match="nvidia-cuda-crt"):
        _cuda_home.cuda_home_from_wheel(str(tmp_path / "cache"))
