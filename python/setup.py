"""pip install ./python: builds libfiattn.so with the project's Makefile (`make lib`) and
bundles it in the package; the version comes from include/fiattn.h (FIATTN_VERSION_*).

Environment: FIATTN_MAKE (default "make"), FIATTN_MAKE_JOBS (default 2), and the
Makefile's own knobs (CUDA_HOME, NVCC, GPU_ARCH, ...)."""
import os
import re
import shutil
import subprocess

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def header_version():
    with open(os.path.join(ROOT, "include", "fiattn.h")) as f:
        text = f.read()
    return ".".join(re.search(r"^#define FIATTN_VERSION_%s\s+(\d+)" % k, text, re.M).group(1)
                    for k in ("MAJOR", "MINOR", "PATCH"))


class BuildWithLibrary(build_py):
    def run(self):
        super().run()
        make = os.environ.get("FIATTN_MAKE", "make")
        jobs = os.environ.get("FIATTN_MAKE_JOBS", "2")
        subprocess.check_call([make, "-C", ROOT, "-j" + jobs, "lib"])
        so = os.path.realpath(os.path.join(ROOT, "build", "libfiattn.so"))
        dst = os.path.join(self.build_lib, "fiattn")
        os.makedirs(dst, exist_ok=True)
        shutil.copyfile(so, os.path.join(dst, "libfiattn.so"))
        with open(os.path.join(dst, "_build_version.py"), "w") as f:
            f.write("version = %r\n" % header_version())


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # a platform wheel: it carries libfiattn.so


setup(
    name="fiattn",
    version=header_version(),
    description="Plan-once, run-many paged attention (MLA / GQA decode, context) for NVIDIA "
                "Hopper, with FlashInfer-compatible Python APIs",
    packages=["fiattn"],
    python_requires=">=3.9",
    extras_require={"torch": ["torch>=2.3"], "test": ["pytest", "torch>=2.3"]},
    cmdclass={"build_py": BuildWithLibrary},
    distclass=BinaryDistribution,
    zip_safe=False,
)
