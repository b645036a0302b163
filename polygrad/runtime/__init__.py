"""The plugin runtime: the Backend contract (:mod:`.backend`), the pluggy hook specs
(:mod:`.hookspecs`), the registry that discovers and selects backends (:mod:`.registry`), isolated
event hooks (:mod:`.events`), user policy (:mod:`.config`), the memory budget (:mod:`.memory`), the
host array pool (:mod:`.pool`), thread control (:mod:`.threads`), shared-storage tracking
(:mod:`.sharing`) and the built-in monitor (:mod:`.monitor`).  Builds on :mod:`polygrad.ir` only."""
