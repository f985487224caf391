"""Fit the fixation readout (:mod:`fovea_core.importance.fixation`) on ``osie-train``.

Deterministic: full-batch L-BFGS in float64 from zero weights, no randomness except the
seed of the shuffled-AUC diagnostics (recorded). The objective is the mean over images of
the mean negative log-likelihood of the observers' fixations under the readout's softmax
map on the working grid (Kuemmerer, Wallis & Bethge 2016, "DeepGaze II"), plus a small
L2 penalty on the feature weights. The final blur is chosen among :data:`POST_BLURS` by
the training CC: the CC-optimal map of a probabilistic model is its fixation probability
blurred like the human density (Kuemmerer, Wallis & Bethge 2018, "Saliency benchmarking made
easy", ECCV). A centre-bias-only model (the same readout without features)
is fitted the same way; it is the chapter's centre-bias row.

Usage::

    python -m fovea_book.eval.fit_fixation                      # -> _build/models/
    python -m fovea_book.eval.fit_fixation --replace-committed  # -> fovea_core/weights/

Fit only on training images: the book reports on ``osie-dev``. The diagnostics stored in
the record (training log-likelihood, CC, NSS) are fit diagnostics, not results.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

import numpy as np
import torch

from fovea_core.importance import fixation as fx
from fovea_book.paths import dataset_path, project_root

#: candidate final blurs (working cells)
POST_BLURS: tuple[float, ...] = (0.0, 1.0, 2.0, 3.0)
#: L2 penalty on the feature weights (per unit of mean log-likelihood)
L2: float = 1e-3
DEFAULT_OUT = project_root() / "_build" / "models" / "fixation_readout.json"


def training_data(root: Path, *, max_images: int | None = None
                  ) -> tuple[list[str], tuple[int, int], torch.Tensor, torch.Tensor,
                             torch.Tensor]:
    """Features and fixation counts of the OSIE images in ``root``.

    Returns:
        ``(images, (H, W), feats [N, F, gh, gw], centre [4, gh, gw], counts [N, gh, gw])``; counts
        are every observer's fixations per working cell.

    Raises:
        ValueError: the images do not share one size, or an image differs in size from its
            fixation record, or has no fixation (the message names the image).
    """
    from PIL import Image

    from fovea_book.eval import eyetracking as et

    recs = et.load_osie(root, max_images=max_images)
    sizes = {r.size for r in recs}
    if len(sizes) != 1:
        raise ValueError(f"{root}: the images must share one size to fit one grid, got {sizes}")
    size = sizes.pop()
    cell, gh, gw = fx.work_grid(size)
    feats, counts = [], []
    for rec in recs:                                     # loop over images (features per image)
        image = np.array(Image.open(rec.path).convert("RGB"))
        et.check_image_size(rec, image)
        pts = rec.points()
        if len(pts) == 0:
            raise ValueError(f"{rec.image}: no fixations to fit on")
        feats.append(fx.blurred_features(fx.base_features(image))[0])
        counts.append(torch.from_numpy(et.fixation_counts(pts, (gh, gw), scale=1 / cell)))
    return ([r.image for r in recs], size, torch.stack(feats), fx.centre_features(size),
            torch.stack(counts))


def _nll(logit: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Per-image mean NLL (nats per fixation) of ``counts [N, gh, gw]`` under softmax(logit)."""
    logp = torch.log_softmax(logit.reshape(len(logit), -1), 1)
    c = counts.reshape(len(counts), -1)
    return -(logp * c).sum(1) / c.sum(1)


def _post_nll(logit: torch.Tensor, counts: torch.Tensor, blur: float) -> torch.Tensor:
    p = fx.readout_map(logit, blur).clamp_min(1e-300)
    c = counts.reshape(len(counts), -1)
    return -(torch.log(p.reshape(len(p), -1)) * c).sum(1) / c.sum(1)


def fit(feats: torch.Tensor, centre: torch.Tensor, counts: torch.Tensor, *,
        use_features: bool = True, max_iter: int = 300) -> tuple[torch.Tensor, torch.Tensor]:
    """L-BFGS fit of Eq. 1's ``(weights [F], centre coefficients [4])`` from zeros."""
    f = feats.double() if use_features else feats.double()[:, :0]
    w = torch.zeros(f.shape[1], dtype=torch.float64, requires_grad=True)
    c = torch.zeros(len(centre), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([w, c], lr=1, max_iter=max_iter, tolerance_grad=1e-9,
                            tolerance_change=1e-12, history_size=50,
                            line_search_fn="strong_wolfe")

    def closure() -> torch.Tensor:
        opt.zero_grad()
        loss = _nll(fx.readout_logits(f, centre, w, c), counts).mean() + L2 * (w**2).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), c.detach()


