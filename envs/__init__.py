"""Gymnasium environments around the speculative decoder (live, trace replay, synthetic)."""
