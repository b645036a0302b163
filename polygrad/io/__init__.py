"""Files: ``pg.save`` / ``pg.load`` checkpoints (:mod:`.checkpoint`), atomic and safe to load."""
