"""Bundled GPUlayer plugin: frameworks (in progress)."""
