"""fovea_core: fixed-budget, variable-density (foveated) visual token allocation.

The data flow (see the book's introduction)::

    image [B,C,H,W] --build_pyramid--> Pyramid
                    --importance--> scores [B,Gh,Gw]
                    --allocator--> TokenSet (exactly N tokens per image)
    TokenSet --sample--> patches [B,N,C,p,p] --render--> foveated reconstruction

One call for a page (and a question), every stage wired as the book does::

    f = fovea_core.foveate("page.png", "What is the total?", budget=273)
    f.tokens, f.patches, f.view, f.cost
"""

from fovea_core.paths import data_dir, dataset_path, project_root
from fovea_core.profiles import PROFILES, choose
from fovea_core.pyramid import Pyramid, as_image_batch, build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["PROFILES", "Foveation", "Pyramid", "TokenSet", "as_image_batch", "build_pyramid",
           "choose", "data_dir", "dataset_path", "foveate", "project_root"]

#: names exported lazily (importing them loads the allocators, the scorers and the sampler)
_LAZY = {"foveate": ("fovea_core.foveate", "foveate"),
         "Foveation": ("fovea_core.foveate", "Foveation")}


def __getattr__(name: str):
    """``fovea_core.foveate`` and ``fovea_core.Foveation``, imported on first use so that
    ``import fovea_core`` stays light (:mod:`fovea_core.foveate`)."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        if name != "foveate":       # the submodule of that name is itself callable as foveate
            globals()[name] = value
        return value
    raise AttributeError(f"module 'fovea_core' has no attribute {name!r}")
__version__ = "0.1.0"
