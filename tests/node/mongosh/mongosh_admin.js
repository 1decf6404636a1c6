// Run by tests/server/test_server_node.py with mongosh (npm `mongosh`, pinned in package-lock.json here):
// the shell helpers an operator types first, printed as one canonical Extended JSON line each.
const out = (name, value) =>
  print(EJSON.stringify({ [name]: value }, { relaxed: false }));
out("rsStatus", rs.status());
out("serverStatus", db.serverStatus());
out("cmdLineOpts", db.adminCommand({ getCmdLineOpts: 1 }));
out("hello", db.hello());
