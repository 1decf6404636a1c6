"""mongos: the front of the embedded cluster, split along mongos's seams (src/mongo/s/).

`routing` (where a command goes: `forward`, targeting by the chunk map, the policies of the
commands whose routing is data), `participants` (which shards a transaction reached),
`handshake`, `admin` (the sharding commands), `write_ops`, `query` (merged reads and their
cursors), `ddl`, `transactions`, `change_streams`; `commands` puts their tables together.
"""
