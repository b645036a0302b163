"""The bottom layer: the primitive op enum and its groups (:mod:`.ops`), dtypes (:mod:`.dtypes`) and
polygrad's exceptions (:mod:`.errors`, public as ``polygrad.errors``).  Imports nothing of polygrad."""
