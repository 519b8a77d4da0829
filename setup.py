"""Build step the pyproject.toml metadata cannot say: ship the lessons (``notebooks/NN_*.ipynb``) inside the
package as ``workbench/notebooks/``, so ``workbench lab`` outside a checkout has them. The repository keeps
the one source, ``notebooks/``; a checkout reads it there (``workbench/commands/lab.py::lesson_source``)."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class build_py_with_lessons(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):  # an editable install reads notebooks/ in place
            return
        target = Path(self.build_lib) / "workbench" / "notebooks"
        self.mkpath(str(target))
        for lesson in sorted((HERE / "notebooks").glob("[0-9][0-9]_*.ipynb")):
            self.copy_file(str(lesson), str(target / lesson.name))


setup(cmdclass={"build_py": build_py_with_lessons})
