"""Built-in experiments, one TOML file each: the studies' questions restated (docs/experiments.md)."""

from __future__ import annotations

from importlib import resources

__all__ = ["builtin_names", "builtin_text"]


def builtin_names() -> list[str]:
    return sorted(p.name.removesuffix(".toml") for p in resources.files(__name__).iterdir()
                  if p.name.endswith(".toml"))


def builtin_text(name: str) -> str | None:
    path = resources.files(__name__) / f"{name}.toml"
    return path.read_text() if path.is_file() else None
