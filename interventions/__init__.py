"""Intervention primitives that change a TransformerLens forward pass."""
