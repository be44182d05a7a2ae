"""Server-side Flower strategies, one file per method, on :mod:`strategies.base`."""
