// Watch a cdcserver with the Node.js driver and print what it sees, one canonical Extended
// JSON document per line (run by tests/server/test_server_node.py).
//
//   node watch.mjs '<canonical EJSON config>'
//
// config: {uri, db, coll?, count, pipeline?, options?, ready?, maxEmptyPolls?}
//   coll absent: a database stream (db.watch); options: the watch options (startAtOperationTime,
//   resumeAfter, startAfter, fullDocument, batchSize, maxAwaitTimeMS, ...) in EJSON.
//   ready: print {"ready": true} once the stream is open (its aggregate answered), so the
//   caller can write the events it expects to see.
// Output: the events, then {"resumeToken": ...} (the stream's token after the last event).
// Exits 2 (with a message on stderr) if `count` events do not come in maxEmptyPolls polls.
import { BSON, MongoClient } from 'mongodb';

const { EJSON } = BSON;
const config = EJSON.parse(process.argv[2], { relaxed: false });
const print = (doc) => process.stdout.write(EJSON.stringify(doc, { relaxed: false }) + '\n');

// promoteValues: false keeps Int32/Int64/Double apart, so canonical EJSON is exact.
const client = new MongoClient(config.uri, {
  promoteValues: false,
  serverSelectionTimeoutMS: 10000,
});
let status = 0;
try {
  const db = client.db(config.db);
  const target = config.coll ? db.collection(config.coll) : db;
  const stream = target.watch(config.pipeline ?? [], {
    maxAwaitTimeMS: 100,
    ...(config.options ?? {}),
  });
  const events = [];
  let empty = 0;
  const maxEmpty = config.maxEmptyPolls ?? 200;
  let first = true;
  while (events.length < config.count && empty < maxEmpty) {
    const change = await stream.tryNext();
    if (first && config.ready) {
      print({ ready: true });
    }
    first = false;
    if (change === null) {
      empty += 1;
    } else {
      events.push(change);
      print(change);
    }
  }
  if (events.length < config.count) {
    process.stderr.write(`only ${events.length} of ${config.count} events came\n`);
    status = 2;
  }
  print({ resumeToken: stream.resumeToken });
  await stream.close();
} catch (err) {
  process.stderr.write(`${err.stack ?? err}\n`);
  status = 1;
} finally {
  await client.close();
}
process.exit(status);
