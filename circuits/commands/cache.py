"""``af1 cache``: list or clear the user's results cache (fitted means and checked prompts that later commands on the
same model and task reuse; :mod:`circuits.store.usercache`)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field

from circuits.flags import add_flags, flag, values

KIND_CHOICES = ("means", "prompts")
"""What ``--kind`` may name (:data:`circuits.store.usercache.KINDS`)."""


@dataclass(frozen=True)
class CacheSpec:
    """What ``af1 cache`` does: ``action`` (``list`` or ``clear``) on the entries of ``kind`` (``None``: every kind)."""

    action: str = "list"
    kind: str | None = field(default=None, metadata=flag("only the entries of this kind (default: every kind)",
                                                         choices=KIND_CHOICES))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="cache_command", metavar="ACTION")
    for name, text in (("list", "the cached results, least recently used first, with their sizes"),
                       ("clear", "remove the cached results (every command computes them again)")):
        add_flags(sub.add_parser(name, help=text, description=text), CacheSpec)


def spec(args: argparse.Namespace) -> CacheSpec:
    action = getattr(args, "cache_command", None) or "list"
    return CacheSpec(action=action, **(values(CacheSpec, args) if hasattr(args, "kind") else {}))


def check(spec: CacheSpec) -> None:
    """The size bound must be readable (``$AF1_CACHE_LIMIT_MB``)."""
    from circuits.store import usercache

    usercache.limit_bytes()


def size_text(n: int) -> str:
    """``n`` bytes as ``12.3 MB`` (or ``kB``)."""
    return f"{n / 2**20:.1f} MB" if n >= 2**20 else f"{n / 2**10:.1f} kB"


def run(spec: CacheSpec) -> int:
    import time

    from circuits.store import usercache

    root = usercache.results_root()
    limit = usercache.limit_bytes()
    bound = "off ($AF1_CACHE_LIMIT_MB=0)" if limit == 0 else f"bound {size_text(limit)} ($AF1_CACHE_LIMIT_MB)"
    if spec.action == "clear":
        removed = usercache.clear(spec.kind)
        print(f"removed {len(removed)} cached result(s), {size_text(sum(e.size for e in removed))}, from {root}")
        return 0
    found = [e for e in usercache.entries() if spec.kind is None or e.kind == spec.kind]
    if not found:
        print(f"the cache {root} holds no {spec.kind}" if spec.kind and usercache.entries() else
              f"the cache {root} is empty ({bound})")
        return 0
    width = max(len(e.kind) for e in found)
    for e in found:
        used = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.used))
        print(f"{e.kind:<{width}}  {e.key[:12]}  {size_text(e.size):>9}  used {used}  {e.about}")
    print(f"{len(found)} cached result(s), {size_text(sum(e.size for e in found))} in {root} ({bound})")
    return 0
