"""Where embedding rows live while serving: the parameter server's tiers and their live updates.

    tiers.py             the contract of the lower tiers (`Store`), key and row encoding
    cache.py             tier 1: RowCache, bounded hot rows (GPU when present)
    memory_store.py      tier 2 in process: MemoryStore
    redis_store.py       tier 2 shared by replicas: RedisStore
    persistent.py        tier 3: PersistentStore (RocksDB), survives restarts
    parameter_server.py  ParameterServer: one lookup over the tiers, atomic updates, snapshots
    updates.py           live updates: directory and Redis-stream sources, UpdateWatcher
    owned_dirs.py        state folders owned by a live process, cleaned up after a dead one

The lowest serving wing: it imports no other wing.
"""
