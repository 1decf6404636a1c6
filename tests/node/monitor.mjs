// Keep a Node.js driver client connected to a cdcserver for a while and report what its
// server monitor saw (run by tests/server/test_streaming_hello_node.py).
//
//   node monitor.mjs '<JSON config>'
//
// config: {uri, seconds}
// The client monitors as every Node.js application does (serverMonitoringMode "auto": the
// streaming hello, `hello {topologyVersion, maxAwaitTimeMS: heartbeatFrequencyMS}` with
// exhaustAllowed, replies expected with moreToCome) and pings once a second meanwhile.
// Output, one JSON line: {heartbeatsFailed: [...], poolsCleared: [...], awaitedSucceeded,
// pings, errors: [...]}.
import { MongoClient } from 'mongodb';

const config = JSON.parse(process.argv[2]);
const started = Date.now();
const at = () => (Date.now() - started) / 1000;
const report = {
  heartbeatsFailed: [],
  poolsCleared: [],
  awaitedSucceeded: 0,
  pings: 0,
  errors: [],
};

const client = new MongoClient(config.uri, { serverSelectionTimeoutMS: 10000 });
client.on('serverHeartbeatFailed', (event) => {
  report.heartbeatsFailed.push({ at: at(), connectionId: event.connectionId,
                                 awaited: event.awaited, failure: String(event.failure) });
});
client.on('serverHeartbeatSucceeded', (event) => {
  if (event.awaited) {
    report.awaitedSucceeded += 1;
  }
});
client.on('connectionPoolCleared', (event) => {
  report.poolsCleared.push({ at: at(), address: event.address });
});
try {
  await client.connect();
  while (at() < config.seconds) {
    try {
      await client.db('admin').command({ ping: 1 });
      report.pings += 1;
    } catch (err) {
      report.errors.push({ at: at(), error: String(err) });
    }
    await new Promise((resolve) => setTimeout(resolve, 1000));
  }
} catch (err) {
  report.errors.push({ at: at(), error: String(err) });
} finally {
  await client.close();
}
process.stdout.write(JSON.stringify(report) + '\n');
