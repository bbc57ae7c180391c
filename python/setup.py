"""Builds libgpumem.so from the Cargo workspace this folder sits in and puts it
inside the package (gpumem/libgpumem.so), with gpumem.h (gpumem/include/).

The library is a plain C shared library (no Python bindings): setuptools-rust
builds the `gpumem-cdylib` package as it is, and the two commands below keep
its C name (not a `.cpython-*.so` module name, so C++ can link it with
-lgpumem) and tag the wheel for any Python 3 (the library does not use
Python's ABI).
"""

import os
import shutil

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py
from setuptools_rust import Binding, RustExtension, Strip

HERE = os.path.dirname(os.path.abspath(__file__))
WORKSPACE = os.path.dirname(HERE)
LIBRARY = "gpumem.libgpumem"
HEADER = os.path.join(WORKSPACE, "crates", "gpumem-capi", "include", "gpumem.h")

class build_ext_c_name(build_ext):
    """The library keeps its C name, libgpumem.so."""

    def get_ext_filename(self, fullname):
        # Called with the dotted name or only its last part.
        if fullname in (LIBRARY, LIBRARY.rsplit(".", 1)[1]):
            return os.path.join(*fullname.split(".")) + ".so"
        return super().get_ext_filename(fullname)


class build_py_with_header(build_py):
    """Ships the C header beside the library, for C++ built against it."""

    def run(self):
        super().run()
        target = os.path.join(self.build_lib, "gpumem", "include")
        self.mkpath(target)
        shutil.copyfile(HEADER, os.path.join(target, "gpumem.h"))


class bdist_wheel_any_python(bdist_wheel):
    """One wheel per platform, for every Python 3."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    rust_extensions=[
        RustExtension(
            LIBRARY,
            path=os.path.relpath(
                os.path.join(WORKSPACE, "crates", "gpumem-capi", "cdylib", "Cargo.toml")
            ),
            binding=Binding.NoBinding,
            strip=Strip.Debug,
        )
    ],
    cmdclass={
        "build_ext": build_ext_c_name,
        "build_py": build_py_with_header,
        "bdist_wheel": bdist_wheel_any_python,
    },
)