def _diagnostics(prob: torch.Tensor, counts: torch.Tensor, cell: int) -> dict[str, float]:
    """Training-set fit diagnostics: information gain over uniform (bits per fixation),
    CC with the blurred fixation density, NSS (means over images)."""
    from scipy import ndimage

    from fovea_book.eval.saliency_metrics import cc, nss

    c = counts.numpy()
    n = c[0].size
    p = prob.numpy()
    ig = ((np.log2(np.clip(p, 1e-300, None) * n) * c).sum((1, 2)) / c.sum((1, 2))).mean()
    sigma = 24.0 / cell                       # 1 degree at 24 px/deg, in working cells
    dens = np.stack([ndimage.gaussian_filter(ci, sigma, mode="constant", truncate=3.5)
                     for ci in c])
    return {"info_gain_bits": float(ig), "CC": float(np.mean(cc(p, dens))),
            "NSS": float(np.mean(nss(p, c > 0)))}


def run(root: Path, *, max_images: int | None = None, seed: int = 0) -> dict:
    """Fit both models on the OSIE folder ``root`` and return the JSON record."""
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    images, size, feats, centre, counts = training_data(root, max_images=max_images)
    t_feat = time.perf_counter() - t0
    cell = fx.work_grid(size)[0]
    out: dict = {"features": fx.feature_names(), "centre_terms": list(fx.CENTRE_TERMS)}
    diags = {}
    for key, use in (("full", True), ("centre_only", False)):
        w, c = fit(feats, centre, counts, use_features=use)
        logit = fx.readout_logits(feats.double()[:, : len(w)], centre, w, c)
        nlls = {b: float(_post_nll(logit, counts, b).mean()) for b in POST_BLURS}
        ccs = {b: _diagnostics(fx.readout_map(logit, b), counts, cell)["CC"] for b in POST_BLURS}
        blur = max(ccs, key=ccs.get)
        diags[key] = _diagnostics(fx.readout_map(logit, blur), counts, cell)
        diags[key]["nll_nats_by_post_blur"] = {f"{b:g}": v for b, v in nlls.items()}
        diags[key]["CC_by_post_blur"] = {f"{b:g}": v for b, v in ccs.items()}
        if use:
            out.update({"weights": w.tolist(), "centre": c.tolist(), "post_blur": blur})
        else:
            out["centre_only"] = {"centre": c.tolist(), "post_blur": blur}
    import cv2
    import onnxruntime
    import skimage
    out["record"] = {
        "data": str(Path(root).name), "image_size": list(size), "images": images,
        "n_images": len(images),
        "seed": seed, "objective": "mean over images of the mean NLL per fixation "
        "(softmax over the working grid) + L2 * |w|^2", "l2": L2,
        "optimiser": "torch.optim.LBFGS (strong Wolfe), float64, from zeros",
        "work_grid": list(counts.shape[1:]), "post_blurs_tried": list(POST_BLURS),
        "post_blur_chosen_by": "train CC",
        "train_diagnostics_not_results": diags,
        "feature_seconds": round(t_feat, 1),
        "versions": {"python": platform.python_version(), "torch": torch.__version__,
                     "numpy": np.__version__, "onnxruntime": onnxruntime.__version__,
                     "opencv": cv2.__version__, "scikit-image": skimage.__version__,
                     "text_model": fx.text_model_path().name,
                     "face_model": fx.face_model_path().name},
    }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fovea_book.eval.fit_fixation",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None,
                        help="the osie-train folder (default: dataset_path('osie-train'))")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT,
                        help=f"output JSON (default {DEFAULT_OUT})")
    parser.add_argument("--replace-committed", action="store_true",
                        help=f"write the committed coefficients {fx.READOUT_PATH} instead")
    parser.add_argument("--max-images", type=int, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    root = args.data or dataset_path("osie-train")
    if "dev" in Path(root).name:
        parser.error(f"{root} looks like a development set; fit on osie-train only")
    out = fx.READOUT_PATH if args.replace_committed else args.out
    rec = run(root, max_images=args.max_images, seed=args.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rec, indent=1) + "\n")
    print(f"wrote {out}: {rec['record']['n_images']} images; diagnostics "
          f"{json.dumps(rec['record']['train_diagnostics_not_results'])}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
