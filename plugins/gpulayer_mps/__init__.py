"""Bundled GPUlayer plugin: mps (in progress)."""
