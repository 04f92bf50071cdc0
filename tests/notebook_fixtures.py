"""The placeholder notebooks the workshop tests run on, stored as `.nb.json` (not `.ipynb`): the
dirty one is committed with outputs on purpose, and the repo's rule is that every committed
`.ipynb` is clean. Tests materialise them as `.ipynb` where they need them."""
import shutil
import tempfile
from pathlib import Path

DATA = Path(__file__).parent / "data" / "notebooks"


def materialise(name: str, directory=None) -> Path:
    """Copy `tests/data/notebooks/<name>.nb.json` to `<directory>/<name>.ipynb` (default: a new
    temporary folder) and return the path."""
    directory = Path(directory) if directory is not None else Path(tempfile.mkdtemp(prefix="nwor_nb_"))
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{name}.ipynb"
    shutil.copy(DATA / f"{name}.nb.json", target)
    return target
