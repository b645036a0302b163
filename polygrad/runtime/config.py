"""User-settable policy knobs (``pg.config``).  Read at the moment an op needs them."""
from __future__ import annotations

import os
from dataclasses import dataclass, field


@dataclass
class Config:
    #: "scalar": a failing kernel is recomputed through the fallback chain; "raise": re-raise.
    fallback: str = "scalar"
    #: backends tried, in order, before scalar decomposition, per failing backend; a backend
    #: not listed here uses its own ``Backend.fallback_chain``.
    fallback_chain: dict[str, list[str]] = field(default_factory=dict)
    #: scalar decomposition of an op touching more elements than this raises BackendError instead.
    scalar_fallback_max_elements: int = 200_000
    #: density below which a dense operand is stored sparse; None = the cost model decides.
    sparse_threshold: float | None = None
    #: below this many elements dense always wins (sparse bookkeeping costs more than it saves).
    sparse_min_elements: int = 4096
    #: a dense result needing more than this fraction of available memory is refused / kept sparse.
    memory_fraction: float = 0.8
    #: shadow-run every kernel against the scalar reference and raise on disagreement.
    validate: bool = field(default_factory=lambda: os.environ.get("POLYGRAD_VALIDATE", "") not in ("", "0"))
    validate_rtol: float = 1e-5
    validate_atol: float = 1e-6

    def __setattr__(self, name: str, value) -> None:
        if name == "fallback" and value not in ("scalar", "raise"):
            raise ValueError(f"pg.config.fallback must be 'scalar' or 'raise', got {value!r}")
        if name == "memory_fraction" and not 0 < value <= 1:
            raise ValueError(f"pg.config.memory_fraction must be in (0, 1], got {value!r}")
        if name == "sparse_threshold" and value is not None and not 0 <= value <= 1:
            raise ValueError(f"pg.config.sparse_threshold must be None or in [0, 1], got {value!r}")
        super().__setattr__(name, value)


config = Config()
