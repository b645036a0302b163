"""polygrad's built-in backends, installed as ``polygrad.backends``.

They register through the entry-point group ``polygrad`` exactly like a third-party backend, and
import only polygrad's public contract (Backend, hookimpl, Op, errors).
"""
