"""Developer tools of the attnkit repository (not installed with the package)."""
