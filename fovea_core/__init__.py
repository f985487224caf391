"""fovea_core: fixed-budget, variable-density (foveated) visual token allocation.

The data flow (see the book's introduction)::

    image [B,C,H,W] --build_pyramid--> Pyramid
                    --importance--> scores [B,Gh,Gw]
                    --allocator--> TokenSet (exactly N tokens per image)
    TokenSet --sample--> patches [B,N,C,p,p] --render--> foveated reconstruction

One call for a page (and a question), every stage wired as the book does::

    f = fovea_core.foveate("page.png", "What is the total?", budget=273)
    f.tokens, f.patches, f.view, f.cost

Adapted to a folder of your own (unlabelled) pages, then used::

    fovea_core.adapt("my_pages/", out="my_localiser.pt")
    f = fovea_core.foveate("page.png", "What is the total?", method="cascade",
                           localiser="my_localiser.pt")
"""

from fovea_core.pyramid import Pyramid, as_image_batch, build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["Foveation", "Pyramid", "TokenSet", "adapt", "as_image_batch", "build_pyramid",
           "foveate"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``fovea_core.foveate`` (a function), ``fovea_core.Foveation`` and ``fovea_core.adapt``,
    imported on first use so that ``import fovea_core`` stays light
    (:mod:`fovea_core.foveation`, :mod:`fovea_core.adaptation`)."""
    if name in ("foveate", "Foveation", "adapt"):
        from fovea_core import adaptation, foveation

        value = getattr(adaptation if name == "adapt" else foveation, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fovea_core' has no attribute {name!r}")
