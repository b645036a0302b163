"""The applications on top of everything: the ``polygrad`` command (:mod:`.cli`), its demos
(:mod:`.demos`, :mod:`.gnn_demos`) and the small training loop they share (:mod:`.train`)."""
