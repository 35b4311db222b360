"""Bundled GPUlayer plugin: rocm (in progress)."""
