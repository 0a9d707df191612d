"""Supervised stdio tool servers: one connection per child, one server per config file, the pool of all."""
