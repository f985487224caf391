"""fovea_core: fixed-budget, variable-density (foveated) visual token allocation.

The data flow (see the book's introduction)::

    image [B,C,H,W] --build_pyramid--> Pyramid
                    --importance--> scores [B,Gh,Gw]
                    --allocator--> TokenSet (exactly N tokens per image)
    TokenSet --sample--> patches [B,N,C,p,p] --render--> foveated reconstruction
"""

from fovea_core.paths import data_dir, dataset_path, project_root
from fovea_core.profiles import PROFILES, choose
from fovea_core.pyramid import Pyramid, as_image_batch, build_pyramid
from fovea_core.tokens import TokenSet

__all__ = ["PROFILES", "Pyramid", "TokenSet", "as_image_batch", "build_pyramid", "choose",
           "data_dir", "dataset_path", "project_root"]
__version__ = "0.1.0"
