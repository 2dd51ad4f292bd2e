"""The Stable Diffusion benchmark harness behind `attnkit bench`."""
