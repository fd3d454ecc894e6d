"""RLlib policies (RLModules) and their feature encoders."""
