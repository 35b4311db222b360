"""Bundled GPUlayer plugin: profiles (in progress)."""
