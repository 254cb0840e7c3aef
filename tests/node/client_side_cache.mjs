// node-redis 5 with its client-side cache, through saltshaker: repeated GETs are served
// from the application's own cache (none reaches a node), and a write made on the key's
// node directly reaches the cache as an invalidation. Prints one JSON line for
// tests/node_clients.rs.
//
// usage: node client_side_cache.mjs <app host:port> <node host:port>...
// The app address is the proxy, or a node itself for the same run directly. The key is
// written through the app, then found on whichever node holds it.
import { createClient, BasicClientSideCache } from 'redis';

const [app_addr, ...node_addrs] = process.argv.slice(2);
const url = (a) => `redis://${a}`;
const gets = async (nodes) => {
  let n = 0;
  for (const c of nodes) {
    const m = (await c.info('commandstats')).match(/cmdstat_get:calls=(\d+)/);
    n += m ? Number(m[1]) : 0;
  }
  return n;
};

const cache = new BasicClientSideCache({ ttl: 0, maxEntries: 0 });
const app = createClient({ url: url(app_addr), RESP: 3, clientSideCache: cache });
app.on('error', (e) => { console.error('app client error', e); });
const plain = createClient({ url: url(app_addr) });
const nodes = node_addrs.map((a) => createClient({ url: url(a) }));
const out = {};
try {
  await app.connect();
  await plain.connect();
  for (const n of nodes) await n.connect();
  const key = 'csc:{k}';
  await plain.set(key, 'v1');
  let owner = null;
  for (const n of nodes) {
    try { if (await n.exists(key)) owner = n; } catch (_) { /* a cluster node that does not serve the slot */ }
  }
  if (!owner) throw new Error('no node holds the key');
  out.first = await app.get(key);
  const before = await gets(nodes);
  for (let i = 0; i < 100; i++) await app.get(key);
  out.node_gets_for_100 = (await gets(nodes)) - before;
  out.hits = cache.stats().hitCount;
  await owner.set(key, 'v2');
  const t0 = Date.now();
  out.after_write = await app.get(key);
  while (out.after_write !== 'v2' && Date.now() - t0 < 2000) {
    await new Promise((r) => setTimeout(r, 5));
    out.after_write = await app.get(key);
  }
  out.saw_write_ms = Date.now() - t0;
  // Through a second client of the app address (another proxy's client would be the same).
  await app.get(key);
  await plain.set(key, 'v3');
  const t1 = Date.now();
  out.after_other = await app.get(key);
  while (out.after_other !== 'v3' && Date.now() - t1 < 2000) {
    await new Promise((r) => setTimeout(r, 5));
    out.after_other = await app.get(key);
  }
  out.saw_other_ms = Date.now() - t1;
  // Each of these changes the key behind the application's back; `seen` is how long
  // until the next read sees it (-1: not within 2 s).
  const until = async (want) => {
    const t = Date.now();
    while (Date.now() - t < 2000) {
      if ((await app.get(key)) === want) return Date.now() - t;
      await new Promise((r) => setTimeout(r, 5));
    }
    return -1;
  };
  const cached = async () => {
    await app.get(key);
    const before = await gets(nodes);
    await app.get(key);
    return (await gets(nodes)) === before;
  };
  // An expiry that fires on the node: counted from the end of its TTL (Redis expires a
  // key nobody reads in its active cycle, ten times a second by default).
  const ttl_end = Date.now() + 150;
  await owner.set(key, 'short', { PX: 150 });
  await until('short');
  out.cached_before_expiry = await cached();
  out.seen_expiry_ms = (await until(null)) < 0 ? -1 : Math.max(0, Date.now() - ttl_end);
  // FLUSHALL on the node.
  await owner.set(key, 'v4');
  await until('v4');
  out.cached_before_flushall = await cached();
  await owner.flushAll();
  out.seen_flushall_ms = await until(null);
  // The node drops the proxy's connection that hears its invalidations; then the key
  // changes while it reconnects.
  await owner.set(key, 'v5');
  await until('v5');
  const killed = await owner.sendCommand(['CLIENT', 'KILL', 'TYPE', 'pubsub']);
  await owner.set(key, 'v6');
  out.killed_trackers = killed;
  out.seen_after_kill_ms = await until('v6');
} catch (e) {
  out.error = String((e && e.message) || e);
}
console.log(JSON.stringify(out));
await Promise.allSettled([app.quit(), plain.quit(), ...nodes.map((n) => n.quit())]);
