"""Request and response models, one module per resource. Never the tables."""
