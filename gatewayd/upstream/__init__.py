"""Supervised stdio tool servers: what the gateway needs of one (api.py), how each protocol is spoken
(dialects.py), the child process (process.py) and the JSON-RPC peer on its pipes (peer.py, joined in
connection.py), one server per config file (server.py), and every server's life (pool.py)."""
