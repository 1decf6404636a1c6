"""mongos: the front of the embedded cluster, split along mongos's seams (src/mongo/s/).

`routing` (where a command goes: `forward`, targeting by the chunk map, the policies of the
commands whose routing is data), `participants` (each session's transaction as the router
keeps it), `handshake`, `admin` (shards, databases, sharded collections), `chunks` (split,
moveChunk, moveRange), `zones` (and the balancer), `collection_moves`, `moves` (a data move
under its critical section), `shard_key`, `arguments` (their shared checks), `write_ops`,
`query` (merged reads and their cursors), `merge` (a sharded aggregation's merging half),
`config_reads` (config.*), `ddl`, `transactions`, `change_streams`; `commands` puts their
tables together.
"""
