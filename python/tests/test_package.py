"""What `pip install ./python` installs: the package with libgpumem.so,
gpumem.h and the C++ sources inside."""

import glob
import os

import pytest

import gpumem
from support import INSTALLED, PYTHON_DIR, child_ok, lib


def test_include_dir_holds_the_header():
    with open(os.path.join(gpumem.include_dir(), "gpumem.h")) as f:
        header = f.read()
    for name in ["gpumem_malloc", "gpumem_free", "gpumem_config_error"]:
        assert name in header, name


def test_gpumem_lib_overrides_the_search(tmp_path):
    copy = tmp_path / "libgpumem.so"
    copy.write_bytes(open(gpumem.library_path(), "rb").read())
    r = child_ok(
        "import gpumem\n"
        "assert gpumem.library_path() == %r, gpumem.library_path()\n"
        "assert gpumem.library().gpumem_config_error() is None\n"
        "print('child ok')\n" % str(copy),
        env={"GPUMEM_LIB": str(copy)},
    )
    assert "child ok" in r.stdout


def test_a_missing_library_names_every_place_searched(tmp_path):
    missing = str(tmp_path / "nowhere" / "libgpumem.so")
    r = child_ok(
        "import gpumem\n"
        "try:\n"
        "    gpumem.library()\n"
        "except FileNotFoundError as e:\n"
        "    print(e)\n"
        "print('child ok')\n",
        env={"GPUMEM_LIB": missing},
    )
    assert "pip install ./python" in r.stdout and missing in r.stdout, r.stdout


@pytest.mark.skipif(not INSTALLED, reason="set GPUMEM_TEST_INSTALLED=1 after pip install ./python")
def test_the_installed_package_brings_its_library():
    package = os.path.dirname(os.path.abspath(gpumem.__file__))
    assert not package.startswith(PYTHON_DIR + os.sep), "imported from the checkout"
    if "GPUMEM_LIB" not in os.environ:
        assert gpumem.library_path() == os.path.realpath(os.path.join(package, "libgpumem.so"))
    assert os.path.isfile(os.path.join(package, "libgpumem.so"))
    assert gpumem.include_dir() == os.path.join(package, "include")
    for source in glob.glob(os.path.join(PYTHON_DIR, "gpumem", "csrc", "*.cpp")):
        assert os.path.isfile(os.path.join(package, "csrc", os.path.basename(source))), source
    assert lib.gpumem_config_error() is None


def test_the_distribution_name_is_not_the_import_name_s_taken_one():
    # `gpumem` on PyPI is another project's; ours is distributed as
    # gpumem-rs and imported as gpumem (docs/pytorch.md).
    import pathlib

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    meta = tomllib.loads((pathlib.Path(__file__).parents[1] / "pyproject.toml").read_text())
    assert meta["project"]["name"] == "gpumem-rs"
    packages = meta["tool"]["setuptools"].get("packages", ["gpumem"])
    assert "gpumem" in packages
