"""The Ray edge: RLlib training, Tune sweeps and policy loading (imports Ray; the core does not)."""
