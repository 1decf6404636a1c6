// Strings that are not UTF-8, as the Node.js driver's utf8_validation tests meet them (run by
// tests/embedded/test_strings_not_utf8.py). Prints one canonical Extended JSON document per line.
//
//   node utf8.mjs '<canonical EJSON config>'
//
// config: {uri, db, coll}. coll already holds one document whose string `s` is not UTF-8.
// Output, in order:
//   {dupKey: {name, message, errmsg}}   a duplicate _id of 100 four-byte characters: mongod cuts
//                                       the message's key at 150 bytes, inside a character;
//   {unvalidated: [doc...]}             find with enableUtf8Validation: false;
//   {validated: {name, message}}        find with validation on (the driver's default).
import { BSON, MongoClient } from 'mongodb';

const { EJSON } = BSON;
const config = EJSON.parse(process.argv[2], { relaxed: false });
const print = (doc) => process.stdout.write(EJSON.stringify(doc, { relaxed: false }) + '\n');
const failure = (err) => ({ name: err.constructor.name, message: err.message, errmsg: err.errmsg ?? null });

const client = new MongoClient(config.uri, { serverSelectionTimeoutMS: 10000 });
try {
  const coll = client.db(config.db).collection(config.coll);
  const dup = client.db(config.db).collection(config.coll + '_dup');
  const _id = '\u{1F92A}'.repeat(100);
  await dup.insertOne({ _id });
  print({ dupKey: await dup.insertOne({ _id }).then(() => null, failure) });
  print({ unvalidated: await coll.find({}, { enableUtf8Validation: false }).toArray() });
  print({ validated: await coll.find({}).toArray().then(() => null, failure) });
} catch (err) {
  print({ error: failure(err) });
} finally {
  await client.close();
}
