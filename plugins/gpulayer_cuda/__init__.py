"""Bundled GPUlayer plugin: cuda (in progress)."""
