"""The change-stream pipeline on Apache Spark (PySpark 4.x).

* `replay.py`: `cdcserver spark-replay`, the bulk replay of oplog archives (mongodump BSON or
  Extended JSON lines, one or several shards) to Parquet or JSON lines, event for event what
  `cdcserver replay` writes; `cli.py`: its command line (checks before Spark, root causes,
  progress), also a `spark-submit` script.
* `source.py`: a Structured Streaming source, `spark.readStream.format("cdcserver")`, reading
  change events from a cdcserver or a MongoDB deployment; its offsets are resume tokens.
* `splits.py`: how one oplog file is cut into byte ranges that tasks read on their own.
* `rows.py`: the output row of an event, shared by both.

Nothing here is imported by the server: `import cdcserver` never needs pyspark.

On a cluster, every executor needs this package and its dependencies. One way, with a packed
virtual environment (`pip install venv-pack`)::

    python -m venv env && env/bin/pip install 'cdcserver[spark]' venv-pack
    env/bin/venv-pack -o cdcserver-env.tar.gz
    PYSPARK_DRIVER_PYTHON=env/bin/python spark-submit --master yarn --deploy-mode client \\
        --driver-memory 2g --executor-memory 4g --archives cdcserver-env.tar.gz#env \\
        --conf spark.pyspark.python=./env/bin/python \\
        "$(env/bin/python -c 'import cdcserver.spark.cli as m; print(m.__file__)')" \\
        --oplog hdfs:///archive/shard0/oplog.bson --oplog hdfs:///archive/shard1/oplog.bson \\
        --out hdfs:///lake/events --cluster

(`spark-submit` runs `cli.py` as a script with the driver's Python, which needs cdcserver
too; it takes the arguments of `cdcserver spark-replay`. Locally, `cdcserver spark-replay
--master local[*] ...` is the same without spark-submit. Paths other than local files are
opened with pyarrow's filesystems: `file://`, `hdfs://`, `s3://`, `gs://`, `abfs://`.)
"""
