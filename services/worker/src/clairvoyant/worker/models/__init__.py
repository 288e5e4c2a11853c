"""Model definitions (torch) for the torch runner."""
