"""``from polygrad.micrograd.engine import Value``: micrograd's ``engine`` module on polygrad.

The class is :class:`polygrad.Value` itself (one scalar engine in polygrad, not two), so Values
made here mix freely with polygrad's.  Mixing one with a *foreign* object that is not a number
(micrograd's own ``Value``, a tensor, a list) raises ``TypeError`` instead of nesting one engine's
node inside the other's.
"""
from __future__ import annotations

from polygrad.engine.value import Value

__all__ = ["Value"]
