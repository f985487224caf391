"""Into a real VLM: M-RoPE position ids for a TokenSet and Qwen-VL's pixel input.

``positions`` and ``qwen`` are pure torch (no transformers import). ``fovea_core.vlm.processor`` (``FoveatedProcessor``: a page and a
prompt to the inputs of ``model.generate`` for a foveated page) is a user entry point built on
:func:`fovea_core.foveate` (the top layer), so this package does not import it: use
``from fovea_core.vlm.processor import FoveatedProcessor``.
"""

from fovea_core.vlm.positions import (MRopePositions, merged_cell_px, merged_cells,
                                      merged_grid_shape, mrope_positions, rope2d_angles,
                                      token_scale)

__all__ = ["MRopePositions", "merged_cell_px", "merged_cells", "merged_grid_shape",
           "mrope_positions", "rope2d_angles", "token_scale"]
