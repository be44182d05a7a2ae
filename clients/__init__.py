"""Client-side Flower NumPyClients, one file per method, on :mod:`clients.base`."""
