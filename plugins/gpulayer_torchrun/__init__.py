"""Bundled GPUlayer plugin: torchrun (in progress)."""
