"""Package managers that change an environment's prefix: conda (py-rattler), pip (uv),
cran and bioconductor (Rscript). Each implements ``base.PackageManager``."""
