"""Build hook: ship the scheme files of ``models/`` inside the package.

Everything else is declared in pyproject.toml. The repository keeps a single copy of the
schemes, in ``models/`` (the folder the README and the tests name); a wheel carries them as
``kingen/bundled/models/*.toml``, where :func:`kingen.model.shipped.models_dir` finds them in an
installed kingen.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent


class BuildPyWithModels(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads models/ in place
        target = Path(self.build_lib) / "kingen" / "bundled" / "models"
        target.mkdir(parents=True, exist_ok=True)
        for f in sorted((ROOT / "models").glob("*")):
            if f.suffix in (".toml", ".md"):
                shutil.copy2(f, target / f.name)


setup(cmdclass={"build_py": BuildPyWithModels})
