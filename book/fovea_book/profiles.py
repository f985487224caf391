"""Run profiles shared by every notebook's ``parameters`` cell.

``smoke`` = tiny sizes so the whole book runs in CI; ``default`` = the published book on a
laptop CPU; ``full`` = the large runs.
"""

from __future__ import annotations

from typing import TypeVar

T = TypeVar("T")
PROFILES = ("smoke", "default", "full")


def choose(profile: str, *, smoke: T, default: T, full: T | None = None) -> T:
    """The value for ``profile`` (``full`` falls back to ``default`` when not given)."""
    if profile not in PROFILES:
        raise ValueError(f"profile must be one of {PROFILES}, got {profile!r}")
    if profile == "smoke":
        return smoke
    if profile == "full" and full is not None:
        return full
    return default
