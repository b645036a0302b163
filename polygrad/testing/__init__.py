"""polygrad.testing: gradient checks, cross-backend agreement, fault injection, conformance kit.

Public API for users and third-party backend authors.
"""
from __future__ import annotations

from ..ir.ops import list_ops
from .faults import inject_fault
from .grads import assert_backends_agree, check_grads, numerical_grad

__all__ = ["assert_backends_agree", "check_grads", "inject_fault", "list_ops", "numerical_grad"]
