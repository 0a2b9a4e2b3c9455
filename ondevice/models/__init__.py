"""Models by name: the registry (models.toml) and the default model assembled from its packages."""
