"""Package managers that change an environment's prefix: conda (py-rattler), pip (uv),
cran and bioconductor (Rscript). Each implements ``base.PackageManager``."""

from shellyard.runner.env_managers.base import PackageManager
from shellyard.runner.env_managers.conda import CondaManager
from shellyard.runner.env_managers.cran import BioconductorManager, CranManager
from shellyard.runner.env_managers.pip import PipManager

#: Every manager by the name requests use (``EnvironmentChangeRequest.manager``), in the
#: order a revision lists their packages.
MANAGERS: dict[str, PackageManager] = {
    "conda": CondaManager(),
    "pip": PipManager(),
    "cran": CranManager(),
    "bioconductor": BioconductorManager(),
}
