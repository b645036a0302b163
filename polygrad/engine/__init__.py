"""The autodiff engine: shape/dtype inference (:mod:`.inference`), THE gradient table
(:mod:`.grad_rules`), the scalar meaning of every primitive (:mod:`.reference`, over micrograd's
:mod:`.value`, with IEEE float semantics from :mod:`.scalar_math`), the graph (:mod:`.graph`),
dispatch to backend kernels with fallback (:mod:`.dispatch`) and reverse mode (:mod:`.autodiff`).
Knows tensors only as ``graph.TensorBase``; builds on :mod:`polygrad.ir` and :mod:`polygrad.runtime`."""
