// Authenticate to a cdcserver with the Node.js driver, then watch and write (run by
// tests/server/test_auth_node.py). Prints one canonical Extended JSON document per line.
//
//   node auth.mjs '<canonical EJSON config>'
//
// config: {uri, db, coll, id, options?}; options: MongoClient options (auth, tls...).
// Output: {authInfo} (connectionStatus), then the insert event the stream saw; or
// {error: {code, codeName, errmsg}} when a command fails (e.g. 18 on wrong credentials).
import { BSON, MongoClient } from 'mongodb';

const { EJSON } = BSON;
const config = EJSON.parse(process.argv[2], { relaxed: false });
const print = (doc) => process.stdout.write(EJSON.stringify(doc, { relaxed: false }) + '\n');

const client = new MongoClient(config.uri, {
  serverSelectionTimeoutMS: 10000,
  ...(config.options ?? {}),
});
try {
  const status = await client.db('admin').command({ connectionStatus: 1 });
  print({ authInfo: status.authInfo });
  const coll = client.db(config.db).collection(config.coll);
  const stream = coll.watch([], { maxAwaitTimeMS: 100 });
  await stream.tryNext(); // the aggregate: the stream is open before the write
  await coll.insertOne({ _id: config.id });
  let change = null;
  for (let i = 0; i < 200 && change === null; i++) {
    change = await stream.tryNext();
  }
  print({ event: change });
  await stream.close();
} catch (err) {
  print({ error: { code: err.code ?? null, codeName: err.codeName ?? null, errmsg: err.message } });
} finally {
  await client.close();
}
