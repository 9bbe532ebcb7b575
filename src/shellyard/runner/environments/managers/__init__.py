"""Package managers that change an environment's prefix: conda (py-rattler), pip (uv),
cran and bioconductor (Rscript). Each implements ``base.PackageManager``."""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping

from shellyard.runner.environments.managers.base import PackageManager


class _Managers(Mapping[str, PackageManager]):
    """Every manager by the name requests use (``EnvironmentChangeRequest.manager``), in the
    order a revision lists their packages, each imported when first used: py-rattler alone
    adds ~20 MiB and its import time to every runner start, and most runners change no
    environment for a long time."""

    _WHERE = {
        "conda": ("shellyard.runner.environments.managers.conda", "CondaManager"),
        "pip": ("shellyard.runner.environments.managers.pip", "PipManager"),
        "cran": ("shellyard.runner.environments.managers.cran", "CranManager"),
        "bioconductor": ("shellyard.runner.environments.managers.cran", "BioconductorManager"),
    }

    def __init__(self) -> None:
        self._made: dict[str, PackageManager] = {}

    def __getitem__(self, name: str) -> PackageManager:
        made = self._made.get(name)
        if made is None:
            module, attribute = self._WHERE[name]
            made = self._made[name] = getattr(importlib.import_module(module), attribute)()
        return made

    def __iter__(self) -> Iterator[str]:
        return iter(self._WHERE)

    def __len__(self) -> int:
        return len(self._WHERE)


MANAGERS: Mapping[str, PackageManager] = _Managers()
